"""fseb_ft: function-space empirical Bayes fine-tuning for timm vision models."""

"""The runs layer: the run folder and its files, written atomically; loading a run or model for
prediction; results, figures, the model card and the exported model folder. Imports only the
layers below it (evaluation, method, data, recipe)."""

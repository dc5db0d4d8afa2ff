"""The evaluation layer: metrics, OOD scores, temperature scaling, WiSE-FT, abstention thresholds
and the predictions they are computed from. Imports only the method, data and recipe layers.

Its public names, those the other folders and the commands import, are ``__all__``; each is
imported from its module on first use (PEP 562), so importing one module of the folder loads no
other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fseb_ft.lazy import lazy_attributes

if TYPE_CHECKING:  # the names' types, for type checkers: the same names as _LAZY's
    from fseb_ft.evaluation.abstention import AbstentionRule as AbstentionRule
    from fseb_ft.evaluation.abstention import Certificate as Certificate
    from fseb_ft.evaluation.abstention import ValidationOutcome as ValidationOutcome
    from fseb_ft.evaluation.abstention import certified_rule as certified_rule
    from fseb_ft.evaluation.abstention import given_rule as given_rule
    from fseb_ft.evaluation.abstention import no_rule as no_rule
    from fseb_ft.evaluation.abstention import out_of_range as out_of_range
    from fseb_ft.evaluation.abstention import rule_for_target as rule_for_target
    from fseb_ft.evaluation.bootstrap import Bootstrap as Bootstrap
    from fseb_ft.evaluation.bootstrap import difference_intervals as difference_intervals
    from fseb_ft.evaluation.bootstrap import prediction_intervals as prediction_intervals
    from fseb_ft.evaluation.bootstrap import same_images as same_images
    from fseb_ft.evaluation.conformal import CONFORMAL_METHODS as CONFORMAL_METHODS
    from fseb_ft.evaluation.conformal import COVERAGE_KEY as COVERAGE_KEY
    from fseb_ft.evaluation.conformal import SET_SIZE_KEY as SET_SIZE_KEY
    from fseb_ft.evaluation.conformal import ConformalCalibration as ConformalCalibration
    from fseb_ft.evaluation.conformal import ConformalTarget as ConformalTarget
    from fseb_ft.evaluation.conformal import calibrate as calibrate
    from fseb_ft.evaluation.conformal import conformal_coverage as conformal_coverage
    from fseb_ft.evaluation.conformal import prediction_sets as prediction_sets
    from fseb_ft.evaluation.feature_ood import FeatureOodFit as FeatureOodFit
    from fseb_ft.evaluation.feature_ood import feature_ood_score as feature_ood_score
    from fseb_ft.evaluation.feature_ood import fit_from_tensors as fit_from_tensors
    from fseb_ft.evaluation.feature_ood import fit_scores as fit_scores
    from fseb_ft.evaluation.feature_ood import fit_tensors as fit_tensors
    from fseb_ft.evaluation.feature_ood import vim_score as vim_score
    from fseb_ft.evaluation.features import laplace_classifier as laplace_classifier
    from fseb_ft.evaluation.groups import Groups as Groups
    from fseb_ft.evaluation.groups import group_metrics as group_metrics
    from fseb_ft.evaluation.groups import reported_groups as reported_groups
    from fseb_ft.evaluation.label_shift import LabelShift as LabelShift
    from fseb_ft.evaluation.label_shift import atc_estimate as atc_estimate
    from fseb_ft.evaluation.label_shift import atc_threshold as atc_threshold
    from fseb_ft.evaluation.label_shift import bbse as bbse
    from fseb_ft.evaluation.label_shift import reweight as reweight
    from fseb_ft.evaluation.laplace import laplace_torch as laplace_torch
    from fseb_ft.evaluation.metrics import METRIC_REGISTRY as METRIC_REGISTRY
    from fseb_ft.evaluation.metrics import Metric as Metric
    from fseb_ft.evaluation.metrics import chance_accuracy as chance_accuracy
    from fseb_ft.evaluation.metrics import chance_nll as chance_nll
    from fseb_ft.evaluation.metrics import classification_metrics as classification_metrics
    from fseb_ft.evaluation.metrics import ensemble_log_probs as ensemble_log_probs
    from fseb_ft.evaluation.metrics import higher_is_better as higher_is_better
    from fseb_ft.evaluation.metrics import ood_detection as ood_detection
    from fseb_ft.evaluation.metrics import predictive_entropy as predictive_entropy
    from fseb_ft.evaluation.ood import OOD_SCORE_REGISTRY as OOD_SCORE_REGISTRY
    from fseb_ft.evaluation.ood import energy_score as energy_score
    from fseb_ft.evaluation.ood import entropy_score as entropy_score
    from fseb_ft.evaluation.ood import ood_metrics as ood_metrics
    from fseb_ft.evaluation.ood import ood_score as ood_score
    from fseb_ft.evaluation.predictions import Predictions as Predictions
    from fseb_ft.evaluation.predictions import eval_loader as eval_loader
    from fseb_ft.evaluation.predictions import predict_logits as predict_logits
    from fseb_ft.evaluation.predictions import predict_splits as predict_splits
    from fseb_ft.evaluation.selective import top_class_log_odds as top_class_log_odds
    from fseb_ft.evaluation.temperature import fit_temperature as fit_temperature
    from fseb_ft.evaluation.temperature import temperature_identified as temperature_identified
    from fseb_ft.evaluation.temperature import temperature_warnings as temperature_warnings
    from fseb_ft.evaluation.two_sample import bonferroni as bonferroni
    from fseb_ft.evaluation.two_sample import class_proportion_test as class_proportion_test
    from fseb_ft.evaluation.two_sample import mmd_test as mmd_test
    from fseb_ft.evaluation.two_sample import rate_test as rate_test
    from fseb_ft.evaluation.wise import with_wise as with_wise

_LAZY = {
    "AbstentionRule": "fseb_ft.evaluation.abstention",
    "Certificate": "fseb_ft.evaluation.abstention",
    "ValidationOutcome": "fseb_ft.evaluation.abstention",
    "certified_rule": "fseb_ft.evaluation.abstention",
    "given_rule": "fseb_ft.evaluation.abstention",
    "no_rule": "fseb_ft.evaluation.abstention",
    "out_of_range": "fseb_ft.evaluation.abstention",
    "rule_for_target": "fseb_ft.evaluation.abstention",
    "Bootstrap": "fseb_ft.evaluation.bootstrap",
    "difference_intervals": "fseb_ft.evaluation.bootstrap",
    "prediction_intervals": "fseb_ft.evaluation.bootstrap",
    "same_images": "fseb_ft.evaluation.bootstrap",
    "CONFORMAL_METHODS": "fseb_ft.evaluation.conformal",
    "COVERAGE_KEY": "fseb_ft.evaluation.conformal",
    "ConformalCalibration": "fseb_ft.evaluation.conformal",
    "ConformalTarget": "fseb_ft.evaluation.conformal",
    "SET_SIZE_KEY": "fseb_ft.evaluation.conformal",
    "calibrate": "fseb_ft.evaluation.conformal",
    "conformal_coverage": "fseb_ft.evaluation.conformal",
    "prediction_sets": "fseb_ft.evaluation.conformal",
    "FeatureOodFit": "fseb_ft.evaluation.feature_ood",
    "feature_ood_score": "fseb_ft.evaluation.feature_ood",
    "fit_from_tensors": "fseb_ft.evaluation.feature_ood",
    "fit_scores": "fseb_ft.evaluation.feature_ood",
    "vim_score": "fseb_ft.evaluation.feature_ood",
    "fit_tensors": "fseb_ft.evaluation.feature_ood",
    "laplace_classifier": "fseb_ft.evaluation.features",
    "Groups": "fseb_ft.evaluation.groups",
    "group_metrics": "fseb_ft.evaluation.groups",
    "reported_groups": "fseb_ft.evaluation.groups",
    "LabelShift": "fseb_ft.evaluation.label_shift",
    "atc_estimate": "fseb_ft.evaluation.label_shift",
    "atc_threshold": "fseb_ft.evaluation.label_shift",
    "bbse": "fseb_ft.evaluation.label_shift",
    "reweight": "fseb_ft.evaluation.label_shift",
    "laplace_torch": "fseb_ft.evaluation.laplace",
    "METRIC_REGISTRY": "fseb_ft.evaluation.metrics",
    "Metric": "fseb_ft.evaluation.metrics",
    "chance_accuracy": "fseb_ft.evaluation.metrics",
    "chance_nll": "fseb_ft.evaluation.metrics",
    "classification_metrics": "fseb_ft.evaluation.metrics",
    "ensemble_log_probs": "fseb_ft.evaluation.metrics",
    "higher_is_better": "fseb_ft.evaluation.metrics",
    "ood_detection": "fseb_ft.evaluation.metrics",
    "predictive_entropy": "fseb_ft.evaluation.metrics",
    "OOD_SCORE_REGISTRY": "fseb_ft.evaluation.ood",
    "energy_score": "fseb_ft.evaluation.ood",
    "entropy_score": "fseb_ft.evaluation.ood",
    "ood_metrics": "fseb_ft.evaluation.ood",
    "ood_score": "fseb_ft.evaluation.ood",
    "Predictions": "fseb_ft.evaluation.predictions",
    "eval_loader": "fseb_ft.evaluation.predictions",
    "predict_logits": "fseb_ft.evaluation.predictions",
    "predict_splits": "fseb_ft.evaluation.predictions",
    "top_class_log_odds": "fseb_ft.evaluation.selective",
    "fit_temperature": "fseb_ft.evaluation.temperature",
    "temperature_identified": "fseb_ft.evaluation.temperature",
    "temperature_warnings": "fseb_ft.evaluation.temperature",
    "bonferroni": "fseb_ft.evaluation.two_sample",
    "class_proportion_test": "fseb_ft.evaluation.two_sample",
    "mmd_test": "fseb_ft.evaluation.two_sample",
    "rate_test": "fseb_ft.evaluation.two_sample",
    "with_wise": "fseb_ft.evaluation.wise",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)

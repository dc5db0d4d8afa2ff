"""The recipe layer: frozen, validated dataclasses for every section, loaded from YAML.

``from fseb_ft.recipe import Recipe, load_recipe`` is the public face; the sections live in
:mod:`~fseb_ft.recipe.sections` (model, fseb and the whole recipe),
:mod:`~fseb_ft.recipe.datasets` (data, context), :mod:`~fseb_ft.recipe.training` (optim, train),
:mod:`~fseb_ft.recipe.reporting` (eval, output) and :mod:`~fseb_ft.recipe.sweep`, loading and the
reference in :mod:`~fseb_ft.recipe.load`, the option lists in :mod:`~fseb_ft.recipe.options` and
the YAML-to-dataclass machinery in :mod:`~fseb_ft.recipe.schema`. Nothing here imports another
fseb_ft folder.
"""

from fseb_ft.recipe.datasets import (
    ContextConfig,
    DataConfig,
    DatasetSpec,
    ImageCacheConfig,
    MixupConfig,
)
from fseb_ft.recipe.load import (
    apply_overrides,
    dump_recipe,
    load_recipe,
    read_recipe_file,
    recipe_from_dict,
    reference_markdown,
)
from fseb_ft.recipe.reporting import EvalConfig, OutputConfig
from fseb_ft.recipe.schema import ConfigError, parent_section, plain_tree
from fseb_ft.recipe.sections import (
    VAL_OOD_METRIC_SUFFIX,
    FSEBConfig,
    ModelConfig,
    Recipe,
    val_ood_metric,
    validation_metrics,
)
from fseb_ft.recipe.sweep import SweepConfig, SweepParam, override_path
from fseb_ft.recipe.training import OptimConfig, TrainConfig

__all__ = [
    "VAL_OOD_METRIC_SUFFIX",
    "ConfigError",
    "ContextConfig",
    "DataConfig",
    "DatasetSpec",
    "EvalConfig",
    "FSEBConfig",
    "ImageCacheConfig",
    "MixupConfig",
    "ModelConfig",
    "OptimConfig",
    "OutputConfig",
    "Recipe",
    "SweepConfig",
    "SweepParam",
    "TrainConfig",
    "apply_overrides",
    "dump_recipe",
    "load_recipe",
    "override_path",
    "parent_section",
    "plain_tree",
    "read_recipe_file",
    "recipe_from_dict",
    "reference_markdown",
    "val_ood_metric",
    "validation_metrics",
]

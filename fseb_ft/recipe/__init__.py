"""The recipe layer: frozen, validated dataclasses for every section, loaded from YAML.

``from fseb_ft.recipe import Recipe, load_recipe`` is the public face; the sections live in
:mod:`~fseb_ft.recipe.sections` (model, fseb and the whole recipe),
:mod:`~fseb_ft.recipe.datasets` (data, context), :mod:`~fseb_ft.recipe.training` (optim, train),
:mod:`~fseb_ft.recipe.reporting` (eval, output) and :mod:`~fseb_ft.recipe.sweep`, loading and the
reference in :mod:`~fseb_ft.recipe.load`, YAML text in :mod:`~fseb_ft.recipe.yaml_text`, the
option lists in :mod:`~fseb_ft.recipe.options` and the YAML-to-dataclass machinery in
:mod:`~fseb_ft.recipe.schema`. Nothing here imports another fseb_ft folder. ``__all__`` holds
every name the other folders and the commands import from this one (a test checks).
"""

from fseb_ft.recipe.datasets import (
    IN_MEMORY,
    ContextConfig,
    DataConfig,
    DatasetSpec,
    ImageCacheConfig,
    MixupConfig,
    check_cache_size,
    is_data_path_override,
)
from fseb_ft.recipe.load import (
    apply_overrides,
    dump_recipe,
    load_recipe,
    read_recipe_file,
    recipe_from_dict,
    recipe_tree,
    reference_markdown,
)
from fseb_ft.recipe.options import (
    ALL_CORRUPTIONS,
    BENCHMARK_CORRUPTIONS,
    BINARY_TASK_METRICS,
    CONFORMAL_METHODS,
    CONTEXT_KINDS,
    FEATURE_OOD_SCORES,
    METHOD_SUMMARIES,
    OOD_SCORES,
    OUTPUT_OOD_SCORES,
    SOLVERS,
    ContextKind,
    Method,
)
from fseb_ft.recipe.reporting import EvalConfig, OutputConfig, resolve_corruptions
from fseb_ft.recipe.schema import ConfigError, build, parent_section, plain_tree, set_key
from fseb_ft.recipe.sections import (
    VAL_OOD_METRIC_SUFFIX,
    FeatureConfig,
    FSEBConfig,
    FSVIConfig,
    ModelConfig,
    Recipe,
    val_ood_metric,
    validation_metrics,
)
from fseb_ft.recipe.sweep import SweepConfig, SweepParam, override_path
from fseb_ft.recipe.training import OptimConfig, TrainConfig
from fseb_ft.recipe.yaml_text import YAMLError, dump_yaml, load_yaml

__all__ = [
    "ALL_CORRUPTIONS",
    "BENCHMARK_CORRUPTIONS",
    "BINARY_TASK_METRICS",
    "CONFORMAL_METHODS",
    "CONTEXT_KINDS",
    "FEATURE_OOD_SCORES",
    "IN_MEMORY",
    "METHOD_SUMMARIES",
    "OOD_SCORES",
    "OUTPUT_OOD_SCORES",
    "SOLVERS",
    "VAL_OOD_METRIC_SUFFIX",
    "ConfigError",
    "ContextConfig",
    "ContextKind",
    "DataConfig",
    "DatasetSpec",
    "EvalConfig",
    "FSEBConfig",
    "FSVIConfig",
    "FeatureConfig",
    "ImageCacheConfig",
    "Method",
    "MixupConfig",
    "ModelConfig",
    "OptimConfig",
    "OutputConfig",
    "Recipe",
    "SweepConfig",
    "SweepParam",
    "TrainConfig",
    "YAMLError",
    "apply_overrides",
    "build",
    "check_cache_size",
    "dump_recipe",
    "dump_yaml",
    "is_data_path_override",
    "load_recipe",
    "load_yaml",
    "override_path",
    "parent_section",
    "plain_tree",
    "read_recipe_file",
    "recipe_from_dict",
    "recipe_tree",
    "reference_markdown",
    "resolve_corruptions",
    "set_key",
    "val_ood_metric",
    "validation_metrics",
]

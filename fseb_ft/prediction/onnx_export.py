"""A model as one ONNX file that abstains by itself (``fseb-ft export RUN --onnx model.onnx``).

The graph (:class:`~fseb_ft.prediction.onnx_graph.DeployedModel`) takes images ``(N, C, H, W)``,
float32, prepared as the file's metadata says (its ``input``), with a dynamic batch axis, and
gives the temperature-scaled probabilities, the predicted class, the abstain flag and the OOD
scores that have a closed form. The abstention rule is chosen as ``fseb-ft predict`` chooses it
(:func:`~fseb_ft.prediction.thresholds.choose_rule`): the model's kept rule, or one for
``--coverage`` / ``--max-risk`` on the run's validation split, or ``--threshold`` given;
a model that keeps none and is given none stops (a graph that never abstains is
``--threshold 0``). An FS-VI run is exported as its mean network, and says so.

The exporter is ``torch.onnx.export`` with ``dynamo=True`` (``torch.export``, then onnxscript's
translation), which needs the optional extra ``onnx`` (:data:`ONNX_PACKAGES`). The file is
checked with onnxruntime on random images (a batch size other than the traced one) before it
is written, atomically; its ``metadata_props`` hold the class names, the temperature, the
rule, the input's preparation and the outputs' definitions (:func:`graph_metadata`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fseb_ft.errors import FsebError
from fseb_ft.evaluation.abstention import AbstentionRule, out_of_range
from fseb_ft.evaluation.feature_ood import FeatureOodFit
from fseb_ft.prediction.feature_fit import load_feature_fit
from fseb_ft.prediction.loading import LoadedModel, load_model
from fseb_ft.prediction.onnx_graph import DeployedModel, output_definitions
from fseb_ft.prediction.requests import RuleRequest
from fseb_ft.prediction.thresholds import choose_rule
from fseb_ft.prediction.validation import os_reason, validation_fetch
from fseb_ft.recipe import ConfigError
from fseb_ft.runs.atomic import write_bytes
from fseb_ft.runs.published import scrub
from fseb_ft.runs.rundir import check_output_dir

if TYPE_CHECKING:
    import onnx

__all__ = [
    "INPUT_NAME",
    "ONNX_PACKAGES",
    "OPSETS",
    "PREPROCESSING",
    "ExportedGraph",
    "OnnxExport",
    "export_onnx",
    "graph_metadata",
    "require_onnx",
]

logger = logging.getLogger(__name__)

ONNX_PACKAGES = ("onnx", "onnxruntime", "onnxscript")
"""What exporting needs beyond fseb_ft's own dependencies: the optional extra ``onnx``."""
OPSETS = range(18, 24)
"""The ONNX opsets ``--opset`` takes: torch's exporter implements 18 and above (it converts to a
lower one only approximately), and writes up to 23."""
INPUT_NAME = "images"
"""The graph's one input."""
PREPROCESSING = (
    "resize the whole image to (height, width) with PIL's bilinear resize (Image.BILINEAR, "
    "no crop), scale the pixels to [0, 1] (divide by 255), subtract mean and divide by std per "
    "channel, channels first: timm's evaluation transform, as fseb-ft predict prepares images"
)
"""How an image becomes the graph's input (the metadata's ``input.preprocessing``)."""
MAX_PROBABILITY_GAP = 1e-4
"""The largest difference of a probability between onnxruntime and torch that the check after
export accepts."""


@dataclasses.dataclass(frozen=True)
class OnnxExport:
    """What ``fseb-ft export`` is asked to do, checked at construction."""

    model: str
    """A run folder, a model folder or ``hf-hub:owner/name``."""
    onnx: Path
    """The ONNX file to write (replaced if it exists)."""
    coverage: float | None = None
    """Choose ``τ`` on the run's validation split to accept this fraction, in (0, 1]."""
    max_risk: float | None = None
    """Choose ``τ`` there for at most this error rate among accepted images, in [0, 1)."""
    threshold: float | None = None
    """``τ`` itself, in [0, 1] (0: the graph never abstains)."""
    opset: int | None = None
    """The ONNX opset, in :data:`OPSETS`; ``None``: torch's default."""
    batch_size: int = 64
    """Images per batch when the run's validation logits must be computed."""
    progress: bool = True
    """Show the progress bar of that pass."""
    verbose: bool = False
    """Let the exporter's own lines and warnings through."""

    def __post_init__(self) -> None:
        given = {"coverage": self.coverage, "max_risk": self.max_risk,
                 "threshold": self.threshold}  # fmt: skip
        if sum(value is not None for value in given.values()) > 1:
            raise ValueError("give at most one of coverage, max_risk and threshold")
        for name, value in given.items():
            if value is not None and (problem := out_of_range(name, value)) is not None:
                raise ValueError(f"{name} {problem}")
        if self.opset is not None and self.opset not in OPSETS:
            raise ValueError(
                f"opset must be in {OPSETS.start}..{OPSETS.stop - 1} (torch's exporter writes "
                f"those), got {self.opset}"
            )
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")


@dataclasses.dataclass(frozen=True)
class ExportedGraph:
    """What :func:`export_onnx` wrote."""

    path: Path
    """The ONNX file."""
    rule: AbstentionRule
    """The abstention rule inside the graph."""
    outputs: list[str]
    """The graph's outputs, in order."""
    metadata: dict[str, str]
    """The file's ``metadata_props``."""
    max_probability_gap: float
    """The largest |Δp| between onnxruntime and torch in the check after export."""
    mean_network: bool
    """Whether the graph holds the mean network of a run that predicts with a posterior's
    Monte-Carlo predictive (FS-VI)."""


def export_onnx(request: OnnxExport) -> ExportedGraph:
    """Write ``request.model`` as one ONNX graph that abstains by itself (module docstring).

    Raises:
        FsebError: the extra is missing, the file cannot be written, the model keeps no
            abstention rule and none is asked for, or the exporter cannot trace the model.
    """
    require_onnx()
    check_onnx_path(request.onnx)
    loaded = load_model(request.model)
    rule = export_rule(loaded, request)
    mean_network = loaded.network is not None
    if mean_network:
        logger.info(
            "%s predicts with the Monte-Carlo predictive of its posterior: the ONNX graph holds "
            "its mean network (the weights' means), deterministic", loaded.where
        )  # fmt: skip
    graph = DeployedModel(loaded.network or loaded.model, loaded.temperature,
                          rule.log_odds_threshold, _feature_fit(loaded))  # fmt: skip
    model = _trace(graph, loaded, request)
    metadata = graph_metadata(loaded, rule, graph.output_names, mean_network)
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=value)
    gap = _checked(model, graph, loaded)
    _write(request.onnx, model)
    return ExportedGraph(request.onnx, rule, graph.output_names, metadata, gap, mean_network)


def require_onnx() -> None:
    """Import :data:`ONNX_PACKAGES`, or stop with the command that installs them.

    Raises:
        FsebError: one of them is missing (or broken).
    """
    missing = []
    for name in ONNX_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise FsebError(
            f"exporting to ONNX needs {', '.join(missing)} (the optional extra onnx): "
            "pip install 'fseb_ft[onnx]'"
        )


def check_onnx_path(path: Path) -> None:
    """Refuse an ``--onnx`` path that is a folder, or whose folder cannot be written to, before
    anything loads.

    Raises:
        ConfigError: naming ``--onnx`` and why.
    """
    if path.is_dir():
        raise ConfigError(f"--onnx {path} is a folder: give the file to write (model.onnx)")
    check_output_dir(path.parent, f"--onnx {path}: its folder")


def export_rule(loaded: LoadedModel, request: OnnxExport) -> AbstentionRule:
    """The rule the graph abstains by: ``fseb-ft predict``'s for the same options, except that
    a model with no rule kept for its temperature, and none asked for, stops.

    Raises:
        FsebError: no rule kept or asked for (saying what to pass), or one that needs a run's
            validation split for a model without one.
    """
    temperature = loaded.temperature
    asked = (request.coverage, request.max_risk, request.threshold) != (None, None, None)
    kept = loaded.kept
    if not asked and (kept is None or kept.temperature != temperature):
        raise FsebError(_no_rule(loaded))
    if loaded.run_dir is None and request.threshold is None and asked:
        option = "--coverage" if request.coverage is not None else "--max-risk"
        raise FsebError(
            f"{option} chooses the threshold on a run's validation split, and {loaded.where} has "
            "none: export the run folder, or give --threshold T"
        )
    loader_kw = {"batch_size": request.batch_size, "num_workers": 0, "progress": request.progress}
    validation = validation_fetch(loaded, torch.device("cpu"), loader_kw)
    rule = RuleRequest(
        coverage=request.coverage, max_risk=request.max_risk, threshold=request.threshold
    )
    return choose_rule(loaded, temperature, rule, validation)


def _no_rule(loaded: LoadedModel) -> str:
    """Why ``loaded`` has no rule to export, and what to pass."""
    kept = loaded.kept
    why = "keeps no abstention threshold"
    if kept is not None:
        why = (f"keeps an abstention threshold for temperature {kept.temperature}, not for its "
               f"own ({loaded.temperature})")  # fmt: skip
    if loaded.run_dir is None:
        return (
            f"{loaded.where} {why}, and the graph abstains: pass --threshold T (0: never "
            "abstain), or export its run folder with --coverage C or --max-risk R"
        )
    return (
        f"{loaded.where} {why}, and the graph abstains: pass --coverage C or --max-risk R (chosen "
        "on the run's validation split, as fseb-ft predict chooses them), --threshold T "
        "(0: never abstain), or keep one first with `fseb-ft predict RUN IMAGES --coverage C "
        "--keep`"
    )


def _feature_fit(loaded: LoadedModel) -> FeatureOodFit | None:
    """The feature OOD scores' fit the model keeps (checked against its weights), if any."""
    if loaded.feature_fit_file() is None:
        return None
    return load_feature_fit(loaded, "mahalanobis")


def _trace(graph: DeployedModel, loaded: LoadedModel, request: OnnxExport) -> onnx.ModelProto:
    """``graph`` exported by ``torch.onnx.export`` (dynamo) with a dynamic batch axis.

    Raises:
        FsebError: the exporter cannot trace it (naming the model and the exporter's reason).
    """
    height, width = loaded.spec.size
    example = torch.zeros(2, loaded.channels, height, width)  # 2: a batch of 1 specialises
    batch = torch.export.Dim("batch")
    with _exporter_output(request.verbose):
        try:
            program = torch.onnx.export(
                graph, (example,), dynamo=True, input_names=[INPUT_NAME],
                output_names=graph.output_names, dynamic_shapes={INPUT_NAME: {0: batch}},
                opset_version=request.opset, verbose=request.verbose,
            )  # fmt: skip
        except torch.onnx.OnnxExporterError as err:
            raise FsebError(
                f"cannot export {loaded.where} to ONNX: torch.onnx cannot trace its network "
                f"({type(graph.network).__name__}): {_exporter_reason(err)}; -v shows the "
                "exporter's report"
            ) from err
    if program is None:  # the dynamo exporter always returns its program
        raise FsebError(f"cannot export {loaded.where} to ONNX: torch.onnx returned nothing")
    return program.model_proto


@contextlib.contextmanager
def _exporter_output(verbose: bool) -> Iterator[None]:
    """Without ``verbose``, the exporter's progress lines, warnings and graph dumps hidden: a
    failure becomes one error line, and a success the command's own lines."""
    if verbose:
        yield
        return
    loggers = [logging.getLogger(name) for name in ("torch", "onnxscript", "onnx_ir")]
    levels = [found.level for found in loggers]
    for found in loggers:
        found.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):  # fmt: skip
            warnings.simplefilter("ignore")
            yield
    finally:
        for found, level in zip(loggers, levels, strict=True):
            found.setLevel(level)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _exporter_reason(err: Exception) -> str:
    """The exporter's reason for ``err``: the first line of its "Exception summary" (the
    underlying error), else the error's first line, without terminal colours."""
    text = _ANSI.sub("", str(err))
    summary = text.partition("## Exception summary")[2].strip() or text.strip()
    return summary.splitlines()[0] if summary else type(err).__name__


def graph_metadata(
    loaded: LoadedModel, rule: AbstentionRule, outputs: list[str], mean_network: bool
) -> dict[str, str]:
    """The file's ``metadata_props``, each value a JSON text."""
    from fseb_ft import __version__

    height, width = loaded.spec.size
    network = "the network the model predicts with"
    if mean_network:
        network = (
            "the mean network of the run's posterior (FS-VI's q(θ)): the run predicts with its "
            "Monte-Carlo predictive, the graph with the weights' means"
        )
    spec = {
        "name": INPUT_NAME, "layout": "NCHW", "dtype": "float32",
        "channels": loaded.channels, "height": height, "width": width,
        "mean": list(loaded.spec.mean), "std": list(loaded.spec.std),
        "preprocessing": PREPROCESSING,
    }  # fmt: skip
    return {
        "fseb_ft_version": json.dumps(__version__),
        "model": json.dumps(scrub(loaded.where), ensure_ascii=False),
        "network": json.dumps(network, ensure_ascii=False),
        "class_names": json.dumps(loaded.class_names, ensure_ascii=False),
        "temperature": json.dumps(loaded.temperature),
        "abstention": json.dumps(rule.to_json()),
        "input": json.dumps(spec),
        "outputs": json.dumps(output_definitions(outputs)),
    }


def _checked(model: onnx.ModelProto, graph: DeployedModel, loaded: LoadedModel) -> float:
    """The largest |Δp| of onnxruntime's probabilities against ``graph``'s on 3 random images (a
    batch size other than the traced one).

    Raises:
        FsebError: above :data:`MAX_PROBABILITY_GAP`.
    """
    import onnxruntime

    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    height, width = loaded.spec.size
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(3, loaded.channels, height, width, generator=generator)
    found = session.run(["probabilities"], {INPUT_NAME: images.numpy()})[0]
    with torch.no_grad():
        expected = graph(images)[0].numpy()
    gap = float(np.abs(np.asarray(found) - expected).max())
    if not gap <= MAX_PROBABILITY_GAP:
        raise FsebError(
            f"the ONNX graph of {loaded.where} does not compute what the model does: its "
            f"probabilities differ by up to {gap:.3g} under onnxruntime (at most "
            f"{MAX_PROBABILITY_GAP:g} is accepted); nothing was written"
        )
    return gap


def _write(path: Path, model: onnx.ModelProto) -> None:
    """Write ``model`` to ``path`` atomically, in one file (its weights inside).

    Raises:
        FsebError: the file cannot be written (naming it and why).
    """
    try:
        write_bytes(path, model.SerializeToString(), f"the ONNX file {path.name}")
    except OSError as err:
        if isinstance(err, FsebError):  # a full disk: already one line naming the folder
            raise
        raise FsebError(
            f"--onnx {path} cannot be written ({os_reason(err)}): give a path you can write to"
        ) from err

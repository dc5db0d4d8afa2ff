"""``fseb-ft export``: a model as one ONNX file that abstains by itself.

    fseb-ft export MODEL --onnx model.onnx [--coverage C | --max-risk R | --threshold T]
                   [--opset N]
    fseb-ft export runs/quickstart/fseb --onnx model.onnx --coverage 0.9

MODEL is a run folder, a model folder in timm's Hub format or ``hf-hub:owner/name``, as for
``fseb-ft predict``. The graph takes images (N, C, H, W), float32, prepared as its metadata's
``input`` says, with a dynamic batch axis, and gives the temperature-scaled probabilities, the
predicted class, the top class's log-odds, the abstain flag, the predictive entropy and the
energy, and with the feature fit the model keeps (``model/feature_ood.safetensors``) the
Mahalanobis and ViM scores (:mod:`fseb_ft.prediction.onnx_graph`).

The graph abstains as ``fseb-ft predict`` would with the same options: the threshold the model
keeps, or one chosen on the run's validation split for ``--coverage`` or ``--max-risk``, or
``--threshold`` given (0: never abstain); a model that keeps none and is given none stops. An
FS-VI run is exported as its mean network (said in a log line and in the metadata). The file is
checked with onnxruntime before it is written, atomically; its metadata_props hold the class
names, temperature, threshold, input preparation and the outputs' definitions.

Needs the optional extra: ``pip install 'fseb_ft[onnx]'`` (onnx, onnxruntime, onnxscript).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from fseb_ft.cli import fraction_argument, help_text, run_entry
from fseb_ft.logs import configure_logging
from fseb_ft.prediction import OPSETS, ExportedGraph, OnnxExport, export_onnx

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, prog: str = "fseb-ft export") -> ExportedGraph:
    """CLI ``fseb-ft export MODEL --onnx model.onnx``; prints what the file holds."""
    args = _parser(prog).parse_args(argv)
    configure_logging(args.verbose)
    exported = export_onnx(
        OnnxExport(
            model=args.model, onnx=args.onnx, coverage=args.coverage, max_risk=args.max_risk,
            threshold=args.threshold, opset=args.opset, progress=not args.no_progress,
            verbose=args.verbose,
        )
    )  # fmt: skip
    print(_summary(exported))
    return exported


def _summary(exported: ExportedGraph) -> str:
    """The lines the command prints: the file, its input, its rule and its outputs."""
    spec = json.loads(exported.metadata["input"])
    rule = exported.rule
    how = {"kept": "kept with the model", "validation": "chosen on validation"}.get(
        str(rule.chosen_on), "given"
    )
    if rule.criterion not in ("threshold", "none"):
        how += f" for {rule.criterion.replace('_', ' ')} {rule.target}"
    lines = [
        f"wrote {exported.path} ({exported.path.stat().st_size / 2**20:.1f} MiB)",
        f"input:   images (N, {spec['channels']}, {spec['height']}, {spec['width']}) float32, "
        f"mean {spec['mean']}, std {spec['std']}",
        f"abstain: below probability {rule.threshold:.4g} ({how})",
        f"outputs: {', '.join(exported.outputs)}",
        f"checked: onnxruntime against torch, max |Δp| {exported.max_probability_gap:.2g}",
    ]
    if exported.mean_network:
        lines.append("network: the run's mean network (FS-VI's q(θ) means), not its MC predictive")
    return "\n".join(lines)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="run folder, model folder or hf-hub:owner/name")
    parser.add_argument("--onnx", type=Path, required=True, help="the ONNX file to write")
    rule = parser.add_mutually_exclusive_group()
    rule.add_argument(
        "--coverage", type=fraction_argument("coverage"), metavar="C",
        help="abstain below the threshold that accepts the fraction C of the run's validation "
        "split",
    )  # fmt: skip
    rule.add_argument(
        "--max-risk", type=fraction_argument("max_risk"), metavar="R",
        help="abstain below the lowest threshold whose error rate among accepted validation "
        "images is ≤ R",
    )  # fmt: skip
    rule.add_argument(
        "--threshold", type=fraction_argument("threshold"), metavar="T",
        help="abstain when the top probability is below T (0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--opset", type=int, choices=OPSETS, metavar="N",
        help=f"ONNX opset, {OPSETS.start}..{OPSETS.stop - 1} (default: torch's)",
    )  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show the libraries' and exporter's lines"
    )
    return parser


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.export")

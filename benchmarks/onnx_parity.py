"""The ONNX file of ``fseb-ft export`` against ``fseb-ft predict`` on the same images.

    OMP_NUM_THREADS=1 python -m benchmarks.onnx_parity RUN --dataset SPEC --coverage 0.9 \\
        --onnx model.onnx [--threads 1]

Exports RUN with ``--coverage`` (``fseb-ft export``), predicts the images of the dataset spec
with :func:`fseb_ft.predict_images` at the same coverage, and runs the file with onnxruntime on
the same images prepared as predict prepares them. It prints the largest |Δp| over every class
probability, the agreement of the predicted classes and of the abstain decisions, the largest
relative difference of each OOD score the graph has beside predict's, and milliseconds per
image at ``--threads`` threads: onnxruntime on the prepared images (batches of 64), torch on the
same prepared images through the same module (eager), and predict end to end (reading and
preparing the images, the network, the rows). The last line is a JSON object of them all.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from fseb_ft import cli, predict_images
from fseb_ft.prediction.inputs import gather_inputs
from fseb_ft.prediction.loading import load_model

BATCH = 64


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the comparison; return (and print last, as JSON) its numbers."""
    args = _parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    cli.main(["export", args.run, "--onnx", str(args.onnx), "--coverage", str(args.coverage),
              "--no-progress"])  # fmt: skip
    spec = yaml.safe_load(args.dataset)
    loaded = load_model(args.run)
    images = torch.stack([x for x, _ in gather_inputs(loaded, [], spec)[0]])  # (N, C, H, W)
    start = time.perf_counter()
    found = predict_images(
        loaded, dataset=spec, coverage=args.coverage, ood="energy", top_k=len(loaded.class_names),
        progress=False, batch_size=BATCH,
    )  # fmt: skip
    rows = found.rows
    predict_ms = 1000 * (time.perf_counter() - start) / len(rows)
    graph, onnx_ms = _onnxruntime(args.onnx, images, args.threads)
    eager_ms = _eager_ms(args.onnx, loaded, images)
    summary = _compare(graph, rows, loaded.class_names)
    summary |= {
        "images": len(rows),
        "threads": args.threads,
        "onnxruntime_ms_per_image": onnx_ms,
        "torch_eager_ms_per_image": eager_ms,
        "predict_ms_per_image": predict_ms,
    }
    for key, value in summary.items():
        print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")
    print(json.dumps(summary))
    return summary


def _onnxruntime(path: Path, images: torch.Tensor, threads: int) -> tuple[dict[str, Any], float]:
    """The graph's outputs on ``images`` in batches of :data:`BATCH`, and its ms per image."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    session.run(None, {"images": images[:2].numpy()})  # warm-up
    start = time.perf_counter()
    parts = [session.run(None, {"images": batch.numpy()}) for batch in images.split(BATCH)]
    ms = 1000 * (time.perf_counter() - start) / len(images)
    return {name: np.concatenate([p[i] for p in parts]) for i, name in enumerate(names)}, ms


def _eager_ms(path: Path, loaded: Any, images: torch.Tensor) -> float:
    """Milliseconds per image of the exported module run by torch on the same batches."""
    import onnxruntime

    from fseb_ft.prediction.feature_fit import load_feature_fit
    from fseb_ft.prediction.onnx_graph import DeployedModel

    meta = onnxruntime.InferenceSession(str(path)).get_modelmeta().custom_metadata_map
    threshold = json.loads(meta["abstention"])["log_odds_threshold"]
    fit = load_feature_fit(loaded, "mahalanobis") if loaded.feature_fit_file() else None
    graph = DeployedModel(loaded.network or loaded.model, loaded.temperature, threshold, fit)
    with torch.no_grad():
        graph(images[:2])  # warm-up
        start = time.perf_counter()
        for batch in images.split(BATCH):
            graph(batch)
    return 1000 * (time.perf_counter() - start) / len(images)


def _compare(graph: dict[str, Any], rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Largest |Δp|, agreements and the OOD scores' largest relative differences."""
    k = len(names)
    want = np.array([[r[f"top{j + 1}_probability"] for j in range(k)] for r in rows])
    found = -np.sort(-graph["probabilities"], axis=1)  # predict's rows rank the classes
    scores = {"entropy": [r["entropy"] for r in rows], "energy": [r["ood_energy"] for r in rows]}
    predicted = [names[i] for i in graph["predicted"]]
    abstain = np.array([r["abstain"] for r in rows])
    out = {
        "max_abs_dp": float(np.abs(found - want).max()),
        "predicted_agreement": float(
            np.mean([p == r["prediction"] for p, r in zip(predicted, rows, strict=True)])
        ),
        "abstain_agreement": float(np.mean(graph["abstain"] == abstain)),
        "abstained": int(graph["abstain"].sum()),
    }
    for name, values in scores.items():
        expected = np.array(values)
        gap = np.abs(graph[name] - expected) / np.maximum(np.abs(expected), 1e-12)
        out[f"{name}_max_rel_diff"] = float(gap.max())
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.onnx_parity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", help="a run folder")
    parser.add_argument("--dataset", required=True, help="a dataset spec, as predict's --dataset")
    parser.add_argument("--coverage", type=float, default=0.9)
    parser.add_argument("--onnx", type=Path, required=True, help="the ONNX file to write")
    parser.add_argument("--threads", type=int, default=1, help="torch's and onnxruntime's")
    return parser


if __name__ == "__main__":
    main()

"""``fseb-ft demo``: a local web page where a user drops an image and sees what the model says.

    fseb-ft demo RUN [--port P] [--share] [--coverage A | --max-risk R] [--conformal P]
    fseb-ft demo runs/quickstart/fseb --coverage 0.9      # then open http://127.0.0.1:7860
    fseb-ft demo RUN --write-app space/                     # a Hugging Face Space of the model

The page (Gradio: ``pip install 'fseb_ft[demo]'``) shows the temperature-scaled top classes, the
decision with its reason — abstain for low confidence, at ``fseb-ft predict``'s threshold (the
run's kept one, or one chosen on its validation split by ``--coverage``/``--max-risk``), or for an
OOD flag (the run's OOD score above the value 5 % of its validation images exceed) — the
conformal prediction set at coverage ``--conformal`` and the run's reliability diagram. The
classes, probabilities, threshold and set are those ``fseb-ft predict`` gives the same file.

It serves on 127.0.0.1 only; ``--share`` asks Gradio for a public link (anyone with it can use
the page for 72 hours). ``--write-app FOLDER`` writes a Hugging Face Space instead: the model
folder, ``app.py``, ``requirements.txt`` and a README with ``sdk: gradio``; the model must keep
its threshold (``fseb-ft predict RUN IMAGES --coverage 0.9 --keep``), as a Space has no
validation split (no set and no OOD flag there).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fseb_ft.cli import device_argument, fraction_argument, help_text, run_entry
from fseb_ft.logs import configure_logging
from fseb_ft.prediction.demo_page import (
    HOST,
    build_page,
    check_port,
    import_gradio,
    reliability_of,
)
from fseb_ft.prediction.page_decisions import PagePredictor, PageSettings
from fseb_ft.prediction.space import write_space

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, prog: str = "python -m fseb_ft.demo") -> None:
    """CLI ``fseb-ft demo RUN``: serve the page until interrupted (or write the Space)."""
    parser = _parser(prog)
    args = parser.parse_args(argv)
    configure_logging()
    if args.write_app is not None:
        asked = [f"--{name.replace('_', '-')}" for name in ("coverage", "max_risk", "port")
                 if getattr(args, name) is not None] + ["--share"] * args.share  # fmt: skip
        if asked:
            parser.error(f"--write-app writes the Space and serves nothing: leave out {asked}")
        folder = write_space(args.run, args.write_app)
        print(f"wrote the Space to {folder}: upload it with huggingface-cli upload "
              f"--repo-type space USER/NAME {folder}")  # fmt: skip
        return
    settings = PageSettings(
        coverage=args.coverage, max_risk=args.max_risk, conformal=args.conformal,
        top_k=args.top_k, device=args.device,
    )  # fmt: skip
    import_gradio()  # before the model loads: a missing extra is one line at once
    check_port(args.port)
    predictor = PagePredictor(args.run, settings)
    beside = predictor.loaded.run_dir or args.run  # a --compare folder's: its fseb run's
    page = build_page(predictor, reliability_of(beside), f"fseb_ft demo: {args.run}")
    # Gradio's own lines would tell a user to edit launch(): ours name the command's options.
    page.launch(server_name=HOST, server_port=args.port, share=args.share, quiet=True,
                prevent_thread_lock=True)  # fmt: skip
    where = page.local_url + (f" and {page.share_url}" if page.share_url else "")
    print(f"the demo page is at {where} (Ctrl-C stops it"
          f"{'' if args.share else '; --share adds a public link'})", flush=True)  # fmt: skip
    page.block_thread()


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", help="run folder, model folder or hf-hub:owner/name")
    parser.add_argument("--port", type=int, help="default: the first free from 7860")
    parser.add_argument(
        "--share", action="store_true", help="also serve on a public gradio.live link (72 h)"
    )
    rule = parser.add_mutually_exclusive_group()
    rule.add_argument(
        "--coverage", type=fraction_argument("coverage"), metavar="A",
        help="abstain at the threshold that accepts the fraction A of the validation split "
        "(default: the run's kept threshold)",
    )  # fmt: skip
    rule.add_argument(
        "--max-risk", type=fraction_argument("max_risk"), metavar="R",
        help="abstain at the lowest threshold whose validation error rate among accepted "
        "images is ≤ R",
    )  # fmt: skip
    parser.add_argument(
        "--conformal", type=float, default=0.9, metavar="P",
        help="the conformal sets' target coverage (default 0.9)",
    )  # fmt: skip
    parser.add_argument("--top-k", type=int, default=3, metavar="K", help="classes shown")
    parser.add_argument("--device", type=device_argument, help="default: cuda when available")
    parser.add_argument(
        "--write-app", type=Path, metavar="FOLDER",
        help="write a Hugging Face Space of the model (app.py, requirements.txt, README.md, "
        "the model folder) to FOLDER instead of serving",
    )  # fmt: skip
    return parser


if __name__ == "__main__":
    run_entry(main, prog="python -m fseb_ft.demo")

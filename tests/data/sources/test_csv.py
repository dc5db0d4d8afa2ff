"""The ``csv`` source: a label file of image file names (Kaggle's ``train.csv`` layout)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from fseb_ft.data.images import IndexedImages
from fseb_ft.data.screening import BadImagesError, screen
from fseb_ft.data.sources import build_splits, load_spec
from fseb_ft.data.sources.imagefolder import load_imagefolder
from fseb_ft.data.splits import select_classes
from fseb_ft.recipe import DataConfig, DatasetSpec
from fseb_ft.recipe.schema import ConfigError
from tests.helpers import tiny_recipe, write_image_folder

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


def write_images(folder: Path, names: list[str], size: int = 8) -> None:
    """A small noisy PNG per name in ``folder``."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / name)


def write_table(path: Path, rows: list[list[str]], delimiter: str = ",") -> Path:
    """``rows`` (the header first) as a delimited text file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(delimiter.join(row) for row in rows) + "\n")
    return path


def kaggle_folder(root: Path) -> Path:
    """``root/train.csv`` (``id_code,diagnosis,patient_id,site``) and ``root/train_images``."""
    ids = [f"id{i}" for i in range(6)]
    write_images(root / "train_images", [f"{i}.png" for i in ids])
    rows = [["id_code", "diagnosis", "patient_id", "site"]]
    rows += [[i, str(k % 3), f"p{k // 2}", f"s{k % 2}"] for k, i in enumerate(ids)]
    return write_table(root / "train.csv", rows)


def spec(path: Path, **keys) -> DatasetSpec:
    """A ``csv`` spec of ``path`` with APTOS' columns unless ``keys`` say otherwise."""
    keys = {
        "image_dir": "train_images",
        "image_column": "id_code",
        "image_pattern": "{}.png",
        "label_column": "diagnosis",
        **keys,
    }
    return DatasetSpec(source="csv", path=str(path), **keys)


def test_integer_labels_with_image_pattern(tmp_path: Path) -> None:
    data = load_spec(spec(kaggle_folder(tmp_path)))
    assert data.labels.tolist() == [0, 1, 2, 0, 1, 2]
    assert data.class_names == ["0", "1", "2"]
    assert data.files[0] == "id0.png" and data.folder == tmp_path / "train_images"
    assert data[1][0].shape == (8, 8, 3)
    assert data.identity.startswith(f"csv:{tmp_path / 'train.csv'}#")


def test_string_labels_sorted_or_ordered_by_classes(tmp_path: Path) -> None:
    write_images(tmp_path, ["a.png", "b.png", "c.png"])
    path = write_table(
        tmp_path / "labels.csv",
        [["file", "kind"], ["a.png", "mild"], ["b.png", "severe"], ["c.png", "mild"]],
    )
    sorted_ = load_spec(
        DatasetSpec(source="csv", path=str(path), image_column="file", label_column="kind")
    )
    assert sorted_.class_names == ["mild", "severe"]
    assert sorted_.labels.tolist() == [0, 1, 0]
    ordered = load_spec(
        DatasetSpec(
            source="csv",
            path=str(path),
            image_column="file",
            label_column="kind",
            classes=("severe", "none", "mild"),
        )
    )
    assert ordered.class_names == ["severe", "none", "mild"]
    assert ordered.labels.tolist() == [2, 0, 2]


def test_integer_labels_with_classes(tmp_path: Path) -> None:
    data = load_spec(spec(kaggle_folder(tmp_path), classes=(2, 1, 0)))
    assert data.class_names == ["2", "1", "0"]
    assert data.labels.tolist() == [2, 1, 0, 2, 1, 0]


def test_image_dir_relative_absolute_and_default(tmp_path: Path) -> None:
    path = kaggle_folder(tmp_path)
    absolute = load_spec(spec(path, image_dir=str(tmp_path / "train_images")))
    relative = load_spec(spec(path))
    assert absolute.folder == relative.folder == tmp_path / "train_images"
    # Without image_dir the files are the label file's neighbours.
    beside = write_table(
        tmp_path / "train_images" / "labels.csv",
        [["id_code", "diagnosis"], ["id0", "1"], ["id1", "0"]],
    )
    data = load_spec(spec(beside, image_dir=None))
    assert data.folder == tmp_path / "train_images" and data.labels.tolist() == [1, 0]


def test_tsv_and_parquet(tmp_path: Path) -> None:
    write_images(tmp_path, ["a b.png", "c.png"])
    tsv = write_table(
        tmp_path / "t.tsv", [["image", "label"], ["a b.png", "1"], ["c.png", "0"]], delimiter="\t"
    )
    assert load_spec(DatasetSpec(source="csv", path=str(tsv))).files == ["a b.png", "c.png"]
    table = pa.table({"image": ["a b.png", "c.png"], "label": [1, 0]})
    pq.write_table(table, tmp_path / "t.parquet")
    data = load_spec(DatasetSpec(source="csv", path=str(tmp_path / "t.parquet")))
    assert data.files == ["a b.png", "c.png"] and data.labels.tolist() == [1, 0]


def test_datasets_metadata_csv_layout(tmp_path: Path) -> None:
    # datasets' imagefolder with labels in metadata.csv: file_name relative to its folder.
    write_images(tmp_path / "train" / "sub", ["x.png", "y.png"])
    write_table(
        tmp_path / "train" / "metadata.csv",
        [["file_name", "label"], ["sub/x.png", "cat"], ["sub/y.png", "dog"]],
    )
    data = load_spec(
        DatasetSpec(
            source="csv", path=str(tmp_path / "train" / "metadata.csv"), image_column="file_name"
        )
    )
    assert data.class_names == ["cat", "dog"] and data.files == ["sub/x.png", "sub/y.png"]
    assert data[0][0].shape == (8, 8, 3)


def test_groups_and_metadata_are_kept_through_subsets(tmp_path: Path) -> None:
    data = load_spec(
        spec(kaggle_folder(tmp_path), group_column="patient_id", metadata_columns=("site",))
    )
    assert data.groups.tolist() == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert data.metadata["site"].tolist() == ["s0", "s1"] * 3
    subset = select_classes(IndexedImages(data, [5, 4, 3, 1]), [1, 2])
    assert subset.labels.tolist() == [1, 0, 0]
    assert subset.groups.tolist() == ["p2", "p2", "p0"]
    assert subset.metadata["site"].tolist() == ["s1", "s0", "s1"]
    limited = load_spec(spec(kaggle_folder(tmp_path), group_column="patient_id", limit=3))
    assert len(limited.groups) == 3
    splits = build_splits(
        DataConfig(train=spec(tmp_path / "train.csv", group_column="patient_id"), val_fraction=0.5),
        0,
    )
    for part in (splits.train, splits.val):
        assert part.groups.tolist() == [data.groups[i] for i in part.indices]
    assert load_spec(spec(tmp_path / "train.csv")).groups is None


def test_pixels_equal_the_image_folder_source(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "folder", "train", {"a": 2, "b": 3}, size=(6, 9))
    folder = load_imagefolder(tmp_path / "folder", "train")
    rows = [["file", "label"]] + [
        [f, folder.class_names[k]] for f, k in zip(folder.files, folder.labels, strict=True)
    ]
    path = write_table(tmp_path / "folder" / "train" / "labels.csv", rows)
    data = load_spec(DatasetSpec(source="csv", path=str(path), image_column="file"))
    assert data.labels.tolist() == folder.labels.tolist()
    assert data.class_names == folder.class_names
    for i in range(len(folder)):
        assert np.array_equal(data[i][0], folder[i][0])
    gray = load_spec(DatasetSpec(source="csv", path=str(path), image_column="file"), channels=1)
    assert np.array_equal(gray[0][0], load_imagefolder(tmp_path / "folder", channels=1)[0][0])


def test_identity_is_stable_and_follows_the_files(tmp_path: Path) -> None:
    path = kaggle_folder(tmp_path)
    first = load_spec(spec(path)).identity
    assert load_spec(spec(path)).identity == first
    write_images(tmp_path / "train_images", ["id3.png"], size=9)  # one image rewritten
    assert load_spec(spec(path)).identity != first


@pytest.mark.parametrize(
    ("rows", "keys", "message"),
    [
        (
            [["id_code", "diagnosis"], ["nope", "0"], ["nada", "1"]],
            {},
            "none of its 2 image files exists (the first would be {dir}/nope.png); check "
            "image_dir and image_pattern",
        ),
        (
            [["id_code", "diagnosis"], ["id0", "0"], ["id1", "1"], ["id0", "1"]],
            {},
            "data row 3 (line 4): image 'id0.png' is listed again (first at data row 1)",
        ),
        (
            [["id_code", "diagnosis"], ["id0", "0"], ["id1", "7"]],
            {"classes": (0, 1)},
            "data row 2 (line 3): label '7' is not one of classes ['0', '1']",
        ),
        (
            [["id_code", "diagnosis"], ["id0", "0"], ["id1", ""]],
            {},
            "data row 2 (line 3): column 'diagnosis' (label_column) is empty",
        ),
        (
            [["id_code", "diagnosis"], ["id0", "0"], ["", "1"]],
            {},
            "data row 2 (line 3): column 'id_code' (image_column) is empty",
        ),
        (
            [["id_code", "diagnosis", "patient_id"], ["id0", "0", "p"], ["id1", "1", " "]],
            {"group_column": "patient_id"},
            "data row 2 (line 3): column 'patient_id' (group_column) is empty",
        ),
        (
            [["id_code", "grade"], ["id0", "0"]],
            {},
            "has no column 'diagnosis' (label_column); its columns are ['id_code', 'grade']",
        ),
        (
            [["id_code", "diagnosis"], ["id0", "-1"]],
            {},
            "data row 1 (line 2): label -1 is negative",
        ),
    ],
)
def test_errors_name_the_row(tmp_path: Path, rows, keys, message) -> None:
    kaggle_folder(tmp_path)
    path = write_table(tmp_path / "bad.csv", rows)
    with pytest.raises(ValueError) as caught:
        load_spec(spec(path, **keys))
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: ") or "has no column" in text
    assert message.format(dir=tmp_path / "train_images") in text


def test_missing_files_are_all_named_by_the_check_and_skipped_with_the_others(
    tmp_path: Path,
) -> None:
    kaggle_folder(tmp_path)  # id0 … id5
    rows = [["id_code", "diagnosis"], ["id0", "0"], ["gone1", "1"], ["id2", "1"], ["gone2", "0"]]
    data = load_spec(spec(write_table(tmp_path / "t.csv", rows)))
    assert len(data) == 4  # the load keeps them: the check names every one
    with pytest.raises(BadImagesError) as caught:
        screen({"data.train": data}, "stop", progress=False)
    missing = [str(tmp_path / "train_images" / f"gone{i}.png") for i in (1, 2)]
    assert str(caught.value).startswith("2 image(s) cannot be read: ")
    assert all(f"data.train: {path} (no such file)" in str(caught.value) for path in missing)
    kept, dropped = screen({"data.train": data}, "skip", progress=False)
    assert dropped == {"data.train": missing} and kept["data.train"].labels.tolist() == [0, 1]


def test_a_delimiter_option_and_a_hint_when_the_header_holds_one(tmp_path: Path) -> None:
    kaggle_folder(tmp_path)
    rows = [["id_code", "diagnosis"], ["id0", "1"], ["id1", "0"]]
    path = write_table(tmp_path / "semi.csv", rows, delimiter=";")
    with pytest.raises(ValueError, match=r"its columns are \['id_code;diagnosis'\]; the header "
                       r"holds ';': set delimiter: ';'$"):  # fmt: skip
        load_spec(spec(path))
    data = load_spec(spec(path, delimiter=";"))
    assert data.labels.tolist() == [1, 0] and data.files == ["id0.png", "id1.png"]
    tabbed = write_table(tmp_path / "tabbed.csv", rows, delimiter="\t")
    with pytest.raises(ValueError, match=r'set delimiter: "\\t"$'):
        load_spec(spec(tabbed))
    assert load_spec(spec(tabbed, delimiter="\t")).labels.tolist() == [1, 0]
    with pytest.raises(ConfigError, match="delimiter=';;': must be one character"):
        spec(path, delimiter=";;")
    with pytest.raises(ConfigError, match="applies to source csv only"):
        DatasetSpec(source="imagefolder", path="x", delimiter=";")


@pytest.mark.parametrize(
    ("labels", "classes", "warned"),
    [
        (["none", "mild", "severe", "mild"], None, r"sorted alphabetically: \['mild', 'none', "),
        (["none", "mild", "severe", "mild"], ["none", "mild", "severe"], None),
        (["1", "2", "3", "2"], None, r"start at 1: class 0 has no images .*\.classes: \[1, 2, 3\]"),
        (["1", "2", "3", "2"], [1, 2, 3], None),
        (["0", "1", "2", "1"], None, None),
    ],
)
def test_qwk_warns_when_the_class_order_is_likely_not_the_grades(
    tmp_path: Path, labels: list[str], classes: list | None, warned: str | None
) -> None:
    from fseb_ft.engine.run_checks import ordinal_warnings
    from fseb_ft.recipe import recipe_from_dict

    kaggle_folder(tmp_path)
    rows = [["id_code", "diagnosis"]] + [[f"id{i}", label] for i, label in enumerate(labels)]
    train = {**vars(spec(write_table(tmp_path / "t.csv", rows))), "classes": classes}
    for metrics in (["qwk"], []):
        recipe = recipe_from_dict({"data": {"train": train}, "eval": {"metrics": metrics}})
        found = ordinal_warnings(recipe, load_spec(recipe.data.train))
        if warned is None or not metrics:
            assert found == []
        else:
            assert len(found) == 1 and re.search(warned, found[0]), found


def test_the_line_counts_blank_lines_and_quoted_newlines(tmp_path: Path) -> None:
    kaggle_folder(tmp_path)
    path = tmp_path / "bad.csv"
    path.write_text('id_code,diagnosis,note\nid0,0,"two\nlines"\n\nid1,,x\n')
    with pytest.raises(ValueError, match=r"data row 2 \(line 5\): column 'diagnosis'"):
        load_spec(spec(path))


def test_spec_keys_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="applies to source csv only"):
        DatasetSpec(source="imagefolder", path="x", group_column="patient_id")
    with pytest.raises(ConfigError, match=r"must hold \{\} once"):
        DatasetSpec(source="csv", path="x.csv", image_pattern="x.png")
    assert DatasetSpec(source="imagefolder", path="x", classes=("cat", 0)).classes == ("cat", 0)


def test_a_run_trains_on_a_csv_dataset(tmp_path: Path) -> None:
    from fseb_ft.engine.run import run
    from fseb_ft.recipe import recipe_from_dict

    write_image_folder(tmp_path / "ind", "test", {"a": 4, "b": 4})
    write_image_folder(tmp_path / "ood", "test", {"owl": 5})
    kaggle = tmp_path / "kaggle"
    write_image_folder(kaggle, "images", {"a": 8, "b": 8})
    rows = [["image", "patient", "label"]]
    rows += [[f"{name}/{i:03d}.png", f"p{i // 2}", name] for name in "ab" for i in range(8)]
    write_table(kaggle / "train.csv", rows)
    raw = tiny_recipe({"ind": tmp_path / "ind", "ood": tmp_path / "ood"}, tmp_path / "runs")
    raw["data"]["train"] = {
        "source": "csv",
        "path": str(kaggle / "train.csv"),
        "image_dir": "images",
        "group_column": "patient",
    }
    results = run(recipe_from_dict(raw))
    assert results["training"]["epochs"] == 2 and results["test"]["n"] == 8
    assert f"csv:{kaggle / 'train.csv'}#" in (tmp_path / "runs" / "run.json").read_text()


def test_a_recipe_names_classes_by_label_or_name(tmp_path: Path) -> None:
    from fseb_ft.recipe import recipe_from_dict

    raw = tiny_recipe({"ind": tmp_path, "ood": tmp_path}, tmp_path / "runs")
    raw["data"]["train"] = {"source": "csv", "path": "t.csv", "classes": ["severe", 0]}
    assert recipe_from_dict(raw).data.train.classes == ("severe", 0)

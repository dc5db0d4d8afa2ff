"""What a published file may say: local paths by their last component, or placeholders."""

from __future__ import annotations

import pytest

from fseb_ft.runs.published import folder_name, model_label, placeholders, scrub


@pytest.mark.parametrize(
    ("text", "named", "placeheld"),
    [
        (
            "imagefolder:/home/alice/data/my_data:train#c0ae|subset:18",
            "imagefolder:my_data:train#c0ae|subset:18",
            "imagefolder:PATH/TO/my_data:train#c0ae|subset:18",
        ),
        ("local-dir:/home/alice/weights/effnet/", "local-dir:effnet", "local-dir:PATH/TO/effnet"),
        ("`/srv/x/cat/1.jpg`, `~/y.png`", "`1.jpg`, `y.png`", "`PATH/TO/1.jpg`, `PATH/TO/y.png`"),
        ("disk:C:\\Users\\al\\set:test", "disk:set:test", "disk:PATH/TO/set:test"),
    ],
)
def test_local_paths_become_their_names_or_placeholders(
    text: str, named: str, placeheld: str
) -> None:
    assert scrub(text) == named
    assert placeholders(text) == placeheld


@pytest.mark.parametrize(
    "text",
    [
        "[`org/m`](https://huggingface.co/org/m) and hf-hub:org/m@v1",
        "<details>\n<summary>x</summary>\n</details>",
        "probs = (model(x) / T).softmax(-1); AUROC/AUPR/FPR95; entropy / msp",
        "path: runs/quickstart/fseb",  # relative: nothing of this machine in it
        "local-dir:PATH/TO/effnet",
    ],
)
def test_urls_markup_arithmetic_and_relative_paths_are_left_alone(text: str) -> None:
    assert scrub(text) == placeholders(text) == text


def test_mappings_and_lists_are_walked_and_other_values_kept() -> None:
    tree = {"data": {"train": "imagefolder:/d/my_data:train#1"}, "n": 3, "x": [0.5, "/a/b"]}
    assert scrub(tree) == {
        "data": {"train": "imagefolder:my_data:train#1"},
        "n": 3,
        "x": [0.5, "b"],
    }


def test_a_whole_recipe_value_keeps_a_folder_name_with_spaces() -> None:
    assert placeholders({"path": "/home/alice/my data"}) == {"path": "PATH/TO/my data"}
    assert placeholders("local-dir:/w/my net") == "local-dir:PATH/TO/my net"


def test_names_shown_for_models_and_folders() -> None:
    assert model_label("local-dir:/home/alice/weights/efficientnet_lite0.in1k") == (
        "efficientnet_lite0.in1k"
    )
    assert model_label("hf-hub:org/name@v1") == "hf-hub:org/name@v1"
    assert model_label("resnet18") == "resnet18"
    # A run started from another run's model folder: that run's name says which model it is.
    assert model_label("local-dir:/home/alice/runs/qs-fseb/model") == "qs-fseb/model"
    assert model_label("local-dir:runs\\qs-fseb\\model\\") == "qs-fseb/model"
    assert model_label("local-dir:model") == "model"
    assert folder_name("/home/alice/data/my_data/") == "my_data"

"""The paper benchmark drivers: recipes they build, the tables they write, the marked sections."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from benchmarks import paper_cifar10, paper_fmnist, provenance
from fseb_ft.recipe import load_recipe

pytestmark = pytest.mark.no_figures  # figures: runs/test_plots.py, engine/test_pipeline.py


@pytest.mark.parametrize("protocol", ["far", "near"])
def test_cifar10_protocols_build_valid_recipes(protocol: str, tmp_path: Path) -> None:
    overrides = paper_cifar10.protocol_overrides(protocol, tmp_path / "cifar", "limit: 600")
    recipe = load_recipe(paper_cifar10.RECIPE, [*overrides, "fseb.reg_scale=0"])
    train, test = recipe.data.train, recipe.data.test
    assert (train.source, train.path, train.split, train.limit) == (
        "disk",
        str(tmp_path / "cifar"),
        "train",
        600,
    )
    assert (train.image_column, train.label_column) == ("image", "label")
    assert recipe.fseb.reg_scale == 0 and recipe.model.head_init == "zeros"
    if protocol == "far":
        assert train.classes is None and test.classes is None
        assert set(recipe.data.ood) == {"mnist", "fmnist"}
        assert {s.source for s in recipe.data.ood.values()} == {"idx"}
    else:
        # In-distribution and held-out classes partition CIFAR-10, and only test images are OOD.
        held_out = recipe.data.ood["held_out"]
        assert train.classes == test.classes == paper_cifar10.IN_CLASSES
        assert held_out.split == "test" and held_out.classes == paper_cifar10.HELD_OUT
        assert sorted(train.classes + held_out.classes) == list(range(10))


def test_context_protocol_never_uses_a_context_as_an_ood_set(tmp_path: Path) -> None:
    (tmp_path / "tiny-imagenet" / "tiny-imagenet-200" / "val").mkdir(parents=True)  # extracted
    base = paper_cifar10.protocol_overrides("context", tmp_path / "cifar", "limit: 600", tmp_path)
    everything = load_recipe(paper_cifar10.RECIPE, base)
    assert set(everything.data.ood) == {"mnist", "fmnist", "cifar100", "tiny_imagenet"}
    assert {s.limit for s in everything.data.ood.values()} == {paper_cifar10.OOD_LIMIT}
    methods = paper_cifar10.context_methods(tmp_path)
    assert set(methods) == set(paper_cifar10.CONTEXT_METHODS)
    diags = set()
    for overrides in methods.values():
        recipe = load_recipe(paper_cifar10.RECIPE, [*base, *overrides])
        diags.add(recipe.fseb.prior_cov_diag)
        (context,) = recipe.context.datasets
        assert recipe.context.kind == "dataset" and not recipe.context.perturb
        assert len(recipe.data.ood) == 3
        assert context.path not in {spec.path for spec in recipe.data.ood.values()}
    assert diags == {load_recipe(paper_cifar10.RECIPE, base).fseb.prior_cov_diag, 1.0}
    share = paper_cifar10.protocol_overrides(
        "context", tmp_path / "cifar", "fraction: 0.1", tmp_path
    )
    train = load_recipe(paper_cifar10.RECIPE, share).data.train
    assert (train.fraction, train.limit) == (0.1, None)  # the training-set-fraction section


def test_a_method_without_an_ood_set_gets_a_dash_not_a_number() -> None:
    runs = {
        "PS-MAP": [{"test": {"accuracy": a}, "ood": {"c": {"auroc": a}}} for a in (0.5, 0.7)],
        "FS-EB": [{"test": {"accuracy": a}, "ood": {}} for a in (0.6, 0.8)],
    }
    columns = (("Acc.", ("test", "accuracy"), 100.0), ("C", ("ood", "c", "auroc"), 100.0))
    rows = paper_fmnist.table(runs, columns).splitlines()[2:]
    assert rows[0].endswith("| 60.00 ± 10.00 |")
    assert rows[1] == "| FS-EB | 2 | 70.00 ± 10.00 | — |"
    assert rows[2] == "| Δ FS-EB − PS-MAP | 2 | +10.00 ± 0.00 | — |"


def _results(acc: float, nll: float, auroc: float) -> dict:
    test = {"accuracy": acc, "nll": nll, "ece": 0.02, "sel_pred_auc": 0.9}
    return {"test": test, "ood": {"held_out": {"entropy_auroc": auroc}}, "val_nll": nll + 0.01}


def test_cifar10_table_gives_mean_and_standard_error_over_seeds() -> None:
    runs = {"PS-MAP": [_results(0.8, 0.5, 0.7), _results(0.9, 0.7, 0.9)]}
    table = paper_cifar10.table(runs, "near", "cifar10-near")
    assert (
        "| Method | seeds | val NLL | Acc. (%) | NLL | ECE (%) | Sel. Pred. (%) | 4 held-out"
        in table
    )
    se_acc = 100 * 0.1 / math.sqrt(2) / math.sqrt(2)  # stdev of (80, 90) / sqrt(2)
    assert f"| PS-MAP | 2 | 0.6100 ± 0.1000 | 85.00 ± {se_acc:.2f} | 0.6000 ± 0.1000 |" in table
    assert table.rstrip().endswith("| 80.00 ± 10.00 |")


def test_delta_rows_pair_the_seeds() -> None:
    runs = {
        "PS-MAP": [_results(0.80, 0.5, 0.70), _results(0.90, 0.7, 0.90)],
        "FS-EB": [_results(0.81, 0.4, 0.80), _results(0.93, 0.5, 0.96)],
    }
    lines = paper_cifar10.table(runs, "near", "cifar10-near").splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| PS-MAP",
        "| FS-EB",
        "| Δ FS-EB − PS-MAP",
    ]
    delta = lines[-1].split(" | ")
    # Per-seed differences: accuracy +1 and +3 points, NLL −0.1 and −0.2, AUROC +10 and +6.
    assert delta[2:5] == ["-0.1500 ± 0.0500", "+2.00 ± 1.00", "-0.1500 ± 0.0500"]
    assert delta[-1] == "+8.00 ± 2.00 |"


def test_tables_only_reads_saved_results_and_names_a_missing_run(tmp_path: Path) -> None:
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "results.json").write_text('{"test": {"accuracy": 0.5}}')
    assert paper_fmnist.finished_results(tmp_path / "done") == {"test": {"accuracy": 0.5}}
    with pytest.raises(SystemExit, match=r"missing/results.json not found: run the benchmark"):
        paper_fmnist.finished_results(tmp_path / "missing")


def test_the_printed_command_reproduces_the_method_subset_and_the_corruptions() -> None:
    args = argparse.Namespace(
        epochs=3, seeds=[0, 1], methods=["PS-MAP", "FS-EB (train-corr)"], override=[],
        curve=None, section="fmnist", corruptions=["all"], severities=[1, 5],
    )  # fmt: skip
    assert paper_fmnist.command_line(args) == (
        "python -m benchmarks.paper_fmnist --epochs 3 --seeds 0 1 --methods 'PS-MAP' "
        "'FS-EB (train-corr)' --corruptions all --severities 1 5"
    )
    args.methods, args.corruptions, args.section = None, None, "fmnist-frac10"
    assert paper_fmnist.command_line(args) == (
        "python -m benchmarks.paper_fmnist --epochs 3 --seeds 0 1 --section fmnist-frac10"
    )


def test_write_section_replaces_only_its_marked_block(tmp_path: Path) -> None:
    path = tmp_path / "results.md"
    path.write_text("# Results\n\nintro\n")
    markers = ("<!-- x:begin -->", "<!-- x:end -->")
    provenance.write_section(path, "first\n", markers, runs=[])
    provenance.write_section(path, "second\n", markers, runs=[])
    text = path.read_text()
    head, block = text.split("<!-- x:begin -->\n")
    assert head == "# Results\n\nintro\n\n"
    assert block.startswith("second\n\n<!-- made-by: ") and block.endswith("<!-- x:end -->\n")
    assert "first" not in text
    provenance.write_section(path, "other\n", ("<!-- y:begin -->", "<!-- y:end -->"), runs=[])
    assert "second" in path.read_text() and "other" in path.read_text()


def test_fmnist_table_ends_with_the_papers_rows_and_what_differs() -> None:
    runs = {"PS-MAP": [_results(0.8, 0.5, 0.7)] * 2}
    for run in runs["PS-MAP"]:
        run["ood"]["mnist"] = {"entropy_auroc": 0.7}
        run["test"] |= {"ece_10bin": 0.02}
    text = paper_fmnist.table(runs, paper="fmnist")
    lines = text.splitlines()
    assert lines[2].startswith("| PS-MAP | 2 | 80.00 ± 0.00 |")
    # Table 1's accuracy, NLL, ECE and Sel. Pred., Table 3's MNIST AUROC; no ECE-10 in the paper.
    assert lines[4] == (
        "| paper: FS-EB (ResNet-18, from scratch; context: KMNIST; Tables 1, 3) | 5 | 94.1 ± 0.1 "
        "| 0.19 ± 0.00 | 1.8 ± 0.1 | — | 98.8 ± 0.0 | 99.9 ± 0.0 |"
    )
    assert any("context: train, corrupted; Appendix — context distribution" in x for x in lines)
    assert lines[-1].startswith("Paper rows: Rudner et al. (ICML 2023), Tables 1, 3 and Appendix")
    assert "OOD set: MNIST in both." in lines[-1]
    assert "paper:" not in paper_fmnist.table(runs)


def test_cifar10_far_table_has_table_4_with_its_ood_set_named() -> None:
    run = _results(0.8, 0.5, 0.7)
    run["ood"] |= {"mnist": {"entropy_auroc": 0.9}, "fmnist": {"entropy_auroc": 0.8}}
    text = paper_cifar10.table({"PS-MAP": [run, run]}, "far", "cifar10-far")
    assert (
        "| paper: FS-EB (ResNet-18, ImageNet-pretrained; context: CIFAR-100; Table 4) | 5 | — "
        "| 96.2 ± 0.1 | 0.11 ± 0.00 | 1.3 ± 0.1 | 99.6 ± 0.0 | 98.9 ± 0.1 (SVHN) | — |"
    ) in text
    assert "OOD set: paper SVHN; here MNIST and FashionMNIST." in text
    assert "paper:" not in paper_cifar10.table({"PS-MAP": [run, run]}, "near", "cifar10-near")


def test_context_table_ends_with_table_4_and_leaves_a_rows_own_context_blank() -> None:
    def results(acc: float, sets: tuple[str, ...]) -> dict:
        test = {"accuracy": acc, "nll": 0.5, "ece": 0.02, "sel_pred_auc": 0.9}
        ood = {name: {"entropy_auroc": 0.8} for name in sets}
        return {"test": test, "ood": ood, "val_nll": 0.5}

    every = ("mnist", "fmnist", "cifar100", "tiny_imagenet")
    runs = {
        "PS-MAP": [results(a, every) for a in (0.7, 0.8)],
        "FS-EB (cifar100)": [results(a, ("mnist", "fmnist", "tiny_imagenet")) for a in (0.7, 0.9)],
    }
    lines = paper_cifar10.table(runs, "context", "cifar10-context").splitlines()
    assert lines[0].endswith("| MNIST AUROC (%) | FMNIST AUROC (%) | CIFAR-100 AUROC (%) | "
                             "Tiny-ImageNet AUROC (%) |")  # fmt: skip
    # Its own context is never its OOD set: no CIFAR-100 AUROC, and no Δ for it either.
    assert lines[3].endswith("| 80.00 ± 0.00 | 80.00 ± 0.00 | — | 80.00 ± 0.00 |")
    assert lines[4].startswith("| Δ FS-EB (cifar100) − PS-MAP | 2 | +0.0000 ± 0.0000 | +5.00 ± ")
    assert lines[4].endswith("| — | +0.00 ± 0.00 |")
    paper = [line for line in lines if line.startswith("| paper: ")]
    assert [line.split(" | ")[0] for line in paper] == [
        "| paper: PS-MAP (ResNet-18, ImageNet-pretrained; Table 4)",
        "| paper: FS-EB (ResNet-18, ImageNet-pretrained; context: CIFAR-100; Table 4)",
    ]
    assert "| 96.3 ± 0.7 (SVHN) | — | — | — |" in paper[0]
    assert lines[-1].startswith("Paper rows: Rudner et al. (ICML 2023), Table 4")
    assert "Context: paper CIFAR-100; here each FS-EB row's label" in lines[-1]


def _shifted(acc: float, ece: float, nll: float) -> dict:
    """A run's results with two corruptions at severities 1 and 3 (noise loses 10 points more)."""
    per = {
        "noise": {str(s): {"accuracy": acc - 0.1 * s, "ece": ece, "nll": nll} for s in (1, 3)},
        "blur": {str(s): {"accuracy": acc, "ece": ece + 0.01 * s, "nll": nll} for s in (1, 3)},
    }
    summary = {
        str(s): {
            k: (per["noise"][str(s)][k] + per["blur"][str(s)][k]) / 2 for k in per["noise"]["1"]
        }
        for s in (1, 3)
    }
    test = {"accuracy": acc, "ece": ece, "nll": nll}
    return {"test": test, "corruptions": per, "corruption_summary": summary}


def test_one_seed_tables_print_no_nan() -> None:
    one = {"PS-MAP": [_results(0.8, 0.5, 0.7)], "FS-EB": [_results(0.9, 0.4, 0.8)]}
    table = paper_cifar10.table(one, "near", "cifar10-near")
    assert "nan" not in table and "| PS-MAP | 1 | 0.5100 | 80.00 | 0.5000 |" in table
    shift = {"PS-MAP": [_shifted(0.8, 0.02, 0.5)], "FS-EB": [_shifted(0.9, 0.01, 0.4)]}
    text = paper_fmnist.corruption_table(shift, [1, 3]) + paper_cifar10.shift_deltas(shift, [1, 3])
    assert "nan" not in text and "| Δ FS-EB − PS-MAP | +10.0 / -1.0 |" in text


def test_the_clean_column_is_the_corrupted_images_uncorrupted() -> None:
    # eval.corruption_limit: the corrupted subset's clean metrics, not the whole test split's.
    limited = {**_shifted(0.8, 0.02, 0.5), "corruption_clean": {"accuracy": 0.95, "ece": 0.03}}
    assert "| PS-MAP | 95.0 / 3.0 |" in paper_fmnist.corruption_table({"PS-MAP": [limited]}, [1])
    assert "| PS-MAP | 80.0 / 2.0 |" in paper_fmnist.corruption_table(  # older results: test
        {"PS-MAP": [_shifted(0.8, 0.02, 0.5)]}, [1]
    )


def test_shift_deltas_pair_the_seeds_per_corruption_and_severity() -> None:
    runs = {
        "PS-MAP": [_shifted(0.80, 0.05, 0.6), _shifted(0.70, 0.05, 0.8)],
        "FS-EB": [_shifted(0.82, 0.03, 0.5), _shifted(0.76, 0.02, 0.6)],
    }
    text = paper_cifar10.shift_deltas(runs, [1, 3])
    # Per-seed differences: accuracy +2 and +6 points everywhere, ECE −2 and −3, NLL −0.1, −0.2.
    assert "| clean | +4.00 ± 2.00 | -0.150 ± 0.050 | -2.50 ± 0.50 |" in text
    assert "| severity 3 | +4.00 ± 2.00 | -0.150 ± 0.050 | -2.50 ± 0.50 |" in text
    assert "| noise | +4.00 ± 2.00 / -2.50 ± 0.50 | +4.00 ± 2.00 / -2.50 ± 0.50 |" in text
    assert "| mean over corruptions | +4.00 ± 2.00 / -2.50 ± 0.50 |" in text
    summary = paper_fmnist.corruption_table(runs, [1, 3]).splitlines()
    assert summary[-1] == "| Δ FS-EB − PS-MAP |" + " +4.0 ± 2.0 / -2.5 ± 0.5 |" * 3

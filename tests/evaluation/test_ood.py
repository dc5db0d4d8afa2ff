"""The OOD score registry (fseb_ft.evaluation.ood): a score is one function and its decorator, and
everything that reports scores (results, tables, model card) finds it there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

from fseb_ft.evaluation.checks import to_float64
from fseb_ft.evaluation.ood import OOD_SCORE_REGISTRY, ood_metrics, ood_score, register_ood_score
from fseb_ft.evaluation.predictions import Predictions
from fseb_ft.recipe.options import OOD_SCORES
from fseb_ft.runs.report import eval_results
from fseb_ft.runs.tables import markdown_table, ood_score_titles, ood_scores_in

FAKE = "first_class"
FAKE_TITLE = "negative probability of the first class"


def _probs(n: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, 3, generator=g) * 3, -1)  # (n, 3)


@pytest.fixture
def fake_score() -> Iterator[str]:
    """A score registered as a contributor would add one, removed again afterwards."""

    @register_ood_score(FAKE, title=FAKE_TITLE)
    def first_class_score(probs: Tensor) -> Tensor:
        return -to_float64(probs[:, 0])  # (N,)

    yield FAKE
    del OOD_SCORE_REGISTRY[FAKE]
    assert tuple(OOD_SCORE_REGISTRY) == OOD_SCORES


def test_the_registry_is_the_recipe_option_list_in_order() -> None:
    assert tuple(OOD_SCORE_REGISTRY) == OOD_SCORES
    for name, score in OOD_SCORE_REGISTRY.items():
        assert score.name == name and score.title.strip() == score.title != ""


def test_titles_and_logit_needs_are_those_results_always_had() -> None:
    # results.md and published model cards name the scores with these words.
    titles = {
        "entropy": "predictive entropy",
        "msp": "negative maximum softmax probability (−MSP)",
        "max_logit": "negative maximum logit",
        "energy": "energy (−logsumexp of the logits)",
    }
    assert {name: OOD_SCORE_REGISTRY[name].title for name in titles} == titles
    needs_logits = {name: OOD_SCORE_REGISTRY[name].needs_logits for name in titles}
    assert needs_logits == {"entropy": False, "msp": False, "max_logit": True, "energy": True}


def test_a_score_without_a_title_or_with_a_taken_name_fails_when_registered() -> None:
    with pytest.raises(TypeError, match="title"):
        register_ood_score("untitled")  # type: ignore[call-arg]
    for title in ("", "  ", None):
        with pytest.raises(ValueError, match="'untitled' needs a non-empty `title`"):
            register_ood_score("untitled", title=title)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'energy' is already registered"):
        register_ood_score("energy", title="energy again")
    assert tuple(OOD_SCORE_REGISTRY) == OOD_SCORES


def test_a_registered_score_is_computed_reported_and_titled(fake_score: str) -> None:
    probs_in, probs_out = _probs(30, seed=0), _probs(20, seed=1)
    assert torch.equal(ood_score(fake_score, probs_in), -probs_in[:, 0].double())
    found = ood_metrics(probs_in, probs_out, ("entropy", fake_score))
    assert {f"{fake_score}_auroc", f"{fake_score}_aupr", f"{fake_score}_fpr95"} < set(found)

    preds = Predictions(
        test=(probs_in.log(), torch.randint(0, 3, (30,), generator=torch.Generator())),
        ood={"far": probs_out.log()},
    )
    results = eval_results(preds, (fake_score, "entropy"))
    assert results["ood"]["far"][f"{fake_score}_auroc"] == pytest.approx(
        float(found[f"{fake_score}_auroc"])
    )
    assert ood_scores_in([results]) == ["entropy", fake_score]  # registration order
    assert ood_score_titles([results]) == ["predictive entropy", FAKE_TITLE]
    header = markdown_table({"FS-EB": results}).splitlines()[0]
    assert f"| far {fake_score} AUROC (%) | far {fake_score} AUPR (%) |" in header


def test_a_logit_score_is_absent_without_logits_and_needs_them_when_asked() -> None:
    @register_ood_score("neg_second_logit", title="negative second logit", needs_logits=True)
    def second_logit_score(logits: Tensor) -> Tensor:
        return -to_float64(logits[:, 1])  # (N,)

    try:
        z_in, z_out = torch.randn(12, 3), torch.randn(8, 3)
        p_in, p_out = z_in.softmax(-1), z_out.softmax(-1)
        scores = ("neg_second_logit",)
        assert set(ood_metrics(p_in, p_out, scores, z_in, z_out)) == {
            "neg_second_logit_auroc",
            "neg_second_logit_aupr",
            "neg_second_logit_fpr95",
        }
        assert ood_metrics(p_in, p_out, scores) == {}
        with pytest.raises(ValueError, match="'neg_second_logit' score needs `logits`"):
            ood_score("neg_second_logit", p_in)
    finally:
        del OOD_SCORE_REGISTRY["neg_second_logit"]
    with pytest.raises(ValueError, match=r"must be one of \['entropy', 'msp', 'max_logit'"):
        ood_score("neg_second_logit", p_in, z_in)

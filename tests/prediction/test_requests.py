"""The requests of a prediction (fseb_ft.prediction.requests): each section refuses a bad value
naming it, and ``predict_images``' keyword arguments make the same request as the sections."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from fseb_ft.prediction import predict_images
from fseb_ft.prediction.requests import (
    LoadRequest,
    OutputRequest,
    PredictRequest,
    RowRequest,
    RuleRequest,
)
from fseb_ft.recipe import ConfigError


def test_the_keywords_make_the_request_the_sections_make() -> None:
    flat = PredictRequest().replaced(
        coverage=0.8, keep=True, top_k=5, ood="energy", conformal=0.9, conformal_method="aps",
        temperature=2.0, device="cpu", batch_size=7, progress=False, data_paths=["data.val.path=d"],
        out="p.jsonl",
    )  # fmt: skip
    sections = PredictRequest(
        load=LoadRequest(
            data_paths=("data.val.path=d",), temperature=2.0, device="cpu", batch_size=7,
            progress=False,
        ),
        rule=RuleRequest(coverage=0.8, keep=True),
        rows=RowRequest(top_k=5, ood="energy", conformal=0.9, conformal_method="aps"),
        output=OutputRequest(out="p.jsonl"),
    )  # fmt: skip
    assert flat == sections
    assert flat.output.format == "jsonl"
    assert flat.load.loader_kw == {"batch_size": 7, "num_workers": 0, "progress": False}


def test_a_keyword_replaces_the_field_of_a_section_given_with_it() -> None:
    request = PredictRequest().replaced(rows=RowRequest(top_k=5, ood="msp"), top_k=2)
    assert request.rows == RowRequest(top_k=2, ood="msp")
    assert request.rule == RuleRequest() and request.load == LoadRequest()
    # Replacing keeps the request frozen: the original is unchanged.
    base = PredictRequest(rule=RuleRequest(threshold=0.5))
    assert base.replaced(threshold=0.7).rule.threshold == 0.7 and base.rule.threshold == 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.rule.threshold = 0.1  # type: ignore[misc]  # frozen: the assignment must fail


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"coverage": 0.9, "threshold": 0.5}, r"^give at most one of coverage, max_risk and "
         r"threshold, got \{'coverage': 0.9, 'threshold': 0.5\}$"),
        ({"confidence": 0.9}, r"^confidence certifies a max_risk: give max_risk too"),
        ({"coverage": 0.0}, r"^coverage must lie in \(0, 1\], got 0$"),
        ({"max_risk": 1.0}, r"^max_risk must lie in \[0, 1\), got 1$"),
        ({"threshold": 1.5}, r"^threshold must lie in \[0, 1\], got 1.5"),
        ({"max_risk": 0.1, "confidence": 0.2}, r"^confidence must lie in \[0.5, 1\), got 0.2"),
        ({"top_k": 0}, r"^top_k must be at least 1, got 0$"),
        ({"ood": "nope"}, r"^ood score must be one of \[.*'entropy'.*\], got 'nope'$"),
        ({"conformal": 1.2}, r"^conformal must lie in \(0, 1\], got 1.2$"),
        ({"conformal_method": "x"}, r"^conformal_method must be one of \['lac', 'aps', 'raps'\]"),
        ({"temperature": 0.0}, r"^temperature must be > 0, got 0.0$"),
        ({"temperature": math.nan}, r"^temperature must be > 0, got nan$"),
        ({"batch_size": 0}, r"^batch_size must be at least 1, got 0$"),
        ({"num_workers": -1}, r"^num_workers must be at least 0, got -1$"),
        ({"fmt": "xml"}, r"^format must be csv or jsonl, got 'xml'$"),
        ({"out": "p.txt"}, r"^cannot tell the format of --out p.txt from its extension"),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_naming_it_before_anything_loads(
    options: dict[str, object], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        PredictRequest().replaced(**options)
    with pytest.raises(ValueError, match=error):  # "no-such-run" is never looked at
        predict_images("no-such-run", ["x.png"], **options)


def test_an_unknown_option_or_a_wrong_section_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"unknown prediction option\(s\) \['topk'\]: choose from"):
        predict_images("no-such-run", ["x.png"], topk=3)
    with pytest.raises(TypeError, match=r"^rule must be a RuleRequest, got RowRequest$"):
        PredictRequest(rule=RowRequest())  # type: ignore[arg-type]  # the wrong section, on purpose


def test_an_out_folder_is_refused_before_anything_loads(tmp_path: Path) -> None:
    (tmp_path / "d.csv").mkdir()
    request = PredictRequest(output=OutputRequest(out=tmp_path / "d.csv"))
    with pytest.raises(ConfigError, match=r"d\.csv is a folder: give a file"):
        predict_images("no-such-run", ["x.png"], request=request)

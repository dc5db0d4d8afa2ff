"""`fseb-ft demo`: the page's decisions are `fseb-ft predict`'s (class, probabilities, threshold,
conformal set) plus the OOD flag; the Space it writes; the errors a user makes; and the page in
a real browser (headless Chromium driven by Selenium, where Gradio and Chromium are installed)."""

from __future__ import annotations

import ast
import runpy
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch
from PIL import Image

import fseb_ft
import fseb_ft.demo as demo_module
from fseb_ft import cli
from fseb_ft.data.sources.sklearn_digits import load_sklearn_digits
from fseb_ft.finetune import run
from fseb_ft.prediction import page_decisions
from fseb_ft.prediction.loading import load_model
from fseb_ft.prediction.page_decisions import PagePredictor, PageSettings, decision_markdown
from fseb_ft.prediction.space import write_space
from fseb_ft.recipe import recipe_from_dict
from fseb_ft.runs.rundir import read_val_logits
from tests.helpers import digits_recipe


def train_digits_run(out: Path) -> Path:
    """Three epochs of the paper's CNN on digits 0-2, temperature-scaled: about 90 % accurate on
    validation, enough for a constant grey image to stand out by its entropy."""
    run(recipe_from_dict(digits_recipe(out, epochs=3, temperature_scaling=True)))
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_digits_run(tmp_path_factory.mktemp("run") / "digits")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An in-distribution image (the first digit, a 0) and an OOD one (constant grey)."""
    root = tmp_path_factory.mktemp("images")
    digit, label = load_sklearn_digits([0, 1, 2], channels=1)[0]
    assert label == 0
    Image.fromarray(digit[:, :, 0]).save(root / "digit.png")
    Image.fromarray(np.full((8, 8), 128, np.uint8)).save(root / "grey.png")
    return {"in": root / "digit.png", "ood": root / "grey.png"}


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(["demo", *argv])
    assert stop.value.code in (1, 2)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("fseb-ft")]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def test_the_page_decides_as_predict_does_and_flags_the_grey_image(
    run_dir: Path, images: dict[str, Path]
) -> None:
    predictor = PagePredictor(run_dir, PageSettings(coverage=0.9, conformal=0.9))
    files = [images["in"], images["ood"]]
    rows = fseb_ft.predict_images(run_dir, files, coverage=0.9, conformal=0.9, progress=False).rows
    for file, row in zip(files, rows, strict=True):
        page = predictor.decide(file).row
        for key in ("prediction", "abstain", "set", "top1", "top2", "top3"):
            assert page[key] == row[key], key
        # One image a batch here, 13 there: float32 convolutions may round differently.
        for key in ("probability", "top2_probability", "entropy", "ood_entropy"):
            assert page[key] == pytest.approx(row[key], rel=1e-6, abs=1e-9), key
    digit, grey = predictor.decide(images["in"]), predictor.decide(images["ood"])
    assert digit.row["prediction"] == "0" and not digit.abstain and digit.reasons() == []
    assert "### Decision: 0 (probability" in decision_markdown(digit)
    assert grey.ood_flagged and grey.abstain
    assert any(r.startswith("out of distribution: its entropy score") for r in grey.reasons())
    assert "### Decision: abstain" in decision_markdown(grey)


def test_an_unreadable_file_is_a_message_for_the_page(run_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "broken.png").write_bytes(b"\x89PNG truncated")
    predictor = PagePredictor(run_dir, PageSettings(coverage=0.9))
    with pytest.raises(ValueError, match=r"^broken.png cannot be read as an image: "):
        predictor.decide(tmp_path / "broken.png")


def test_the_ood_flag_is_raised_by_the_validation_quantile(run_dir: Path) -> None:
    # Hand-worked: the max_logit score (minus the top logit) of [-i, -200] is i = 0, …, 100;
    # the 0.95 quantile of these 101 values is the 96th smallest, 95; the five above it
    # (96 … 100) are 4.95 % of them.
    logits = torch.stack([-torch.arange(101.0), torch.full((101,), -200.0)], dim=1)
    threshold = page_decisions._ood_threshold(logits, None, "max_logit")
    assert threshold == 95.0
    assert page_decisions._ood_threshold(logits * 2, 2.0, "max_logit") == 95.0  # at T
    # On the run: at most 5 % of its validation images are flagged, and the threshold is one.
    predictor = PagePredictor(run_dir, PageSettings(coverage=0.9))
    val_logits, _ = read_val_logits(run_dir)
    z = val_logits.double() / predictor.loaded.temperature
    entropy = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    threshold, eps = cast(float, predictor.ood_threshold), 1e-9  # float64 entropies
    assert (entropy - threshold).abs().min() < eps  # an observed score
    assert (
        (entropy > threshold + eps).sum() <= 0.05 * len(entropy) < (entropy > threshold - eps).sum()
    )


def test_settings_refuse_values_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"coverage must lie in \(0, 1\], got 2"):
        PageSettings(coverage=2.0)
    with pytest.raises(ValueError, match="at most one of coverage and max_risk"):
        PageSettings(coverage=0.9, max_risk=0.1)


def test_no_module_imports_gradio_at_its_top_level() -> None:
    # Gradio costs seconds to import: only a page being built imports it (`fseb-ft --help` and
    # `fseb-ft demo --help` do not), and fseb_ft imports without it.
    found = []
    for path in sorted((Path(__file__).parents[2] / "fseb_ft").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )  # fmt: skip
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "gradio"]
    assert found == []


def test_gradio_missing_is_one_line_saying_how_to_install(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gradio", None)  # `import gradio` raises ImportError
    line = _fails([str(run_dir), "--coverage", "0.9"], capsys)
    assert "needs Gradio" in line and "pip install 'fseb_ft[demo]'" in line


def test_a_run_without_a_kept_threshold_needs_coverage_or_max_risk(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo_module, "import_gradio", lambda: None)  # as if installed
    line = _fails([str(run_dir)], capsys)
    assert "keeps no abstention threshold: give --coverage C or --max-risk R" in line
    # A value out of range is a usage error, as predict's and export's are.
    assert "argument --coverage: must lie in (0, 1], got 2" in _fails(
        [str(run_dir), "--coverage", "2"], capsys
    )


def test_a_port_in_use_is_refused_before_the_model_loads(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo_module, "import_gradio", lambda: None)
    monkeypatch.setattr(demo_module, "PagePredictor", None)  # loading would fail: not reached
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _fails([str(run_dir), "--coverage", "0.9", "--port", str(port)], capsys)
    assert f"--port {port} on 127.0.0.1 is in use: give another --port" in line


def test_the_space_carries_the_model_and_abstains_at_its_kept_threshold(
    run_dir: Path, images: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = shutil.copytree(run_dir, tmp_path / "run")
    space = tmp_path / "space"
    line = _fails([str(copy), "--write-app", str(space)], capsys)
    assert "keeps no abstention threshold, and a Space has no validation split" in line
    assert "leave out ['--coverage']" in _fails(
        [str(copy), "--write-app", str(space), "--coverage", "0.9"], capsys
    )
    _keep_and_write_space(copy, images["in"], space)
    assert f"wrote the Space to {space}" in capsys.readouterr().out
    assert {p.name for p in space.iterdir()} == {"app.py", "requirements.txt", "README.md", "model"}
    front = (space / "README.md").read_text().split("---")[1]
    assert "\nsdk: gradio\n" in front and "\napp_file: app.py\n" in front
    requirements = (space / "requirements.txt").read_text()
    assert "\nfseb_ft[demo]==" in requirements and "\ngradio" in requirements
    compile((space / "app.py").read_text(), "app.py", "exec")
    assert (space / "model" / "reliability.png").is_file()
    # The Space's page: the run's kept threshold, no set and no flag (no validation split).
    page = PagePredictor(space / "model", PageSettings()).decide(images["ood"])
    row = fseb_ft.predict_images(copy, [images["ood"]], progress=False).rows[0]
    assert page.rule.threshold == pytest.approx(load_model(copy).kept.threshold)  # type: ignore[union-attr]
    assert (page.row["abstain"], page.row["prediction"]) == (row["abstain"], row["prediction"])
    assert page.set_coverage is None and page.ood_threshold is None and not page.ood_flagged
    assert "they need the run's validation split" in decision_markdown(page)
    with pytest.raises(fseb_ft.errors.FsebError, match="is not empty: give a new folder"):
        write_space(copy, space)


def _keep_and_write_space(run_dir: Path, image: Path, space: Path) -> None:
    """Keep a threshold with ``run_dir`` (coverage 0.8), then write its Space to ``space``."""
    cli.main(["predict", str(run_dir), str(image), "--coverage", "0.8", "--keep",
              "--no-progress"])  # fmt: skip
    cli.main(["demo", str(run_dir), "--write-app", str(space)])


def test_the_space_app_builds_its_page_on_the_model_it_carries(
    run_dir: Path, images: dict[str, Path], tmp_path: Path
) -> None:
    gradio = pytest.importorskip(
        "gradio", reason="Gradio not installed: pip install 'fseb_ft[demo]'"
    )
    space = tmp_path / "space"
    _keep_and_write_space(shutil.copytree(run_dir, tmp_path / "run"), images["in"], space)
    shutil.rmtree(tmp_path / "run")  # the Space stands alone
    app = runpy.run_path(str(space / "app.py"))  # not as __main__: builds, does not serve
    assert isinstance(app["page"], gradio.Blocks)
    assert app["MODEL"] == space / "model"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium under Selenium; the test skips, saying what is missing, without it."""
    pytest.importorskip("gradio", reason="Gradio not installed: pip install 'fseb_ft[demo]'")
    webdriver = pytest.importorskip("selenium.webdriver", reason="Selenium not installed")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("Chromium not installed: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1280,900"):  # fmt: skip
        options.add_argument(argument)
    options.binary_location = chromium
    chrome = webdriver.Chrome(options=options, service=webdriver.ChromeService(driver))
    yield chrome
    chrome.quit()


def test_a_browser_uploads_two_images_and_reads_the_decisions_off_the_page(
    run_dir: Path,
    images: dict[str, Path],
    browser: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from fseb_ft.prediction.demo_page import HOST, build_page, reliability_of

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))  # the uploads' copies
    predictor = PagePredictor(run_dir, PageSettings(coverage=0.9))
    page = build_page(predictor, reliability_of(run_dir), "fseb_ft demo: digits")
    with socket.socket() as probe:  # a free port, then Gradio takes it
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    page.launch(server_name=HOST, server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        driver, wait = browser, WebDriverWait(browser, 30)
        driver.get(f"http://{HOST}:{port}/")  # type: ignore[attr-defined]
        seen = []
        for name, expect in (("in", "Decision: 0 (probability"), ("ood", "Decision: abstain")):
            upload = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "input[type=file]"))
            upload.send_keys(str(images[name]))
            wait.until(lambda d, e=expect: e in d.find_element(By.ID, "decision").text)
            seen.append(driver.find_element(By.ID, "decision").text)  # type: ignore[attr-defined]
        reliability = driver.find_elements(By.CSS_SELECTOR, "img[src*='reliability']")  # type: ignore[attr-defined]
    finally:
        page.close()
    assert "out of distribution: its entropy score" not in seen[0]
    assert "out of distribution: its entropy score" in seen[1]
    assert reliability, "the run's reliability diagram is on the page"


def test_the_command_serves_on_this_machine_and_says_where(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("gradio", reason="Gradio not installed: pip install 'fseb_ft[demo]'")
    from fseb_ft.prediction import demo_page

    pages = []

    def built(*args: object) -> object:  # the page, serving without blocking the test
        page = demo_page.build_page(*args)  # type: ignore[arg-type]
        monkeypatch.setattr(page, "block_thread", lambda: None)
        pages.append(page)
        return page

    monkeypatch.setattr(demo_module, "build_page", built)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        cli.main(["demo", str(run_dir), "--coverage", "0.9", "--port", str(port)])
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it listens
    finally:
        pages[0].close()
    assert capsys.readouterr().out.splitlines()[0] == (  # then Gradio's closing line
        f"the demo page is at http://127.0.0.1:{port}/ (Ctrl-C stops it; --share adds a public "
        "link)"
    )

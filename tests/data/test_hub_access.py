"""Without the network a Hub dataset or ``hf-hub:`` model fails at once, in one line that says
how to work offline, instead of after huggingface_hub's ~23 s of retries. Nothing contacts
huggingface.co: the Hub is a closed port on this machine, or ``HF_HUB_OFFLINE``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import huggingface_hub
import pytest

from fseb_ft.data.sources.hub import HubDatasetError, load_hub

ROOT = Path(__file__).parents[2]

# Each load against a Hub that refuses connections, with the waits of any retry recorded instead
# of slept: "at once" is no back-off at all, which a wall clock on a loaded machine cannot tell.
_SCRIPT = """
import json, time
from fseb_ft.data.sources.hub import load_hub
from fseb_ft.prediction.loading import load_model
out = {}
for name, load in (("dataset", lambda: load_hub("someone/data", "train")),
                   ("model", lambda: load_model("hf-hub:someone/model"))):
    waits = []
    time.sleep = waits.append
    try:
        load()
    except Exception as err:
        out[name] = [waits, type(err).__name__, str(err)]
print(json.dumps(out))
"""


def test_an_unreachable_hub_fails_at_once_and_says_how_to_work_offline(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "HF_ENDPOINT": "http://127.0.0.1:9",  # the discard port: nothing listens, refused at once
        "HF_HOME": str(tmp_path / "hf"),  # an empty cache
        "PYTHONPATH": str(ROOT),
    }
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    waits, kind, message = out["dataset"]
    assert waits == [] and kind == "HubDatasetError", out
    assert "the Hub did not answer and it is not in the local cache" in message
    assert "HF_HUB_OFFLINE=1" in message and "save_to_disk" in message
    waits, kind, message = out["model"]
    assert waits == [] and kind == "ModelLoadError", out
    assert "HF_HUB_OFFLINE=1" in message and "local model folder" in message
    assert "Retrying in" not in done.stderr


def test_with_hf_hub_offline_nothing_is_asked_and_the_error_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)

    def no_request(*args: object, **kwargs: object) -> None:
        raise AssertionError("a request was made with HF_HUB_OFFLINE set")

    monkeypatch.setattr(huggingface_hub, "get_session", no_request)
    with pytest.raises(HubDatasetError) as err:
        load_hub("fseb-ft/no-such-dataset", "train", cache_dir=tmp_path)
    message = str(err.value)
    assert message.startswith("Hub dataset 'fseb-ft/no-such-dataset': HF_HUB_OFFLINE is set")
    assert "{source: disk, path: DIR}" in message

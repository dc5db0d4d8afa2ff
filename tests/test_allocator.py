"""The glibc allocator tuning applies once on Linux and can be switched off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fseb_ft.allocator import DISABLE_ENV, keep_freed_memory

CHECK = "from fseb_ft.allocator import keep_freed_memory; print(keep_freed_memory())"


def _run(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc-only")
def test_applies_on_glibc_and_is_idempotent() -> None:
    env = {k: v for k, v in os.environ.items() if k != DISABLE_ENV}
    assert _run(env) == "True"
    assert keep_freed_memory() is keep_freed_memory()


def test_environment_variable_disables_it() -> None:
    assert _run({**os.environ, DISABLE_ENV: "1"}) == "False"

"""glibc allocator tuning: applied once on Linux, undone in forked workers, can be disabled."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fseb_ft.engine.allocator import DISABLE_ENV, keep_freed_memory

CHECK = "from fseb_ft.engine.allocator import keep_freed_memory; print(keep_freed_memory())"


def _run(env: dict[str, str], code: str = CHECK) -> str:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc-only")
def test_applies_on_glibc_and_is_idempotent() -> None:
    env = {k: v for k, v in os.environ.items() if k != DISABLE_ENV}
    assert _run(env) == "True"
    assert keep_freed_memory() is keep_freed_memory()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc-only")
def test_it_applies_without_a_line_at_every_start() -> None:
    env = {k: v for k, v in os.environ.items() if k != DISABLE_ENV}
    code = f"from fseb_ft.logs import configure_logging; configure_logging(); {CHECK}"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert (out.returncode, out.stdout, out.stderr) == (0, "True\n", "")


def test_environment_variable_disables_it() -> None:
    assert _run({**os.environ, DISABLE_ENV: "1"}) == "False"


# The parent grows its heap by 64 MiB past its base and frees it (glibc keeps it); then a
# DataLoader worker, forked from that heap as fseb_ft's loaders fork, reports how much heap it
# maps and whether a freed 128 MiB block (larger than any free chunk) stays resident.
WORKER_CHECK = """
import ctypes, json, os
import torch
from fseb_ft.engine.allocator import keep_freed_memory
from fseb_ft.data.loaders import make_loader

MIB = 2**20
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)

def heap_mib():
    lines = open("/proc/self/smaps").read().split("\\n")
    i = next(i for i, line in enumerate(lines) if line.endswith("[heap]"))
    return int(next(l for l in lines[i:] if l.startswith("Rss:")).split()[1]) // 1024

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // MIB

def keeps(n=128 * MIB):
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    before = rss_mib()
    libc.free(p)
    return before - rss_mib() < n // MIB // 2

def state():
    return {"heap_mib": heap_mib(), "keeps": keeps()}

class Probe(torch.utils.data.Dataset):
    def __len__(self):
        return 1
    def __getitem__(self, i):
        return state()

assert keep_freed_memory()
base = heap_mib()
grown = libc.malloc(64 * MIB)
ctypes.memset(grown, 1, 64 * MIB)
libc.free(grown)
worker = next(iter(make_loader(Probe(), 1, False, num_workers=1)))
worker = {k: v.item() for k, v in worker.items()}
print(json.dumps({"base_heap_mib": base, "parent": state(), "worker": worker}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc-only")
def test_forked_loader_workers_get_defaults_and_drop_the_inherited_heap() -> None:
    env = {k: v for k, v in os.environ.items() if k != DISABLE_ENV}
    out = json.loads(_run(env, WORKER_CHECK))
    base = out["base_heap_mib"]
    assert out["parent"]["heap_mib"] >= base + 48 and out["parent"]["keeps"]
    # Pages the parent freed but kept are not the worker's: they would be copied when the parent
    # reuses them (issue 15: each worker held a copy of the parent's peak).
    assert out["worker"]["heap_mib"] < base + 32
    assert not out["worker"]["keeps"]

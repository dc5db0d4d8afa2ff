"""The loaders' worker processes (fseb_ft.data.loaders): a one-pass loader's end with its
pass; a persistent loader's live between passes until ``close_workers``, which also reaches a
loader Accelerate prepared (torch has no public call for it: this pins the use of its
``_iterator`` to the installed torch)."""

from __future__ import annotations

import multiprocessing
from multiprocessing.process import BaseProcess

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from fseb_ft.data.loaders import close_workers, make_loader


def _loader(persistent: bool) -> DataLoader:
    """Twelve numbered rows in batches of 4, read by two workers."""
    data = TensorDataset(torch.arange(12.0).view(12, 1), torch.arange(12))
    return make_loader(data, 4, shuffle=False, num_workers=2, persistent=persistent)


def _started_since(before: set[BaseProcess]) -> set[BaseProcess]:
    """This process's children alive now that were not before (other tests' may end meanwhile)."""
    return set(multiprocessing.active_children()) - before


def test_a_one_pass_loaders_workers_end_with_its_pass() -> None:
    before = set(multiprocessing.active_children())
    rows = torch.cat([x for x, _ in _loader(persistent=False)])
    assert rows.flatten().tolist() == list(range(12))
    assert not _started_since(before)


def test_close_workers_ends_a_persistent_loaders_workers_and_it_reads_again() -> None:
    before = set(multiprocessing.active_children())
    loader = _loader(persistent=True)
    prepared = Accelerator(cpu=True).prepare(_loader(persistent=True))
    first = [torch.cat([x for x, _ in each]) for each in (loader, prepared)]
    assert len(_started_since(before)) == 4  # each keeps its two workers between passes
    close_workers(loader, prepared)
    assert not _started_since(before)
    again = [torch.cat([x for x, _ in each]) for each in (loader, prepared)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    close_workers(loader, prepared, _loader(persistent=True))  # a never-read loader: nothing
    assert not _started_since(before)

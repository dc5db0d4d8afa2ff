"""Reaching the Hugging Face Hub without waiting on a network that is not there.

huggingface_hub retries a file it can neither reach nor find cached five times, backing off for
about 23 s (``Retrying in 8s``), before it fails. :func:`hub_or_cache` asks the Hub once, without
retries: when it does not answer, the libraries read their caches only, as with
``HF_HUB_OFFLINE=1``, at once. :func:`offline_hint` says how to work offline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import huggingface_hub

__all__ = ["hub_or_cache", "hub_unreachable", "offline", "offline_hint"]


def offline_hint(local: str) -> str:
    """How to work offline, for the error of a Hub model or dataset that cannot be loaded;
    ``local`` is the local copy that stands for it ("give a local model folder …")."""
    return (
        "to work offline, set HF_HUB_OFFLINE=1 with it in the Hugging Face cache (fetched once "
        f"with the network), or {local}"
    )


def offline() -> bool:
    """Whether the user set ``HF_HUB_OFFLINE`` (the libraries then never try the network)."""
    return bool(huggingface_hub.constants.HF_HUB_OFFLINE)


def hub_unreachable() -> Exception | None:
    """Why the Hub does not answer one request (no retries); ``None`` when it answers, or when
    ``HF_HUB_OFFLINE`` is set (nothing is asked)."""
    constants = huggingface_hub.constants
    if offline():
        return None
    try:
        huggingface_hub.get_session().head(
            constants.ENDPOINT, timeout=constants.HF_HUB_ETAG_TIMEOUT
        )
    except Exception as err:  # requests' or httpx's errors, by huggingface_hub's version
        return err
    return None


@contextlib.contextmanager
def hub_or_cache() -> Iterator[Exception | None]:
    """Run the block against the Hub when it answers, else against the caches only (as with
    ``HF_HUB_OFFLINE=1``, for huggingface_hub and datasets alike); yields why it did not answer
    (``None`` when it did, or when ``HF_HUB_OFFLINE`` was set)."""
    unreachable = hub_unreachable()
    if unreachable is None:
        yield None
        return
    from datasets import config  # only here: predicting a model folder needs no datasets

    constants = huggingface_hub.constants
    saved = constants.HF_HUB_OFFLINE, config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = config.HF_HUB_OFFLINE = True
    try:
        yield unreachable
    finally:
        constants.HF_HUB_OFFLINE, config.HF_HUB_OFFLINE = saved

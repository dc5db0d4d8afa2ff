"""The devices a network can run on here, and a device a user names checked against them.

``torch.device("mps")`` or ``torch.device("cuda:3")`` parse on any machine and fail only at the
first tensor moved there, deep in a forward pass; a user's ``--device`` is checked at once.
"""

from __future__ import annotations

import torch

from fseb_ft.errors import FsebError

__all__ = ["DeviceError", "available_devices", "resolve_device"]


class DeviceError(FsebError, ValueError):
    """A device that is not a device, or not on this machine."""


def available_devices() -> list[str]:
    """The devices of this machine: ``cpu``, each CUDA device (``cuda:0`` …), ``mps``."""
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = ["mps"] if torch.backends.mps.is_available() else []
    return ["cpu", *cuda, *mps]


def resolve_device(name: str | None) -> torch.device:
    """The device ``name`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``); ``None``: CUDA when there is
    one, else the CPU.

    Raises:
        DeviceError: ``name`` is not a device, or this machine has none of it; the message
            lists the ones it has.
    """
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:  # torch's own message lists every device type it knows
        device = None
    available = available_devices()
    if device is not None and (device.type == "cpu" or _here(device) in available):
        return device
    what = "is not a device" if device is None else "is not on this machine"
    raise DeviceError(f"device {name!r} {what}; available here: {', '.join(available)}")


def _here(device: torch.device) -> str:
    """``device`` as :func:`available_devices` names it (``cuda`` is ``cuda:0``)."""
    if device.type == "mps":
        return "mps" if device.index in (None, 0) else str(device)
    return f"{device.type}:{device.index or 0}"

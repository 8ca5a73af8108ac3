"""Backend names and availability checks, as torch.distributed spells them."""

from __future__ import annotations

import importlib.util

from .. import arrays, channels
from ..errors import ConfigError


class Backend(str):
    """A backend's name: any registered channel, or "gloo" (torch's CPU backend, run as tcp)."""

    TCP, SHM, GLOO, MPI, NCCL = "tcp", "shm", "gloo", "mpi", "nccl"

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise TypeError(f"Backend: name must be a str (got {type(name).__name__})")
        lowered = name.lower()
        if lowered != cls.GLOO and lowered not in channels.known():
            raise ConfigError(f"Backend: unknown backend {name!r} (known: "
                              f"{', '.join([cls.GLOO, *channels.known()])})")
        return super().__new__(cls, lowered)


def _registered(name: str) -> bool:
    return name in channels.known()


def is_gloo_available() -> bool:
    """True: gloo programs run over the tcp channel."""
    return _registered(Backend.TCP)


def is_nccl_available() -> bool:
    """Whether the "nccl" channel can run here: registered, CuPy's NCCL bindings load (or the
    fake's, under MWRT_FAKE_GPUS), and this process sees a GPU."""
    if not _registered(Backend.NCCL):
        return False
    from ..channels.nccl import nccl_module

    try:
        nccl_module()
    except ImportError:
        return False
    return arrays.device_count() > 0


def is_mpi_available() -> bool:
    """Whether the "mpi" channel can run here: registered, and mpi4py installed (looked up
    without importing it, which would initialize MPI)."""
    return _registered(Backend.MPI) and importlib.util.find_spec("mpi4py") is not None

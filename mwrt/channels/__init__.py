"""The data-channel registry: built-in channels by name, plus entry points `mwrt.channels`."""

from __future__ import annotations

import importlib

from ..errors import ConfigError
from .base import DataChannel, Work

# name -> class, or "module:Class" imported on first use (keeps optional deps lazy).
_REGISTRY: dict[str, type[DataChannel] | str] = {
    "inproc": "mwrt.channels.inproc:InprocChannel",
    "tcp": "mwrt.channels.tcp:TcpChannel",
    "shm": "mwrt.channels.shm:ShmChannel",
    "auto": "mwrt.channels.auto:AutoChannel",
    "mpi": "mwrt.channels.mpi:MpiChannel",
    "nccl": "mwrt.channels.nccl:NcclChannel",
}
_entry_points_loaded = False


def register(name: str, cls) -> None:
    """Make channel class `cls` (a DataChannel subclass) available as `name`."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"channel name: expected a non-empty str (got {name!r})")
    _REGISTRY[name] = _checked(name, cls)


# What the contract offers; a class that is not a DataChannel is told which it lacks.
_CONTRACT = ("send", "recv", "isend", "irecv", "recv_message", "close", "leave", "gone",
             "shares_host", "buffered_sends", "any_size_recv", "posted_receives",
             "eager_bytes", "device_buffers", "native_collectives")


def _checked(name: str, cls) -> type[DataChannel]:
    """`cls` if it is a concrete DataChannel subclass, else a TypeError naming what it lacks."""
    if not isinstance(cls, type):
        raise TypeError(f"channel {name!r}: expected a DataChannel subclass (got "
                        f"{type(cls).__name__} {cls!r}); register the class, not an instance")
    if not issubclass(cls, DataChannel):
        lacks = [m for m in _CONTRACT if m not in dir(cls)]
        raise TypeError(f"channel {name!r}: {cls.__name__} is not a DataChannel subclass (it "
                        f"lacks {', '.join(lacks) or 'the base class'}); derive it from "
                        "mwrt.channels.DataChannel, which declares every capability's default, "
                        "and implement _send and _recv")
    missing = sorted(cls.__abstractmethods__)
    if missing:
        raise TypeError(f"channel {name!r}: {cls.__name__} does not implement "
                        f"{', '.join(missing)} (got an abstract class); define them")
    return cls


def known() -> list[str]:
    """Names of every registered channel."""
    _load_entry_points()
    return sorted(_REGISTRY)


def get(name: str) -> type[DataChannel]:
    """Return the channel class registered as `name`; a miss lists the known names."""
    if name not in _REGISTRY:  # a plugin's: the scan of every installed package (~0.1 s of
        _load_entry_points()  # each daemon's first Join) never runs for the built-in ones
    try:
        entry = _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"channel: unknown channel {name!r} (known: {', '.join(sorted(_REGISTRY))}); "
            "register one with mwrt.channels.register(name, cls)"
        ) from None
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = _checked(name, getattr(importlib.import_module(module), attr))
        _REGISTRY[name] = entry
    return entry


def create(name: str, rank: int, world_size: int, **kwargs) -> DataChannel:
    """Construct the channel `name` for `rank` of `world_size` (kwargs: store, prefix, key,
    timeout)."""
    return get(name)(rank, world_size, **kwargs)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="mwrt.channels"):
        _REGISTRY.setdefault(ep.name, f"{ep.module}:{ep.attr}")


__all__ = ["DataChannel", "Work", "register", "get", "create", "known"]

"""Native collectives: a channel's own implementation of some collectives, found by name.

A channel declares `native_collectives` (mwrt.channels.DataChannel): the name under
which its implementation is registered here, or the class itself. Each process group
makes one instance for itself, and offers it every collective of a kind it lists in
`kinds`, count 0 included, so ranks that disagree on the count still meet in the same
place. `run(kind, call, *args)` takes the per-call object (mwrt.collective.group: its
sequence number, descriptor and check) and the generic algorithm's arguments, e.g.
`run("all_reduce", call, arr, op)`; it returns False to decline (an op or dtype it cannot
do: then the generic algorithm runs, so every rank must decline alike), True when done.

Ranks have agreed on the call before `run` unless the class says `checks_calls = True`:
then it carries the check itself, taking this rank's descriptor with `call.take_check()`
(after any decision to decline) and comparing every rank's with `call.check(every)`.
"""

from __future__ import annotations

import importlib

from ..errors import ConfigError

_REGISTRY: dict[str, object] = {"cma": "mwrt.collective.cma_ops:CmaCollectives",
                                 "mpi": "mwrt.collective.mpi_ops:MpiCollectives",
                                 "nccl": "mwrt.collective.nccl_ops:NcclCollectives"}


class NativeCollectives:
    """One group's native collectives over its channel (override `run`, declare `kinds`)."""

    kinds: frozenset = frozenset()  # the collectives it may run: all_reduce, barrier, …
    checks_calls = False  # True: run() carries the agreement check itself
    # True: calls must reach run() in sequence order even when threads race on one group
    # (state shared by every call of the group); each then waits for the ones before it.
    in_order = False

    def __init__(self, channel, group):
        self.channel, self.group = channel, group

    def run(self, kind: str, call, *args) -> bool:
        """Run collective `kind` with the generic algorithm's arguments; False declines."""
        raise NotImplementedError(f"{type(self).__name__}: declares kinds {sorted(self.kinds)} "
                                  "but does not define run()")


def register(name: str, cls) -> None:
    """Make `cls` (a NativeCollectives subclass) what channels declaring `name` use."""
    if not (isinstance(cls, type) and issubclass(cls, NativeCollectives)):
        raise TypeError(f"native collectives {name!r}: expected a NativeCollectives subclass "
                        f"(got {cls!r}); derive it from mwrt.collective.native.NativeCollectives")
    _REGISTRY[name] = cls


def for_group(channel, group) -> NativeCollectives | None:
    """The native collectives `channel` declares, made for `group`; None if it declares none."""
    entry = type(channel).native_collectives
    if entry is None:
        return None
    if isinstance(entry, str):
        found = _REGISTRY.get(entry)
        if found is None:
            raise ConfigError(f"{channel.name} channel: unknown native collectives {entry!r} "
                              f"(known: {', '.join(sorted(_REGISTRY))}); register them with "
                              "mwrt.collective.native.register(name, cls)")
        if isinstance(found, str):
            module, _, attr = found.partition(":")
            found = _REGISTRY[entry] = getattr(importlib.import_module(module), attr)
        entry = found
    if not (isinstance(entry, type) and issubclass(entry, NativeCollectives)):
        raise TypeError(f"{channel.name} channel: native_collectives must name a "
                        f"NativeCollectives subclass (got {entry!r})")
    return entry(channel, group)


__all__ = ["NativeCollectives", "for_group", "register"]

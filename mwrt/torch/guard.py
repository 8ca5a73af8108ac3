"""Keeping the ranks of a torch group in step when one of its collectives fails.

Ranks pair their collectives by order. A rank whose call fails before it takes part (a
tensor it cannot pass, a bad argument) would leave its peers waiting in that call, and its
next call would pair with their previous one: values from the wrong collective, returned as
if right. So a rank that fails before taking part runs a barrier in the call's place, in
order on the group's thread, which its peers' agreement check refuses at once; and from
the first failed collective on, by either way, the group runs no collective on this rank:
each raises, naming the first failure. Every rank of the call raises (the barrier, the
agreement check or a timeout tells the others), so no later collective returns a value on
any rank. Point-to-point is not collective and goes on.
"""

from __future__ import annotations

import functools
from concurrent.futures import wait

import torch

from ..collective import api as C
from ..errors import ChannelError


class Guard:
    """The first collective that failed on one rank of a group, and what follows from it."""

    __slots__ = ("failed", "group", "stand_in")

    def __init__(self, group):
        self.group, self.failed = group, ""
        self.stand_in = None  # the barrier run in a failed call's place, once started

    def check(self, what: str) -> None:
        """Raise if an earlier collective of the group failed on this rank."""
        if self.failed:
            g = self.group
            raise ChannelError(
                f"{what} on {g.name}, rank {g.ranks[g.rank]}: an earlier collective of this "
                f"group failed ({self.failed}), so its ranks may be out of step and none runs "
                "on it again; destroy the process group and init a new one (or make a new "
                "group with dist.new_group)")

    def note(self, what: str, exc: BaseException, took_part: bool) -> None:
        """A collective failed here; where it failed before taking part, stand in for it."""
        if self.failed:
            return
        self.failed = f"{what}: {type(exc).__name__}: {exc}"[:200]
        if not took_part:
            self.stand_in = self.group.call(_stand_in, self.group, async_op=True)

    def settle(self) -> None:
        """Wait (up to the group's timeout) for the stand-in barrier: closing the group
        before it ran would leave the peers waiting in the failed call."""
        if self.stand_in is not None:
            wait([self.stand_in], self.group.timeout)

    def run(self, what: str, fn):
        """fn(group) for the group's thread: refused after a failure, and noted on one."""
        def run(g):
            self.check(what)
            before = getattr(g, "current", None)
            try:
                with torch.no_grad():  # outputs may be leaves that require grad (parameters)
                    return fn(g)
            except BaseException as exc:
                # No collective of this call began: its peers wait in it for this rank.
                self.note(what, exc, took_part=getattr(g, "current", None) is not before)
                raise
        return run


def _stand_in(group) -> None:
    """A barrier in the failed call's place: the peers' agreement check refuses it at once."""
    try:
        C.barrier(group)
    except Exception:  # noqa: BLE001, S110 - the mismatch it provokes is the point; the
        pass  # caller raises its own error


def collective(what: str):
    """A torch ProcessGroup method that issues a collective: refused after a failure on this
    rank; its argument checks run without autograd, and a failing one stands in a barrier."""
    def wrap(method):
        @functools.wraps(method)
        def issue(self, *args, **kwargs):
            guard = self.guard
            guard.check(what)
            try:
                with torch.no_grad():
                    return method(self, *args, **kwargs)
            except Exception as exc:
                guard.note(what, exc, took_part=False)
                raise
        return issue
    return wrap


__all__ = ["Guard", "collective"]

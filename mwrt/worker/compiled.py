"""A graph's commands for one stream, prepared once so a replay runs them without decoding.

A replay of a 100-op step would otherwise pay, per op, the registry lookup, the walk of its
arguments and the handler's dispatch: more than NumPy's own call on small arrays. Prepared
steps look the op up once, know where the tensor references sit in the arguments, and for
an in-place ufunc call it directly. Whatever goes wrong in a step is reported exactly as the
generic path reports it: a missing or poisoned input is re-run through that path (it fails
before doing anything), any other failure becomes the stream's error for that command.
"""

from __future__ import annotations

import functools

from .. import ops
from ..protocol import wire
from . import calls
from .tensors import Poisoned, ref_ids


class Prepared:
    """One stream's share of a replay: its commands, and a step per command."""

    __slots__ = ("commands", "steps", "computes_only")

    def __init__(self, commands: list):
        self.commands = commands
        # Nothing in it waits on another stream or node: it may run in one turn at a slot.
        self.computes_only = all(type(c) in _COMPUTES for c in commands)
        self.steps: list | None = None  # made on the stream's thread, with its namespace

    def run(self, ex) -> None:
        """Run every step on executor `ex`, as its generic loop would."""
        steps = self.steps
        if steps is None:
            steps = self.steps = [_step(command, ex.xp) for command in self.commands]
        if ex.error is not None or ex.session.trace is not None:
            for command in self.commands:  # poisoning and timelines: the generic path
                ex.execute_safely(command, ())
            return
        ex.ops += len(steps)  # for `mwrt status`; a rare failure's poisoned rest too
        tensors, start = ex.session.tensors, 0
        while start < len(steps):
            start = self._run_from(ex, steps, tensors, start)

    def _run_from(self, ex, steps: list, tensors, start: int) -> int:
        """Run steps from `start` until one fails; the index after the failed one, or the end."""
        i = start
        try:
            for i in range(start, len(steps)):
                if ex.stopped:
                    return len(steps)
                steps[i](ex, tensors)
        except Exception as exc:  # noqa: BLE001 - the op's error, as the generic path reports it
            command = self.commands[i]
            if type(exc) is _Failed:
                pass  # the generic path already made its failure the stream's error
            elif _inputs_missing(command, tensors):
                ex.execute_safely(command, ())  # fails in resolve(), before any effect
            else:
                ex.fail(command, ex.describe(command, exc))
            if ex.error is not None:  # the rest is poisoned, as after any failure
                for command in self.commands[i + 1:]:
                    ex.execute_safely(command, ())
                return len(steps)
            return i + 1
        return len(steps)


_COMPUTES = (wire.Call, wire.Remote, wire.Create, wire.Put, wire.Free, wire.Record)


class _Failed(Exception):
    """A command run by the generic path failed: the steps after it must not run."""


def _step(command, xp):
    """The fastest faithful way to run `command`."""
    if type(command) is not wire.Call:
        return functools.partial(_generic, command)
    op = ops.get(command.op)
    ufunc = getattr(op.impl, "ufunc", None)
    args = command.args
    if op.inplace and ufunc and not command.kwargs and args and type(args[0]) is wire.Ref \
            and not any(type(a) in (tuple, dict) for a in args):
        return _inplace_ufunc(getattr(xp, ufunc), args)
    return functools.partial(_call, op, command)


def _call(op, command, ex, tensors) -> None:
    """Any other op: the registry lookup done once, the rest as calls.call does it."""
    calls.run_op(ex, op, command)


def _generic(command, ex, tensors) -> None:
    ex.execute(command, ())
    if ex.error is not None:
        raise _Failed


def _inplace_ufunc(ufunc, args: tuple):
    """ufunc(target, *args, out=target): the body of `x.add_(1.0)` and its kind."""
    target = args[0].id
    if len(args) == 2 and type(args[1]) is not wire.Ref:
        operand = args[1]

        def scalar_step(ex, tensors):
            t = tensors[target]
            ufunc(t, operand, out=t)
        return scalar_step
    refs = [(i, a.id) for i, a in enumerate(args) if type(a) is wire.Ref]
    template = list(args)

    def step(ex, tensors):
        values = template.copy()
        for i, tid in refs:
            values[i] = tensors[tid]
        ufunc(*values, out=values[0])
    return step


def _inputs_missing(command, tensors) -> bool:
    """True if a tensor `command` reads is not in the table, or was poisoned."""
    return any(tid not in tensors or type(tensors[tid]) is Poisoned
               for tid in ref_ids((getattr(command, "args", ()), getattr(command, "kwargs", {}))))

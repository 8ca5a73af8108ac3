"""Safe streams: a use of a tensor on another stream is ordered after its earlier uses.

The master knows, for every tensor, the stream that last wrote it (`_writer`, at command id
`_wtime`), the streams that used it (`_streams`) and the id of its last use (`_ltime`).
A read on stream S of a tensor written on W waits for W (read after write); a write on S
waits for every other stream that used it (write after read or write). The wait is an
implicit event: a Record on W and a WaitEvent on S, both on the tensor's worker, so the
master never blocks. Frees already wait for every stream that used the tensor.

Per (node, S, W), the id of the last ordering is kept, so a stream that already waited for
W past a tensor's use issues nothing more: a program on one stream pays one comparison per
operand. With MWRT_STREAM_ORDER=manual (or Stream(order="manual")) uses are not ordered, as
in CUDA; a use the master cannot see ordered by an event is checked on the worker instead,
so a tensor not made yet is a named error, not a missing-key error.
"""

from __future__ import annotations

import itertools
import weakref

from .. import config
from ..protocol import wire

_IMPLICIT = itertools.count(wire.IMPLICIT_EVENTS, -1)  # never the user's nor checkpoints
_ORDERED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # node -> {(S, W): id}
MANUAL: set = set()  # ids of streams made with order="manual"
capture: list = []  # the graph being captured, if any (see graph.py)


def use(tensor, stream: int, now: int, write: bool = False) -> None:
    """Order the use of `tensor` on `stream` by command `now` after its uses elsewhere."""
    if capture:  # before the fields change: a graph restores what it found
        capture[-1].used(tensor, stream, write)
    if write:  # after every other stream's last use (the writer is among _streams)
        for other in tensor._streams:
            if other != stream:
                _after(tensor, stream, other, tensor._ltime)
        tensor._writer, tensor._wtime = stream, now
    elif tensor._writer != stream:
        _after(tensor, stream, tensor._writer, tensor._wtime)
    if stream not in tensor._streams:
        tensor._streams = tensor._streams + (stream,)
    tensor._ltime = now


def note(node, target: int, source: int, upto: int) -> None:
    """Stream `target` waits for what `source` was issued before command `upto` (an event)."""
    done = _ordered(node)
    if done.get((target, source), 0) < upto:
        done[(target, source)] = upto


def snapshot(node) -> dict:
    """The orderings known on `node` (a graph restores them: captured waits have not run)."""
    return dict(_ordered(node))


def restore(node, saved: dict) -> None:
    _ORDERED[node] = saved


def is_manual(stream: int) -> bool:
    """True when uses on `stream` follow CUDA's manual rule."""
    return stream in MANUAL or config.get("stream_order") == "manual"


def _ordered(node) -> dict:
    done = _ORDERED.get(node)
    if done is None:
        done = _ORDERED[node] = {}
    return done


def _after(tensor, target: int, source: int, upto: int) -> None:
    """Make `target` wait for `source` up to command `upto`, unless it already does."""
    node = tensor._node
    done = _ordered(node)
    if done.get((target, source), 0) >= upto:
        return
    if is_manual(target):
        node.issue(wire.Expect(id=next(node.ids), stream=target, ref=tensor._id,
                               made_on=source))
        return
    event = next(_IMPLICIT)
    record = wire.Record(id=next(node.ids), stream=source, event=event, timing=False)
    node.issue(record)
    node.issue(wire.WaitEvent(id=next(node.ids), stream=target, event=event))
    done[(target, source)] = record.id

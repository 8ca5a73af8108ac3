"""Safe streams: a use of a tensor on another stream is ordered after its earlier uses.

Ordering is kept per storage. The master knows, for every storage, the stream that last
wrote it (`_writer`, at command id `_wtime`), the streams that used it (`_streams`) and the
id of its last use (`_ltime`): fields of the handle that owns it, which a view points to
(`_base`, as NumPy's ndarray.base), so a write through any view is ordered against every
later use of the base and of its other views. This module owns the record: the master's
other modules read and change it through its functions (order, use, writer, state, ...).
An op whose result may be a view (VIEWS, VIEW_PATHS) shares its operand's record (`share`);
`out=` is a write (issue.py).
A read on stream S of a storage written on W waits for W (read after write); a write on S
waits for every other stream that used it (write after read or write). A view is also
used only after it was made: its own `_writer` and `_wtime` name the stream and command
that made it. The wait is an implicit event: a Record on W and a WaitEvent on S, both on
the tensor's worker, so the master never blocks. Frees wait for every stream that used
the storage.

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
_ORDERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # node -> {(S, W): id}
MANUAL: set = set()  # ids of streams made with order="manual"
capture: list = []  # the graph being captured, if any (see graph.py)


# Registry ops whose result may be a view of their first argument. A copy one of them makes
# (ravel of a transpose) is ordered as a view too: that costs a wait at most, never a value,
# and keeps the base's handle, so its worker memory, while the copy lives.
VIEWS = frozenset({"getitem", "reshape", "transpose", "swapaxes", "squeeze", "expand_dims",
                   "ravel", "moveaxis", "broadcast_to", "flip", "atleast_1d", "atleast_2d",
                   "diagonal", "ascontiguousarray", "real", "imag"})
# NumPy functions (the `numpy` op, by path) whose results may view their first tensor
# argument; those of EACH_PATHS view the tensor argument in the same position.
VIEW_PATHS = frozenset({
    "reshape", "transpose", "swapaxes", "squeeze", "expand_dims", "ravel", "moveaxis",
    "rollaxis", "broadcast_to", "flip", "fliplr", "flipud", "rot90", "atleast_1d",
    "atleast_2d", "atleast_3d", "diagonal", "diag", "ascontiguousarray", "asfortranarray",
    "asarray", "asanyarray", "asarray_chkfinite", "require", "real", "imag", "real_if_close",
    "split", "array_split", "hsplit", "vsplit", "dsplit", "unstack", "matrix_transpose",
    "permute_dims", "trim_zeros", "einsum", "nan_to_num", "linalg.matrix_transpose",
    "lib.stride_tricks.as_strided", "lib.stride_tricks.sliding_window_view"})
EACH_PATHS = frozenset({"broadcast_arrays", "meshgrid"})


def record(tensor):
    """The handle that keeps the record of `tensor`'s storage: its base, or itself."""
    base = tensor._base
    return tensor if base is None else base


def writer(tensor) -> int:
    """The stream that last wrote `tensor`'s storage."""
    return record(tensor)._writer


def made_on(tensor) -> int:
    """The stream that made `tensor` (for a view: that made the view, not its storage)."""
    return tensor._writer


def last_use(tensor) -> int:
    """The id of the last command that used `tensor`'s storage."""
    return record(tensor)._ltime


def keep_for(tensor, stream: int) -> None:
    """`tensor`'s storage is freed only after `stream` has run what was issued so far."""
    owner = record(tensor)
    if stream not in owner._streams:
        owner._streams = owner._streams + (stream,)


def state(tensor) -> tuple:
    """The record of `tensor`'s storage, as restore_state takes it back (a graph capture
    leaves it as it found it: the captured commands have not run)."""
    owner = record(tensor)
    return owner._writer, owner._wtime, owner._ltime, owner._streams


def restore_state(tensor, saved: tuple) -> None:
    owner = record(tensor)
    owner._writer, owner._wtime, owner._ltime, owner._streams = saved


def replayed(owner, now: int, rid: int) -> None:
    """A graph's replay `rid` (issued as command `now`) used the storage `owner` records:
    its last use is the replay's, and so is its last write if `now` wrote it."""
    owner._ltime = rid
    if owner._wtime == now:
        owner._wtime = rid


def remade(tensor, rid: int) -> None:
    """A graph's replay `rid` made `tensor` again: its making is that command's."""
    tensor._wtime = tensor._ltime = rid  # (a view's _ltime is never read)


def share(result, source) -> None:
    """`result` may view `source`'s storage: from now on they share one record."""
    result._base = record(source)
    if capture:
        capture[-1].shared(result, source)


def order(tensors, stream: int, now: int, write: bool = False, written=None) -> None:
    """Order the uses of `tensors` on `stream` by command `now` (writes if `write`, or the one
    that is `written`): the rule every issuing path follows. A tensor whose storage was last
    written on `stream` (its views made there too) costs a few comparisons; another is
    ordered by use()."""
    capturing = capture
    for tensor in tensors:
        wrote = write or tensor is written
        owner = tensor._base
        if owner is None:
            owner = tensor
        elif tensor._writer != stream:  # a view made on another stream: after its making
            use(tensor, stream, now, wrote)
            continue
        if owner._writer != stream or capturing or (wrote and len(owner._streams) > 1):
            use(tensor, stream, now, wrote)
        elif wrote:
            owner._wtime = owner._ltime = now
        else:
            owner._ltime = now


def use(tensor, stream: int, now: int, write: bool = False) -> None:
    """Order the use of `tensor` on `stream` by command `now` after its storage's uses
    elsewhere (and, for a view, after the command that made it)."""
    if capture:  # before the fields change: a graph restores what it found
        capture[-1].used(tensor, stream, write)
    owner = record(tensor)
    if owner is not tensor and tensor._writer != stream:
        _after(tensor, stream, tensor._writer, tensor._wtime)
    if write:  # after every other stream's last use (the writer is among _streams)
        for other in owner._streams:
            if other != stream:
                _after(tensor, stream, other, owner._ltime)
        owner._writer, owner._wtime = stream, now
    elif owner._writer != stream:
        _after(tensor, stream, owner._writer, owner._wtime)
    if stream not in owner._streams:
        owner._streams = owner._streams + (stream,)
    owner._ltime = now


def read_stream(tensor) -> int:
    """The stream a copy of `tensor` to the master runs on: its storage's last writer,
    ordered after the view's making if another stream made it."""
    owner = record(tensor)
    if owner is not tensor and tensor._writer != owner._writer:
        _after(tensor, owner._writer, tensor._writer, tensor._wtime)
    return owner._writer


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

"""Safe streams: a use of a tensor on another stream is ordered after its earlier uses.

Ordering is kept per storage, in one record (`Storage`) that this module owns and the
master's modules read: the stream that last wrote the storage (`writer`, at command id
`wtime`), the streams that used it (`streams`) and the id of its last use (`ltime`). Every
handle holds its storage's record (`_storage`); a view holds its base's (and the base, `_base`,
as NumPy's ndarray.base), so a write through any view is ordered against every later use of
the base and of its other views. A mesh tensor has one record for all its places while they
are alike (made by one command, on one stream): an op over the mesh is then ordered once,
not once per place; a place used on its own (a collective, a view, a per-place op) takes a
copy of it first (`own`), and from then on the mesh tensor's places are ordered one by one.
A view of a mesh tensor holds its base's record too, which lists the views that follow the
base's placements (a view of a Partial tensor is made real by its base's all_reduce).
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
from ..errors import MwrtError
from ..protocol import wire

_IMPLICIT = itertools.count(wire.IMPLICIT_EVENTS, -1)  # never the user's nor checkpoints
_ORDERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # node -> {(S, W): id}
MANUAL: set = set()  # ids of streams made with order="manual"
capture: list = []  # the graph being captured, if any (see graph.py)
# ids of the tensors captured graphs made and have not replayed yet: nothing made them, so a
# read of one is refused on the master (the worker would only say it has no such tensor)
unreplayed: set = set()


# Registry ops whose result may be a view of their first argument. A copy one of them makes
# (ravel of a transpose) is ordered as a view too: that costs a wait at most, never a value,
# and keeps the base's handle, so its worker memory, while the copy lives.
VIEWS = frozenset({"getitem", "reshape", "transpose", "swapaxes", "squeeze", "expand_dims",
                   "ravel", "moveaxis", "broadcast_to", "flip", "atleast_1d", "atleast_2d",
                   "diagonal", "ascontiguousarray", "real", "imag", "view"})
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


class Storage:
    """The record of one storage's uses (see the module's doc); a handle makes its own
    (Handle.__init__ sets the four fields: a call of __init__ would cost every op)."""

    __slots__ = ("writer", "wtime", "ltime", "streams")
    writer: int
    wtime: int
    ltime: int
    streams: tuple[int, ...]
    places = 0  # a MeshStorage's: how many places of a mesh tensor share it
    parted = False
    views: tuple | None = None

    def copy(self) -> Storage:
        """A record that starts as this one."""
        found = Storage()
        found.writer, found.wtime, found.ltime, found.streams = \
            self.writer, self.wtime, self.ltime, self.streams
        return found


class MeshStorage(Storage):
    """The record of a mesh tensor's storage: of all its places while they share it."""

    __slots__ = ("places", "parted", "views")

    def __init__(self, stream: int, now: int, places: int) -> None:
        self.writer, self.wtime, self.ltime, self.streams = stream, now, now, (stream,)
        self.places = places  # the places that share it
        self.parted = False  # True once a place took a record of its own (own())
        self.views: tuple | None = None  # weak references to the mesh views that follow it

    @classmethod
    def parted_over(cls, places: int) -> MeshStorage:
        """The record of a mesh tensor whose `places` keep records of their own."""
        found = cls(0, 0, places)
        found.parted = True
        return found


def record(tensor):
    """The handle that owns `tensor`'s storage: its base, or itself."""
    base = tensor._base
    return tensor if base is None else base


def own(tensor) -> Storage:
    """`tensor`'s record, a place's own: a place of a mesh tensor used alone takes a copy of
    the record its places shared (they all stood where it says), and the rest keep it."""
    shared = tensor._storage
    if not shared.places:
        return shared
    mine = tensor._storage = shared.copy()
    shared.parted = True
    return mine


def writer(tensor) -> int:
    """The stream that last wrote `tensor`'s storage."""
    return tensor._storage.writer


def made_on(tensor) -> int:
    """The stream that made `tensor` (for a view: that made the view, not its storage)."""
    return tensor._writer if tensor._base is not None else tensor._storage.writer


def last_use(tensor) -> int:
    """The id of the last command that used `tensor`'s storage."""
    return tensor._storage.ltime


def keep_for(tensor, stream: int) -> None:
    """`tensor`'s storage is freed only after `stream` has run what was issued so far."""
    owner = own(tensor)
    if stream not in owner.streams:
        owner.streams = owner.streams + (stream,)


def state(tensor) -> tuple:
    """The record of `tensor`'s storage, as restore_state takes it back (a graph capture
    leaves it as it found it: the captured commands have not run)."""
    owner = own(tensor)
    return owner.writer, owner.wtime, owner.ltime, owner.streams


def restore_state(tensor, saved: tuple) -> None:
    owner = own(tensor)
    owner.writer, owner.wtime, owner.ltime, owner.streams = saved


def replayed(owner, now: int, rid: int) -> None:
    """A graph's replay `rid` (issued as command `now`) used the storage `owner` records:
    its last use is the replay's, and so is its last write if `now` wrote it."""
    found = own(owner)
    found.ltime = rid
    if found.wtime == now:
        found.wtime = rid


def remade(tensor, rid: int) -> None:
    """A graph's replay `rid` made `tensor` again: its making is that command's."""
    if tensor._base is not None:
        tensor._wtime = rid
    else:
        found = own(tensor)
        found.wtime = found.ltime = rid


def share(result, source) -> None:
    """`result` may view `source`'s storage: from now on they share one record."""
    made = result._storage  # its making: the view is used only after it
    result._writer, result._wtime = made.writer, made.wtime
    result._base = record(source)
    result._storage = own(source)
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
        owner = tensor._storage
        if owner.places:
            owner = own(tensor)
        if tensor._base is not None and tensor._writer != stream:  # a view made on another
            use(tensor, stream, now, wrote)  # stream: after its making
            continue
        if owner.writer != stream or capturing or (wrote and len(owner.streams) > 1):
            use(tensor, stream, now, wrote)
        elif wrote:
            owner.wtime = owner.ltime = now
        else:
            owner.ltime = now


def order_mesh(tensor, stream: int, now: int, write: bool = False) -> None:
    """Order the use of mesh tensor `tensor` on `stream` (at every place) by command `now`:
    once for all places while they share its record, else place by place."""
    owner, blocks = tensor._storage, tensor._blocks
    if capture or owner.parted or (blocks is not None and blocks[0]._storage is not owner):
        order(tensor._locals, stream, now, write)  # (a view: its own blocks)
        return
    if owner.writer != stream or (write and len(owner.streams) > 1):
        tensor_id = tensor._id  # (one record for all: made everywhere, one id at each node)
        for node in tensor._nodes:  # every place waits as the record says, then it changes
            _waits(node, tensor_id, owner, stream, write)
        _used(owner, stream, now, write)
    elif write:
        owner.wtime = owner.ltime = now
    else:
        owner.ltime = now


def use(tensor, stream: int, now: int, write: bool = False) -> None:
    """Order the use of `tensor` on `stream` by command `now` after its storage's uses
    elsewhere (and, for a view, after the command that made it)."""
    owner = own(tensor)
    if capture:  # before the fields change: a graph restores what it found
        capture[-1].used(tensor, stream, write)
    if tensor._base is not None and tensor._writer != stream:
        _after(tensor._node, tensor._id, stream, tensor._writer, tensor._wtime)
    _waits(tensor._node, tensor._id, owner, stream, write)
    _used(owner, stream, now, write)


def _waits(node, tensor_id: int, owner: Storage, stream: int, write: bool) -> None:
    """The waits of a use of tensor `tensor_id` on `node` on `stream` that record `owner`
    asks."""
    if write:  # after every other stream's last use (the writer is among streams)
        for other in owner.streams:
            if other != stream:
                _after(node, tensor_id, stream, other, owner.ltime)
    elif owner.writer != stream:
        _after(node, tensor_id, stream, owner.writer, owner.wtime)


def _used(owner: Storage, stream: int, now: int, write: bool) -> None:
    if write:
        owner.writer, owner.wtime = stream, now
    if stream not in owner.streams:
        owner.streams = owner.streams + (stream,)
    owner.ltime = now


def refuse_unreplayed(tensors, what: str) -> None:
    """Raise if one of `tensors` is made by a captured graph not replayed yet (`what` uses
    it: a read, an op), outside any capture."""
    for tensor in tensors:
        if tensor._id in unreplayed:
            raise MwrtError(f"{what} of tensor {tensor._id}: made inside a mwrt.graph() "
                            "block, which records ops and runs none (got a use before the "
                            "graph's first replay); call g.replay() first, then use it")


def read_stream(tensor) -> int:
    """The stream a copy of `tensor` to the master runs on: its storage's last writer,
    ordered after the view's making if another stream made it."""
    if unreplayed and not capture:
        refuse_unreplayed((tensor,), "read")
    owner = tensor._storage
    if tensor._base is not None and tensor._writer != owner.writer:
        _after(tensor._node, tensor._id, owner.writer, tensor._writer, tensor._wtime)
    return owner.writer


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


def _after(node, tensor_id: int, target: int, source: int, upto: int) -> None:
    """Make `target` wait for `source` up to command `upto` on `node`, unless it already does
    (`tensor_id`: the tensor a manual stream is checked to find made)."""
    done = _ordered(node)
    if done.get((target, source), 0) >= upto:
        return
    if is_manual(target):
        node.issue(wire.Expect(id=next(node.ids), stream=target, ref=tensor_id,
                               made_on=source))
        return
    event = next(_IMPLICIT)
    record = wire.Record(id=next(node.ids), stream=source, event=event, timing=False)
    node.issue(record)
    node.issue(wire.WaitEvent(id=next(node.ids), stream=target, event=event))
    done[(target, source)] = record.id

"""Captured graphs: record ops once, then replay them with one small command per node.

`with mwrt.graph(x=x) as g:` records the commands the ops inside would issue (on any nodes
and streams, meta rules run once) instead of sending them; at the end of the block each
node receives its part once (DefineGraph). `g.replay()` then sends one Replay per node,
which the worker expands into the recorded commands on their recorded streams. As with
CUDA graphs, the block itself runs nothing: the tensors made inside hold values after a
replay. Inputs are rebound with `g.replay(x=other)` (same node, device, shape and dtype),
or updated in place between replays. Like CUDA's global capture mode, the block records
what every thread of the master issues meanwhile.

Safe streams hold: waits between streams inside the graph are recorded with it, and at
each replay the graph's uses of every storage (the tensors made before the graph, and from
the second replay those it made itself) are ordered against their uses since, in the order
captured, through any view.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import weakref

from msgspec import Raw

from ..errors import MwrtError
from ..protocol import wire
from . import ordering
from .batches import queue_everywhere
from .cluster import current
from .mesh.moves import place
from .sites import issue_site, site_text
from .tensor import DistributedTensor

_GRAPH_IDS = itertools.count(1)


class _External:
    """A tensor made before the capture and used in it: how to find it at a replay."""

    __slots__ = ("ref", "node", "id", "name")

    def __init__(self, tensor):
        self.ref, self.node, self.id = weakref.ref(tensor), tensor._node, tensor._id
        self.name = ""


class Graph:
    """A recording of ops, replayed with `replay()`; made by `mwrt.graph()`."""

    def __init__(self, inputs: dict):
        for name, tensor in inputs.items():
            if not isinstance(tensor, DistributedTensor):
                raise TypeError(f"graph: input {name!r} must be a DistributedTensor (got "
                                f"{type(tensor).__name__})")
        self._inputs = {name: _External(t) for name, t in inputs.items()}
        for name, ext in self._inputs.items():
            ext.name = name
        # By (node, id): a mesh tensor's blocks may share one id, one at each node.
        self._externals = {(ext.node, ext.id): ext for ext in self._inputs.values()}
        # node -> [[external, stream, write]]: a storage's uses in the capture's order, a run
        # of uses on one stream kept as one (a write orders all a read does, and more)
        self._uses: dict = {}
        self._last_use: dict = {}  # (node, storage owner's id) -> its last entry in _uses
        self._states: dict = {}  # (node, owner's id) -> (its weakref, its record before)
        self._made: dict = {}  # node -> tensors made inside: kept alive, replays rewrite them
        self._made_ids: set = set()
        self._made_uses: dict = {}  # id of a storage made inside -> [(stream, write)]
        self._made_order: dict = {}  # node -> [(storage made inside, its uses)]
        self._made_held: dict = {}  # node -> tensors made inside that a handle outside holds
        self._origins: dict = {}  # id of a view made inside -> the handle from before it views
        self._last: dict = {}  # node -> the id of its last Replay
        self._commands: dict = {}  # node -> recorded commands
        self._sites: dict = {}  # node -> {command id: where it was recorded}
        self._defined: dict = {}  # node -> graph id on that node (one id for every node)
        self._weight: dict = {}  # node -> (its definition's bytes, the streams it uses)
        self._saved: dict = {}
        self._recorders: dict = {}  # node -> what records its commands during the capture
        self._placed: list = []  # Partial mesh tensors made inside: weakref, placements
        # tensors made inside whose shape depends on values (t[mask]): each replay may give
        # another, so their handles forget it and ask again
        self._sized_by_data: list = []
        self._capturing = False

    # -- capture --------------------------------------------------------------------------

    def __enter__(self) -> Graph:
        if ordering.capture:
            raise MwrtError("graph: already capturing a graph; captures do not nest")
        for node in current().nodes:
            self._saved[node] = ordering.snapshot(node)
            # This node's commands go to the recording: the instance's issue shadows the
            # class's until __exit__ deletes it.
            node.issue = self._recorders[node] = self._recorder(node)  # type: ignore[method-assign]
        ordering.capture.append(self)
        self._capturing = True
        return self

    def __exit__(self, kind, exc, tb) -> None:
        ordering.capture.pop()
        self._capturing = False
        for node in current().nodes:
            del node.issue
            ordering.restore(node, self._saved.pop(node))
        for ref, state in self._states.values():  # nothing ran: as they were before the block
            owner = ref()
            if owner is not None:
                ordering.restore_state(owner, state)
        if kind is None:
            self._define()
        # What a replay leaves them as (a later all_reduce outside makes them real)
        self._placed = [(ref, t._placements) for ref in self._placed if (t := ref()) is not None]

    @contextlib.contextmanager
    def paused(self):
        """Commands issued in the block run now, unrecorded (a Partial tensor made before the
        capture is made real once, not at every replay)."""
        ordering.capture.pop()
        for node in self._recorders:
            del node.issue
        try:
            yield
        finally:
            for node, recorder in self._recorders.items():
                node.issue = recorder
            ordering.capture.append(self)

    def makes(self, tensor) -> bool:
        """True if `tensor` was made during the capture (a replay makes it again)."""
        return tensor._id in self._made_ids

    def placed(self, tensor) -> None:
        """Called for a Partial mesh tensor made during the capture: each replay makes its
        parts anew, so it is Partial again, whatever made it real since."""
        self._placed.append(weakref.ref(tensor))
        if tensor._storage.views is None:  # its views, made now or later, follow it
            tensor._storage.views = ()

    def made(self, tensor) -> None:
        """Called for each tensor made during the capture: its making is a write."""
        self._made.setdefault(tensor._node, []).append(tensor)
        self._made_ids.add(tensor._id)
        ordering.unreplayed.add(tensor._id)
        if tensor._spec is None:
            self.sized_by_data(tensor)
        self._made_uses[tensor._id] = [(ordering.made_on(tensor), True)]

    def sized_by_data(self, tensor) -> None:
        """Called for a tensor made during the capture whose shape its values decide (a mesh
        one's too): a replay makes it again, maybe of another shape."""
        self._sized_by_data.append(weakref.ref(tensor))

    def shared(self, tensor, source) -> None:
        """Called when a tensor made during the capture turns out a view of `source`: its
        storage's record is its owner's, and making it wrote nothing."""
        self._made_uses.pop(tensor._id, None)
        # Its uses are the handle's it views that was made before (an input, maybe rebound).
        origin = self._origins.get(source._id) if source._id in self._made_ids else source
        if origin is not None:
            self._origins[tensor._id] = origin

    def used(self, tensor, stream: int, write: bool) -> None:
        """Called for each use of a tensor during the capture, before its ordering."""
        owner = ordering.record(tensor)
        if owner._id not in self._made_ids and (owner._node, owner._id) not in self._states:
            self._states[owner._node, owner._id] = (weakref.ref(owner), ordering.state(owner))
        if owner._id in self._made_ids:
            uses = self._made_uses[owner._id]
            if uses[-1][0] != stream:
                uses.append((stream, write))
            elif write and not uses[-1][1]:
                uses[-1] = (stream, True)
            return
        # A handle made before the capture is found again as itself (an input may be rebound);
        # a view made inside, as the handle from before that it views.
        key = self._origins[tensor._id] if tensor._id in self._made_ids else tensor
        ext = self._externals.get((key._node, key._id))
        if ext is None:
            ext = self._externals[key._node, key._id] = _External(key)
        last = self._last_use.get((owner._node, owner._id))
        if last is not None and last[0] is ext and last[1] == stream:
            last[2] = last[2] or write
            return
        last = self._last_use[owner._node, owner._id] = [ext, stream, write]
        self._uses.setdefault(ext.node, []).append(last)

    def _recorder(self, node):
        commands, sites = self._commands.setdefault(node, []), self._sites.setdefault(node, {})
        issue = type(node).issue

        def record(command, frame=None, hold=False) -> None:  # (hold: the batch's, not ours)
            name = type(command).__name__
            if isinstance(command, wire.NewStream):  # streams are made now, not replayed
                return issue(node, command)
            if frame is not None or command.data_frame:
                raise MwrtError("graph: copying an array from the master (dist_send, tensor()) "
                                "cannot be captured; make the tensor before the graph and "
                                "pass it in (mwrt.graph(x=x)), or update it in place")
            if command.posts_receive:
                raise MwrtError("graph: moves between nodes (.to(node=), dist_send(node=)) "
                                "cannot be captured; move the tensor before the graph, or use "
                                "a collective (broadcast, all_gather), which can")
            if not command.on_stream or command.sync_point:
                raise MwrtError(f"graph: {name} waits for the worker or talks to the master, "
                                "which a captured graph cannot; read values (numpy(), shape "
                                "of remote() results, synchronize) after g.replay()")
            commands.append(command)
            sites[command.id] = f"{site_text(issue_site())} (captured by mwrt.graph)"
        return record

    def _define(self) -> None:
        gid = next(_GRAPH_IDS)  # (each node numbers its graphs apart: one id serves them all)
        for node, commands in self._commands.items():
            if not commands:
                continue
            inputs = tuple(ext.id for ext in self._inputs.values() if ext.node is node)
            body = wire.encode_body(commands)
            node.issue(wire.DefineGraph(id=next(node.ids), graph=gid, body=body, inputs=inputs))
            self._defined[node] = gid
            node.graph_sites.update(self._sites[node])  # errors in a replay name these lines
            # A replay queues these commands again on the worker, which counts them as their
            # bytes (MWRT_SESSION_INFLIGHT_BYTES): so does this master's backlog.
            self._weight[node] = (len(body), {c.stream for c in commands})
        self._commands.clear()
        for node, made in self._made.items():  # storages made inside, with their uses
            # Only a tensor some handle outside holds can be used between replays; the rest
            # (held by this list alone: the list, the loop and the call count 3) are not
            # looked at again.
            held = self._made_held[node] = [t for t in made if sys.getrefcount(t) > 3]
            self._made_order[node] = [(t, self._made_uses[t._id]) for t in held
                                      if t._id in self._made_uses]

    # -- replay ---------------------------------------------------------------------------

    def replay(self, **bindings) -> None:
        """Run the recorded ops again; `name=tensor` rebinds the input given as `name`."""
        if self._capturing:
            raise MwrtError("graph: replay() inside its own capture block; call it after")
        first = not self._last  # (what it made exists from now on)
        bindings = _by_place(bindings)
        bound = self._bind(bindings)
        for node in self._defined:  # all checks first: a replay runs on every node or none
            node.check_lost()
        tensors = self._tensors(bindings)
        nodes = list(self._defined)
        counter = nodes[0].ids if nodes else None
        if not all(node.ids is counter for node in nodes):  # a re-attached session
            counter = None
        now = next(counter) if counter is not None else 0
        touched, nows = {}, {}
        for node in nodes:  # the waits each node's replay needs go out before it
            nows[node] = now if counter is not None else next(node.ids)
            touched[node] = self._order(node, tensors, nows[node])
        rid = next(counter) if counter is not None else 0
        bodies: list[Raw] = []  # each node's Replay, encoded (one for all without bindings)
        rids: list[int] = []
        for node in nodes:
            if counter is None:
                rid = next(node.ids)
            pairs = bound.get(node, ())
            if pairs or not bodies or counter is None:  # one command's bytes for the others
                body = Raw(wire.encode_message(wire.Replay(id=rid, graph=self._defined[node],
                                                           bindings=pairs)))
            bodies.append(body)
            rids.append(rid)
        site = issue_site()
        if counter is None:
            for node, body, rid in zip(nodes, bodies, rids):
                queue_everywhere([node], [body], rid, None, site, 1e-3)
        else:
            queue_everywhere(nodes, bodies, rid, None, site, 1e-3 * max(1.0, len(nodes) / 8))
        for node, rid in zip(nodes, rids):
            self._replayed(node, nows[node], rid, touched[node])
        for ref, placements in self._placed:
            tensor = ref()
            if tensor is not None and tensor._placements != placements:
                place(tensor, placements)
        for ref in self._sized_by_data:  # (asked again when next needed)
            if (tensor := ref()) is not None:
                tensor._spec = None
        if first:
            ordering.unreplayed.difference_update(self._made_ids)

    def _replayed(self, node, now: int, rid: int, touched: list) -> None:
        """What the master records of a node's replay `rid`: the bytes it queued, the
        streams it used, and its writes and uses of the storages it touched."""
        nbytes, streams = self._weight.get(node, (0, ()))
        node.streams.update(streams)  # (queueing adds to both only what limits lacks)
        node.limits.streams.update(streams)
        with node.tx_lock:
            node.limits.count(nbytes)
        for owner in touched:  # their uses are this replay's, issued after its waits
            ordering.replayed(owner, now, rid)
        for tensor in self._made_held.get(node, ()):  # made again by this replay
            ordering.remade(tensor, rid)
        self._last[node] = rid

    def _bind(self, bindings: dict) -> dict:
        """Check `bindings` against the inputs; node -> (captured id, new id, ...)."""
        for name, tensor in bindings.items():
            ext = self._inputs.get(name)
            if ext is None:
                raise TypeError(f"graph.replay: no input named {name!r} (inputs: "
                                f"{', '.join(self._inputs) or 'none'}; name them with "
                                "mwrt.graph(name=tensor))")
            _check_like(name, ext, tensor)
        pairs: dict = {}
        for name, tensor in bindings.items():
            ext = self._inputs[name]
            pairs[ext.node] = pairs.get(ext.node, ()) + (ext.id, tensor._id)
        return pairs

    def _tensors(self, bindings: dict) -> dict:
        """The tensor each captured tensor stands for now; one made before must still exist."""
        found = {}
        for ext in self._externals.values():
            tensor = bindings[ext.name] if ext.name in bindings else ext.ref()
            if tensor is None:
                what = f"input {ext.name!r}" if ext.name else "a tensor made before the graph"
                raise MwrtError(
                    f"graph.replay: {what} (tensor {ext.id}, captured on node "
                    f"{ext.node.index}) was freed; keep a handle to it while the graph lives, "
                    "or pass it as an input (mwrt.graph(x=x)) and rebind it (g.replay(x=y))")
            found[ext] = tensor
        return found

    def _order(self, node, tensors: dict, now: int) -> list:
        """Order the graph's uses of storages after their uses since (made before the graph,
        in the order captured; made by its last replay and used since); returns the owners."""
        touched = {}
        for ext, stream, write in self._uses.get(node, ()):
            tensor = tensors[ext]
            ordering.use(tensor, stream, now, write)
            owner = ordering.record(tensor)
            touched[id(owner)] = owner
        last = self._last.get(node)  # none exists on the worker before the first replay
        for tensor, uses in self._made_order.get(node, ()) if last is not None else ():
            if ordering.last_use(tensor) != last:  # else nothing used it since the last replay
                for stream, write in uses:
                    ordering.use(tensor, stream, now, write)
                touched[id(tensor)] = tensor
        return list(touched.values())

    def __del__(self):
        with contextlib.suppress(Exception):  # (at exit the module's globals may be gone)
            ordering.unreplayed.difference_update(self._made_ids)
        for node, gid in self._defined.items():
            try:
                for cid in self._sites.get(node, ()):
                    node.graph_sites.pop(cid, None)
                type(node).issue(node, wire.DropGraph(id=next(node.ids), graph=gid))
            except Exception:  # noqa: BLE001, S110 - the session ended: its graphs went with it
                pass


def _check_like(name: str, ext: _External, tensor) -> None:
    """A rebinding must have the captured input's place, shape and dtype."""
    captured = ext.ref()
    if tensor._node is not ext.node or (captured is not None and (
            tensor._device != captured._device or tensor.spec != captured.spec)):
        was = (f"node {ext.node.index}, device {captured._device}, {captured.spec}"
               if captured is not None else f"node {ext.node.index}")
        raise ValueError(f"graph.replay: {name} must be like the captured input (got node "
                         f"{tensor._node.index}, device {tensor._device}, {tensor.spec}; "
                         f"expected {was}); make it there with that shape and dtype")


def graph(**inputs: DistributedTensor) -> Graph:
    """Capture the ops of a `with` block as a Graph; `inputs` name tensors replay() rebinds."""
    return Graph(_by_place(inputs))


def _by_place(tensors: dict) -> dict:
    """A mesh tensor as its shards, one input each ("x[0]", "x[1]", ...): a replay rebinds
    every place's block, each checked as any input is."""
    if not any(isinstance(t, DistributedTensor) and t._mesh is not None
               for t in tensors.values()):
        return tensors
    out = {}
    for name, tensor in tensors.items():
        if isinstance(tensor, DistributedTensor) and tensor._mesh is not None:
            out.update({f"{name}[{i}]": shard for i, shard in enumerate(tensor.shards())})
        else:
            out[name] = tensor
    return out

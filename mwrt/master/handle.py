"""Handle: what the master knows of a tensor, below the verbs that issue its ops.

A handle names an array on one place (node, device), or a tensor laid over a mesh: then
`mesh`, its placements and one block per place (handles on one place). The verbs (issue.py,
transfer.py, mesh/dispatch.py, ...) read and write these fields and make their results of
the class of their operands (`results`), so they never import the class users hold,
DistributedTensor (tensor.py), which stands above them and calls them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..ops import Spec
from ..protocol import wire
from . import ordering
from .batches import free_everywhere
from .mesh.placement import local_specs


class Handle:
    """The fields of a tensor handle (see the module's doc); DistributedTensor's base."""

    # One place: _node, _device, _id, _ref (its id pre-encoded), _storage, the record of its
    # storage's uses (ordering.Storage). A view holds its base's record and its base, _base
    # (as NumPy's ndarray.base), and _writer and _wtime, the stream and command that made it.
    # A mesh tensor: _mesh, _placements (one per mesh dimension), _blocks (a one-place handle
    # per place, read as _locals) and one record for them all; a view of it holds its base too
    # (a view of a Partial tensor is made real by its base's all_reduce: moves.resolve). One
    # made by one command at every place (everywhere()) has _id and _ref, the id of its block
    # at each of _nodes, and no block handles until one is asked for (_blocks None).
    __slots__ = ("_node", "_device", "_id", "_spec", "_storage", "_writer", "_wtime", "_base",
                 "_ref", "_mesh", "_placements", "_blocks", "_nodes", "__weakref__")
    results: type[Handle]  # the class a verb makes its results of (see __init_subclass__)
    # the class of a 0-d result NumPy gives as a scalar (ops.Op.scalar), its element class
    scalars: type[Handle] | None = None
    holds_torch = False  # a torch tensor's handle (TorchTensor): NumPy's ops refuse it
    _mesh: Any  # a Mesh, or None on one place (then _placements and _blocks are unset)
    _placements: tuple
    _blocks: list | None
    _nodes: tuple
    if TYPE_CHECKING:  # what DistributedTensor gives every handle, which the verbs read
        @property
        def spec(self) -> Spec: ...
        shape: tuple[int, ...]
        dtype: Any

        @property
        def kind(self) -> str: ...

        def get_node(self) -> int: ...

    def __init_subclass__(cls, element: bool = False, **kwargs: Any) -> None:
        """A subclass's ops make handles of its own class; an element's, of its base's, whose
        0-d scalar results are of the element's class."""
        super().__init_subclass__(**kwargs)
        if element:
            cls.results.scalars = cls
        elif cls.scalars is None or not issubclass(cls, cls.scalars):  # (an element's kinds
            cls.results, cls.scalars = cls, None  # keep its classes: Element.of_dtype)

    @classmethod
    def of_dtype(cls, dtype: Any) -> type[Handle]:
        """The class of a handle of `dtype` that stands for this class: itself (an element
        class, its subclass for the dtype's kind)."""
        return cls

    def __init__(self, node: Any, device: int, tensor_id: int, spec: Spec | None,
                 stream: int) -> None:
        """A handle to tensor `tensor_id` (made by mwrt's constructors and ops, not users)."""
        self._node, self._device, self._id = node, device, tensor_id
        self._spec = spec
        # its last use is tensor_id: below its command's id, above every earlier command's
        record = self._storage = ordering.Storage()
        record.writer, record.wtime, record.ltime, record.streams = stream, tensor_id, \
            tensor_id, (stream,)
        self._base: Handle | None = None  # a view: the handle whose storage it views
        self._ref = wire.ref(tensor_id)  # pre-encoded, so messages carry it at no cost
        self._mesh = None
        if ordering.capture:
            ordering.capture[-1].made(self)

    @classmethod
    def at_places(cls, nodes, devices, tensor_id: int, specs, streams) -> list:
        """One handle per place to tensor `tensor_id`, the id every place's worker gives its
        block of a mesh op's result, made on its place's stream: __init__'s fields, with one
        pre-encoded reference for all."""
        ref, new = wire.ref(tensor_id), cls.__new__
        handles: list = []
        append = handles.append
        for node, device, spec, stream in zip(nodes, devices, specs, streams):
            t = new(cls)
            t._node, t._device, t._id, t._spec, t._ref, t._mesh, t._base = node, device, \
                tensor_id, spec, ref, None, None
            t._storage = record = ordering.Storage()
            record.writer, record.wtime, record.ltime, record.streams = stream, tensor_id, \
                tensor_id, (stream,)
            append(t)
        return handles

    @classmethod
    def on_mesh(cls, mesh, placements: tuple, blocks: list, spec: Spec | None) -> Any:
        """A handle to a tensor laid over `mesh`: `blocks`, one per place, make the whole,
        each keeping its own record."""
        t = cls.__new__(cls)
        t._mesh, t._placements, t._blocks, t._spec = mesh, placements, list(blocks), spec
        t._storage = ordering.MeshStorage.parted_over(len(blocks))
        t._node = t._base = None
        return t

    @classmethod
    def everywhere(cls, mesh, placements: tuple, spec: Spec, tensor_id: int,
                   stream: int) -> Any:
        """A handle to a tensor laid over `mesh` whose blocks one command made, all named
        `tensor_id`, on `stream` at every place: one record for them all, and no handle per
        place until one is asked for (_locals): a mesh op's cost per node is then its send."""
        t = cls.__new__(cls)
        t._mesh, t._placements, t._spec, t._blocks, t._nodes = mesh, placements, spec, None, \
            mesh.nodes
        t._id, t._ref = tensor_id, wire.ref(tensor_id)
        t._storage = ordering.MeshStorage(stream, tensor_id, len(mesh.nodes))
        t._node = t._base = None
        return t

    @property
    def _locals(self) -> list:
        """A mesh tensor's handle per place (row-major), made on first use if need be."""
        blocks = self._blocks
        if blocks is None:
            blocks = self._blocks = self._made_blocks()
        return blocks

    def _made_blocks(self) -> list:
        """The handles of the blocks everywhere() named: they share the tensor's record, and
        from now on each frees its own block."""
        cls, record, tensor_id, ref = type(self), self._storage, self._id, self._ref
        mesh = self._mesh
        blocks = []
        for node, device, spec in zip(self._nodes, mesh.place_devices,
                                      local_specs(self.spec, self._placements, mesh)):
            t = cls.__new__(cls)
            t._node, t._device, t._id, t._spec, t._ref, t._mesh, t._base, t._storage = \
                node, device, tensor_id, spec, ref, None, None, record
            blocks.append(t)
        return blocks

    def __reduce__(self) -> Any:
        """Refuses: a handle is this master's, and means nothing pickled elsewhere."""
        raise TypeError("DistributedTensor: a handle cannot be pickled, nor captured by a "
                        "function shipped with mwrt.remote; pass the tensor as an argument "
                        "(remote(fn)(t)), or its value (t.numpy())")

    def __del__(self) -> None:
        """Free the worker's array once the streams that used it are done with it."""
        node = self._node  # None for a mesh tensor: its blocks free themselves, if it has any
        try:  # Node.release, inline
            if node is not None:
                if not node.closed:
                    node.frees.append((self._id, self._storage.streams))
            elif self._blocks is None:  # made by everywhere(): its block at every node
                free_everywhere(self._nodes, self._id, self._storage.streams)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing left to free
            pass


def check_same_place(first: Handle, other: Handle, what: str, fix: str) -> None:
    """A ValueError naming both places unless `other` lives where `first` does."""
    if other._node is not first._node or other._device != first._device:
        for t in (first, other):  # one of an ended session: say so, not 'node 0 and node 0'
            t._node.check_open()
        raise ValueError(
            f"{what} live in different places (node {first._node.index} device "
            f"{first._device} and node {other._node.index} device {other._device}); {fix}")

"""TensorReads: what a tensor handle tells without issuing an op, DistributedTensor's base.

What the master knows without asking (shape and dtype from the meta rules, place, mesh and
placements, name) and the copies of a value to the master (`numpy()`, `item()`, `float()`…),
the only calls that wait for the workers. The ops a tensor issues, and the class users hold,
are in tensor.py.
"""

from __future__ import annotations

import math
import operator
import weakref
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from ..arrays import HOST
from ..ops import Spec
from ..protocol import wire
from . import context, layout, methods
from .flat import FlatIndex
from .handle import Handle
from .layout import Flags
from .mesh.device_mesh import Mesh
from .mesh.moves import gather_to_master
from .mesh.naming import name_places
from .mesh.placement import REPLICATE, Shard, describe
from .transfer import asked_spec, fetch, share

_NAMES: dict[int, str] = {}  # id(handle) -> its name, while the handle lives


class TensorReads(Handle):
    """The reads of a tensor handle: its metadata, and copies of its value to the master."""

    __slots__ = ()

    # -- what the master knows without asking ---------------------------------------------

    @property
    def mesh(self) -> Any:
        """The mesh the tensor lies on (a one-place mesh for a tensor on one place)."""
        if self._mesh is None:
            return Mesh([(self._node.index, self._device)], (1,), ("node",))
        return self._mesh

    @property
    def placements(self) -> tuple:
        """One placement per mesh dimension: Shard(axis), Replicate() or Partial(op)."""
        return (REPLICATE,) if self._mesh is None else self._placements

    @property
    def placement(self) -> Any:
        """The placement on a 1-D mesh (the tuple of them on an n-D mesh)."""
        placements = self.placements
        return placements[0] if len(placements) == 1 else placements

    def shards(self) -> list:
        """The one-place tensors, one per place of the mesh (row-major): [self] on one place."""
        return [self] if self._mesh is None else list(self._locals)

    @property
    def spec(self) -> Spec:
        """Shape and dtype; asks the worker(s) once if they depend on data (masks, remote())."""
        if self._spec is None:
            self._spec = asked_spec(self) if self._mesh is None else _global_spec(self)
        return self._spec

    shape = property(lambda self: self.spec.shape, doc="The shape, a tuple of ints.")
    dtype = property(lambda self: self.spec.dtype, doc="The NumPy dtype of the elements.")
    ndim = property(lambda self: len(self.spec.shape), doc="The number of dimensions.")
    itemsize = property(lambda self: self.spec.dtype.itemsize, doc="The bytes of one element.")

    def get_node(self) -> int:
        """The index of the node (worker) that holds this tensor."""
        return self._one_place("get_node")._node.index

    def get_device(self) -> int:
        """The device on its node that holds this tensor (-1, HOST: host memory)."""
        return self._one_place("get_device")._device

    @property
    def is_cuda(self) -> bool:
        """True if it lives on a GPU (on GPUs, for a mesh tensor)."""
        return (self._device if self._mesh is None else self._mesh.places[0][1]) != HOST

    def _one_place(self, what: str) -> TensorReads:
        if self._mesh is not None:
            raise TypeError(f"{what}: a mesh tensor lies on {self._mesh.size} places (got a "
                            f"tensor placed {describe(self._placements)}); ask one of its "
                            "shards (t.shards()[i])")
        return self

    def numel(self) -> int:
        """The number of elements (torch's name for size)."""
        return math.prod(self.spec.shape)

    def dim(self) -> int:
        """The number of dimensions (torch's name for ndim)."""
        return len(self.spec.shape)

    def element_size(self) -> int:
        """The bytes of one element (torch's name for itemsize)."""
        return self.spec.dtype.itemsize

    def __len__(self) -> int:
        """The length of the first dimension; a TypeError for a 0-d tensor."""
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        """Shape, dtype and place (placements and mesh), without asking the worker."""
        spec = "shape and dtype pending" if self._spec is None else \
            f"shape={self._spec.shape}, dtype={self._spec.dtype}"
        if self._mesh is not None:
            return (f"DistributedTensor({spec}, placements={describe(self._placements)}, "
                    f"mesh={self._mesh!r})")
        return (f"DistributedTensor({spec}, node={self._node.index}, device={self._device}, "
                f"id={self._id})")


    @property
    def name(self) -> str | None:
        """The name a master re-attaching to this named session finds it by (mwrt.attached())."""
        return _NAMES.get(id(self))

    @name.setter
    def name(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise TypeError(f"name: must be a non-empty str (got {value!r})")
        if self._mesh is not None:
            name_places(self, value)  # each block by name, and how they make the whole
        else:
            node = self._node
            node.issue(wire.Name(id=next(node.ids), ref=self._id, name=value))
        if id(self) not in _NAMES:  # by id: a weak dict would compare handles with == (an op)
            weakref.finalize(self, _NAMES.pop, id(self), None)
        _NAMES[id(self)] = value

    size = property(lambda self: methods.Size(math.prod(self.spec.shape), self.spec.shape),
                    doc="The number of elements (NumPy's); called, size() or size(dim) gives "
                        "the shape or one dimension (torch's).")
    nbytes = property(lambda self: self.size * self.spec.dtype.itemsize,
                      doc="The bytes its elements take on the worker.")

    @property
    def strides(self) -> tuple[int, ...]:
        """NumPy's strides (bytes per step along each axis) of the array on its worker; asks
        it (a wait)."""
        return tuple(self._layout("strides")["strides"])

    @property
    def flags(self) -> Flags:
        """NumPy's flags (c_contiguous, f_contiguous, writeable, ...) of the array on its
        worker, read-only; asks it (a wait)."""
        return Flags(self._layout("flags")["flags"])

    def _layout(self, what: str) -> dict:
        if self.holds_torch:
            raise AttributeError(f"{what}: a torch tensor has no NumPy {what} (got a handle "
                                 "to a torch tensor); use t.stride() and t.is_contiguous()")
        return layout.asked(self._one_place(what))

    @property
    def kind(self) -> str:
        """The array behind the handle: "numpy" (host memory), "cupy" (a GPU) or "torch"."""
        device = self._device if self._mesh is None else self._mesh.place_devices[0]
        return "numpy" if device == HOST else "cupy"

    @property
    def device(self) -> context.Device:
        """Where it lives, as an Array API device: mwrt.Device(node, device)."""
        return context.Device(self._one_place("device")._node.index, self._device)

    # -- copies to the master (sync points) -----------------------------------------------

    def numpy(self, copy: bool = True) -> np.ndarray:
        """Copy to the master as a NumPy array; waits for the stream that last wrote it (a mesh
        tensor: each block sent straight here, all at once). `copy=False`, of a one-place
        tensor on a worker of this host: a read-only view of shared memory the worker filled
        (no copy on the master), freed when the array and its views are."""
        if self._mesh is not None:
            return gather_to_master(self)
        return fetch(self) if copy else share(self)

    get = numpy

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        """The value as a NumPy array on the master (np.asarray(t)); waits, as numpy() does.
        copy=False is NumPy's ValueError: the worker's memory cannot become the array."""
        if copy is False:
            raise ValueError("__array__: a remote tensor's values must be copied to the master "
                             "(got copy=False); use np.asarray(t) or t.numpy(), or "
                             "t.numpy(copy=False) for a read-only view of a snapshot in "
                             "shared memory (a worker on this host)")
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(1, 0), DLPack's CPU: __dlpack__ exports a copy in the master's memory."""
        return (1, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        """A DLPack capsule of the value copied to the master (np.from_dlpack(t)); waits, as
        numpy() does. The worker's memory cannot be shared: copy=False is a BufferError."""
        if copy is False:
            raise BufferError("__dlpack__: a remote tensor's memory cannot be shared in "
                              "place (got copy=False); export a copy (copy=None or True)")
        if dl_device not in (None, (1, 0)):
            raise BufferError(f"__dlpack__: exports to the master's CPU only (got dl_device="
                              f"{dl_device}, expected (1, 0) or None)")
        return self.numpy().__dlpack__(max_version=max_version, copy=True)

    def item(self, *args: Any) -> Any:
        """The single element as a Python scalar; as NumPy's, item(i) takes the element at
        flat index i and item(i, j, ...) (or item((i, j))) the one at those indices."""
        if args:
            index = args[0] if len(args) == 1 else args
            element = self[index] if isinstance(index, tuple) else FlatIndex(self)[index]  # type: ignore[index]
            return element.item()
        if math.prod(self.spec.shape) != 1:  # (not self.size: a Size object per float(t))
            self._stand_in().item()  # NumPy's own error (or torch's, for a torch handle)
        return self.numpy().item()

    def _stand_in(self) -> Any:
        """An array of this tensor's shape and dtype that holds no memory: what NumPy says
        of it (float() of a vector, bool() of several elements) is what it says of ours."""
        spec = self.spec
        return np.broadcast_to(np.zeros((), spec.dtype), spec.shape)

    def _scalar(self, convert) -> Any:
        """convert(t) of a one-element tensor, of any shape (torch's rule: NumPy 2.4 refuses
        float() of a shaped one); of any other, NumPy's (torch's) own error, without a wait."""
        if math.prod(self.spec.shape) != 1:
            convert(self._stand_in())  # raises, as NumPy does for an array of this shape
        return convert(self.item())

    def tolist(self) -> Any:
        """The value as nested Python lists (a scalar for a 0-d tensor); waits for it."""
        return self.numpy().tolist()

    def __float__(self) -> float:
        """float(t) of a one-element tensor; waits for it."""
        return self._scalar(float)

    def __int__(self) -> int:
        """int(t) of a one-element tensor; waits for it."""
        return self._scalar(int)

    def __index__(self) -> int:
        """The value of a one-element integer tensor used as an index; waits for it."""
        operator.index(np.zeros((), self.spec.dtype))  # NumPy's own error for a float one
        return self._scalar(operator.index)

    def __complex__(self) -> complex:
        """complex(t) of a one-element tensor; waits for it."""
        return self._scalar(complex)

    def __format__(self, spec: str) -> str:
        """f"{t:.3f}" of a 0-d tensor: its value formatted (waits for it), as NumPy and torch
        format theirs; their own error for a shaped one. No spec (f"{t}"): repr(t), no wait."""
        if not spec:
            return repr(self)
        if self.spec.shape:
            return format(self._stand_in(), spec)  # raises, as NumPy (torch) does
        return format(self.item(), spec)

    def __bool__(self) -> bool:
        """bool(t) of a one-element tensor; waits for it."""
        return self._scalar(bool)


def _global_spec(tensor: TensorReads) -> Spec:
    """The global shape of a mesh tensor whose blocks' shapes the workers know: the blocks'
    lengths summed along each sharded axis."""
    mesh: Mesh = tensor._mesh
    specs = [x.spec for x in tensor._locals]
    shape = list(specs[0].shape)
    for d, p in enumerate(tensor._placements):
        if type(p) is Shard:
            line = mesh.groups(d)[0]
            shape[p.axis] = sum(specs[i].shape[p.axis] for i in line)
    return Spec(tuple(shape), specs[0].dtype)

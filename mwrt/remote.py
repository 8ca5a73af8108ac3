"""mwrt.remote(fn): run a user function on the worker that holds its tensor arguments."""

from __future__ import annotations

import functools

import cloudpickle

from . import context, wire
from .cluster import current

_REMOTE = wire.code(wire.Remote)


class RemoteFunction:
    """A function shipped (cloudpickle) to run where its tensor arguments live."""

    def __init__(self, fn, outputs: int = 1):
        if not callable(fn):
            raise TypeError(f"remote: expected a callable (got {type(fn).__name__})")
        if not isinstance(outputs, int) or outputs < 0:
            raise ValueError(f"remote: outputs must be an int >= 0 (got {outputs!r})")
        self.fn, self.outputs = fn, outputs
        self._blob: bytes | None = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args, node: int | None = None, device: int | None = None, **kwargs):
        """Issue the call and return at once: result tensors, whose shapes resolve on first use."""
        from .tensor import DistributedTensor, _convert

        place: list = []
        _, wire_args = _convert(args, place, "remote")
        _, wire_kwargs = _convert(kwargs, place, "remote")
        if place:
            target, device = place[0]._node, place[0]._device
        else:
            target = current().node(context.current_node() if node is None else node)
            device = context.current_device() if device is None else device
        if self._blob is None:
            self._blob = cloudpickle.dumps(self.fn)
        stream = context.stream_for(target.index, device)
        outs = [DistributedTensor(target, device, next(target.ids), None, stream)
                for _ in range(self.outputs)]
        target.issue((_REMOTE, next(target.ids), stream, tuple(t._id for t in outs), self._blob,
                      wire_args, wire_kwargs))
        if self.outputs == 0:
            return None
        return outs[0] if self.outputs == 1 else tuple(outs)


def remote(fn=None, *, outputs: int = 1):
    """Decorator or call: `mwrt.remote(fn)(t)` runs fn(t's array) on t's worker."""
    if fn is None:
        return lambda f: RemoteFunction(f, outputs)
    return RemoteFunction(fn, outputs)

"""mwrt.remote(fn): run a user function on the worker that holds its tensor arguments."""

from __future__ import annotations

import functools
import sys

import cloudpickle

from ..arrays import as_dtype
from ..ops import Spec, torchspec
from ..protocol import values, wire
from . import context, ordering, torchgrad
from .cluster import current
from .handle import Handle
from .issue import convert
from .mesh.dispatch import remote_call
from .sites import remember_places


class RemoteFunction:
    """A function shipped (cloudpickle) to run where its tensor arguments live."""

    def __init__(self, fn, outputs: int = 1, spec=None, results: type | None = None,
                 objects: bool = False):
        """`fn` with `outputs` results (their `spec`s, if known), handles of class `results`
        (else of its tensor arguments' class); `objects`: its results are no tensors (a
        torch module), and have no metadata to ask."""
        if not callable(fn):
            raise TypeError(f"remote: expected a callable (got {type(fn).__name__})")
        if not isinstance(outputs, int) or outputs < 0:
            raise ValueError(f"remote: outputs must be an int >= 0 (got {outputs!r})")
        self.specs = _specs(spec, outputs)
        self.fn, self.outputs, self.results, self.objects = fn, outputs, results, objects
        self._blob: bytes | None = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args, node: int | None = None, device: int | None = None, **kwargs):
        """Issue the call and return at once: result tensors, whose shapes resolve on first use."""
        if any(isinstance(a, Handle) and a._mesh is not None
               for a in (*args, *kwargs.values())):
            return remote_call(self, args, kwargs)  # at every place of the mesh
        place: list = []
        # (no Specs: an argument a pending function makes is not waited for here)
        _, wire_args = convert(args, place, "remote", specs=False)
        _, wire_kwargs = convert(kwargs, place, "remote", specs=False)
        results = self.results
        if place:
            target, device, results = place[0]._node, place[0]._device, place[0].results
        elif results is None:
            raise TypeError("remote: a function without tensor arguments needs a place; call "
                            "it as mwrt.remote(fn)(node=i)")
        else:
            target = current().node(context.current_node() if node is None else node)
            device = context.current_device() if device is None else device
        if self._blob is None:
            self._blob = _pickle(self.fn)
        layout = values.list_layout((args, kwargs))
        blob = self._blob if layout is None else _pickle(values.Relisted(self.fn, layout))
        stream = context.stream_for(target.index, device)
        outs = [results(target, device, next(target.ids), spec, stream)
                for spec in self.specs]
        now = next(target.ids)
        for tensor in place:  # read: in-place side effects are the function's own business
            ordering.use(tensor, stream, now)
        target.issue(wire.Remote(id=now, stream=stream,
                                 outs=tuple(t._id for t in outs), fn=blob, args=wire_args,
                                 kwargs=wire_kwargs))
        if getattr(results, "holds_torch", False) and not self.objects:
            _torch_results(place, outs)
        if self.outputs == 0:
            return None
        return outs[0] if self.outputs == 1 else tuple(outs)


def _torch_results(place: list, outs: list) -> None:
    """Torch handles' metadata is known at once: a function's results' is asked of the
    worker now (one wait), and the results that need grad come from its torch arguments."""
    for out in outs:
        if not isinstance(out.spec, torchspec.TorchSpec):
            raise TypeError(f"remote: the function got torch handles and returned a "
                            f"{out.spec.dtype} array (expected torch tensors); return "
                            "torch.from_numpy(result), or pass NumPy handles")
    torchgrad.record(place, outs, tuple((out._spec, -1, -1) for out in outs), ())


def _pickle(fn) -> bytes:
    """cloudpickle `fn`; functions of the user's own modules go by value (workers lack them)."""
    by_value(getattr(fn, "__module__", None))
    remember_places(fn)
    try:
        return cloudpickle.dumps(fn)
    except Exception as exc:  # whatever cloudpickle refuses, named for the user
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        raise TypeError(f"remote: {name} cannot be shipped to a worker ({type(exc).__name__}: "
                        f"{exc}); what it uses from outside (its closure, its module's "
                        "globals) must pickle: make locks, files and connections inside "
                        "the function") from exc


def by_value(name: str | None) -> None:
    """Have cloudpickle ship module `name`'s code by value if it is the user's own (not
    installed, so workers lack it)."""
    if (name or "").partition(".")[0] == "mwrt":  # every worker has it, installed or not
        return
    module = sys.modules.get(name or "")
    path = getattr(module, "__file__", None) or ""
    installed = any(path.startswith(p) for p in (sys.prefix, sys.base_prefix, *site_paths()))
    if module is not None and path and not installed:
        cloudpickle.register_pickle_by_value(module)


def site_paths() -> list[str]:
    import site

    return [*site.getsitepackages(), site.getusersitepackages()]


def _specs(spec, outputs: int) -> list:
    """The declared (shape, dtype) of each output, or None where it is left to the worker."""
    if spec is None:
        return [None] * outputs
    specs = [spec] if outputs == 1 else list(spec)
    if len(specs) != outputs:
        raise ValueError(f"remote: spec names {len(specs)} outputs (expected {outputs})")
    return [Spec(tuple(shape), as_dtype(dtype)) for shape, dtype in specs]

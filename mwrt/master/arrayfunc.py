"""NumPy's protocols on DistributedTensors: ufuncs (__array_ufunc__) as registry ops, and
other NumPy functions (__array_function__): np.linalg.inv(t), np.fft.fft(t),
np.concatenate([a, b]), np.einsum(...) run on the worker that holds every tensor argument,
and return DistributedTensors (a tuple of them for eigh, svd, qr...).

Where the function is a registry op (np.sum, np.reshape, np.concatenate) it is issued as
that op; otherwise as the `numpy` op by module path, which the worker looks up in its
array namespace (numpy.linalg.inv -> cupy.linalg.inv on a GPU). A meta rule gives the
result's shape at once where mwrt has one (mwrt.ops.numpy_functions.RULES); else it is asked of the
worker when first needed. A few functions belong on the master: shape queries answer from
the shape the master knows, file writers and printers copy the values here first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import ops
from ..ops import Spec, numpy_functions
from . import context, transfer
from .handle import Handle, check_same_place
from .issue import call
from .issue import call as _call
from .mesh import dispatch, einsums, fallback, moves, products
from .mesh.placement import PlacementError
from .remote import RemoteFunction

# Asked of shape and dtype only: answered on the master from broadcast one-element stand-ins.
_SPEC_ONLY = {"shape", "ndim", "size", "result_type", "can_cast", "min_scalar_type",
              "iscomplexobj", "isrealobj", "einsum_path"}
# Asked whether two arrays overlap: answered from the handles' storage records.
_OVERLAP = {np.may_share_memory, np.shares_memory}
# Write files or text on the master: run there on copies of the values.
_ON_MASTER = {"save", "savez", "savez_compressed", "savetxt", "array_repr", "array_str",
              "array2string"}
# Change their first argument in place: the numpy_ op, which the master orders as a write.
_IN_PLACE = {"copyto", "fill_diagonal", "put", "place", "putmask", "put_along_axis"}
# Registry ops that are not NumPy functions of the same meaning.
# (np.copy of a scalar is an array, where its copy() method, the registry op, gives a scalar)
_NOT_FUNCTIONS = {"getitem", "setitem", "to_device", "numpy", "numpy_", "copy"}

# ufunc.reduce -> the reduction with the same meaning
_UFUNC_REDUCE = {"add": "sum", "multiply": "prod", "minimum": "min", "maximum": "max",
                 "logical_and": "all", "logical_or": "any"}

_PATHS: dict = {}
_BINDS: dict[tuple, bool] = {}  # (op, how many args, kwargs' names) -> the impl takes them


def array_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, out: Any, kwargs: dict,
                call: Callable = call) -> Any:
    """A NumPy ufunc on tensors (np.exp(t), np.add(t, 1, out=t), np.add.reduce(t)) as the
    registry op of the same name, on the worker (mesh tensors pass their own `call`); out= is
    written in place, as NumPy writes it (where= leaves its other places as they were)."""
    name = ufunc.__name__
    if out is not None and any(isinstance(o, np.ndarray) for o in
                               (out if isinstance(out, tuple) else (out,))):
        # NumPy writes into the master's array (b += t): NumPy runs it here, on the values
        return getattr(ufunc, method)(*_values(inputs), out=out, **_values(kwargs))
    if getattr(np, name, None) is not ufunc and method == "__call__":
        return _foreign_ufunc(ufunc, inputs, out, kwargs)
    for value in inputs:  # a list operand is NumPy's array of it (rare: no generator else)
        if type(value) is list or type(value) is tuple:
            inputs = tuple(np.asarray(v) if type(v) in (list, tuple) else v for v in inputs)
            break
    if out is not None:
        out = out[0] if isinstance(out, tuple) and len(out) == 1 else out
        if call is not _call:  # a mesh's call: the result copied into out
            return _copy_into(ufunc, method, inputs, out, kwargs, call)
        kwargs["out"] = out
    if method == "reduce" and name in _UFUNC_REDUCE:
        kwargs.setdefault("axis", 0)  # ufunc.reduce's default, unlike sum()'s
        return call(_UFUNC_REDUCE[name], *inputs, **kwargs)
    if method == "at":
        if not isinstance(inputs[0], Handle):  # np.add.at(master_array, t, ...) writes it here
            ufunc.at(inputs[0], *_values(inputs[1:]), **_values(kwargs))
        else:
            call("ufunc_at_", inputs[0], name, *inputs[1:], **kwargs)
        return None
    if method != "__call__":
        return call("ufunc_method", name, method, *inputs, **kwargs)
    if (out is not None and inputs and out is inputs[0] and "where" not in kwargs
            and len(kwargs) == 1 and ops.has(f"{name}_")):
        call(f"{name}_", *inputs)  # the in-place op: replayed graphs call it directly
        return out
    if ufunc.signature and not _GUFUNC_KEYS.isdisjoint(kwargs) and out is None:
        # core dimensions placed by axis=/axes=/keepdims=: NumPy's by path, sized on the worker
        return call("numpy", name, 0, *inputs, **kwargs)
    return call(name, *inputs, **kwargs)


_GUFUNC_KEYS = frozenset({"axis", "axes", "keepdims"})


def _foreign_ufunc(ufunc: np.ufunc, inputs: tuple, out: Any, kwargs: dict) -> Any:
    """A ufunc of another library (scipy.special.erf(t)): shipped to run where the tensors
    live, as a NumPy function outside the registry is; out= a tensor is written after."""
    made = RemoteFunction(ufunc, outputs=ufunc.nout)(*inputs, **kwargs)
    if out is None:
        return made
    outs = out if isinstance(out, tuple) else (out,)
    for target, result in zip(outs, made if ufunc.nout > 1 else (made,)):
        target[...] = result
    return outs[0] if len(outs) == 1 else outs


def _copy_into(ufunc, method: str, inputs: tuple, out, kwargs: dict, call: Callable) -> Any:
    if method != "__call__" or "where" in kwargs:
        return NotImplemented
    if inputs and out is inputs[0] and ops.has(f"{ufunc.__name__}_"):
        call(f"{ufunc.__name__}_", *inputs, **kwargs)
    else:
        out.copy_(call(ufunc.__name__, *inputs, **kwargs))
    return out


def path_of(func: Callable) -> str | None:
    """The path of a NumPy function under `numpy` ("linalg.inv"), or None if it has none."""
    if not _PATHS:
        for prefix, module in (("", np), ("linalg.", np.linalg), ("fft.", np.fft)):
            for name in dir(module):
                obj = getattr(module, name, None)
                if name.startswith("_") or not callable(obj) or isinstance(obj, type):
                    continue
                known = _PATHS.get(obj)  # of aliases (concat, concatenate), the true name
                if known is None or (known.rsplit(".", 1)[-1] != obj.__name__ == name):
                    _PATHS[obj] = prefix + name
    path = _PATHS.get(func)
    if path is None:
        where, name = getattr(func, "__module__", "") or "", getattr(func, "__name__", "")
        path = ".".join([*where.split(".")[1:], name])
        if where.split(".")[0] != "numpy" or _lookup(path) is not func:
            return None
    return path if numpy_functions.public(path) else None


def _lookup(path: str):
    obj: Any = np
    for part in path.split("."):
        if part.startswith("_"):
            return None
        obj = getattr(obj, part, None)
    return obj


def array_function(func: Callable, args: tuple, kwargs: dict, like: Any = None) -> Any:
    """Run NumPy function `func` for tensors among `args`/`kwargs` (see the module's doc);
    `like`: the tensor NumPy asked, which without tensors among them is np.f(..., like=t)."""
    if like is not None and not _holds_tensor((args, kwargs)):
        return _made_like(like, func, args, kwargs)
    if func in _PYTHON_BOOLS:  # NumPy answers a Python bool: the tensors' answer, read here
        return bool(_array_function(func, args, kwargs))  # (one wait, as torch.equal's)
    return _array_function(func, args, kwargs)


_PYTHON_BOOLS = {np.allclose, np.array_equal, np.array_equiv}


def _may_share(a: Any, b: Any) -> bool:
    """Whether `a` and `b` may overlap: handles that view one storage (a view and its base,
    two views of one base; disjoint views of it too, where NumPy's shares_memory would look
    closer). A master array shares nothing with a worker's."""
    return isinstance(a, Handle) and isinstance(b, Handle) and a._storage is b._storage


def _array_function(func: Callable, args: tuple, kwargs: dict, shaped: bool = True) -> Any:
    """`func` on one place or a mesh; `shaped`: tuple results as NumPy's sequence (a mesh
    shapes them once its places' results are joined)."""
    if func in _OVERLAP:
        return _may_share(*args[:2])
    if _on_mesh((args, kwargs)):
        return _on_every_place(func, args, kwargs)
    path = path_of(func)
    label = f"np.{path}" if path else getattr(func, "__qualname__", repr(func))
    _one_place(label, (args, kwargs))
    name = getattr(func, "__name__", "")
    if path is None and name in _ON_MASTER | _SPEC_ONLY | _IN_PLACE:
        path = name if getattr(np, name, None) is func else None
    if path in _SPEC_ONLY:
        return func(*_standins(args), **_standins(kwargs))
    if path in _ON_MASTER:
        return func(*_values(args), **_values(kwargs))
    if path in _IN_PLACE:
        if not isinstance(args[0] if args else None, Handle):  # a master array
            return func(*_values(args), **_values(kwargs))
        call("numpy_", args[0], path, *args[1:], **kwargs)
        return None
    if path is not None and _is_registry_function(path, args, kwargs):
        return call(path, *args, **kwargs)
    if path is None or not numpy_functions.allowed(path):  # not run by name: ship the function
        _refuse_functions(label, (args, kwargs))
        return RemoteFunction(func)(*args, **kwargs)
    # 0: one array, shape unknown
    count = numpy_functions.RULED if path in numpy_functions.RULES else 0
    if path in numpy_functions.OUTPUTS:
        count = numpy_functions.outputs(path, _specs(args), _specs(kwargs))
    made = call("numpy", path, count, *args, **kwargs)
    return _sequence(path, kwargs, made) if shaped else made


# NumPy functions whose tuple of results is a named tuple (np.linalg.eigh(a).eigenvalues)
_NAMED = {"linalg.eig", "linalg.eigh", "linalg.qr", "linalg.slogdet", "linalg.svd",
          "unique_all", "unique_counts", "unique_inverse"}
_NAMED_TYPES: dict = {}  # (path, options) -> the class NumPy's function returns with them
_LISTS = {"split", "array_split", "hsplit", "vsplit", "dsplit"}  # NumPy's give lists


def _sequence(path: str, kwargs: dict, result: Any) -> Any:
    """`result`, a tuple of tensors, as the sequence NumPy's function returns: a list, or
    the named tuple for these options (found on a 1x1 identity: qr's "raw" gives a tuple)."""
    if type(result) is not tuple or path not in _NAMED | _LISTS | {"histogramdd"}:
        return result
    if path in _LISTS:
        return list(result)
    if path == "histogramdd":  # its edges, one tensor per dimension, in a list
        return result[0], list(result[1:])
    key = (path, *sorted(kwargs.items()))  # options only: these functions take one array
    kind = _NAMED_TYPES.get(key)
    if kind is None:
        kind = _NAMED_TYPES[key] = type(_lookup(path)(np.eye(1), **kwargs))
    fields = getattr(kind, "_fields", ())
    return kind(*result) if len(fields) == len(result) else result


def _refuse_functions(label: str, value) -> None:
    """A function among the arguments (np.apply_along_axis(np.sum, 1, t)) is never shipped
    implicitly: the TypeError says how to run the call."""
    if isinstance(value, (tuple, list)):
        for part in value:
            _refuse_functions(label, part)
    elif isinstance(value, dict):
        _refuse_functions(label, tuple(value.values()))
    elif callable(value) and not isinstance(value, (type, np.dtype, Handle)):
        name = getattr(value, "__name__", type(value).__name__)
        raise TypeError(f"{label}: takes a function ({name}), which mwrt does not send to a "
                        "worker by itself; run the whole call there, mwrt.remote(lambda a: "
                        f"{label}(...a...))(t), or here on t.numpy()")


def _holds_tensor(value) -> bool:
    found: list = []
    _walk(value, found.append)
    return bool(found)


def _made_like(like: Handle, func: Callable, args: tuple, kwargs: dict) -> Any:
    """np.zeros(3, like=t), NumPy's creation by a reference array (NEP 35): NumPy makes the
    array here, and a copy goes to t's place, as mwrt.dist_send(array, node=, device=)."""
    if like._mesh is not None or like.holds_torch:
        raise TypeError(f"np.{getattr(func, '__name__', func)}: like= takes a NumPy tensor on "
                        "one place (got a mesh or torch tensor); make the array, then "
                        "mwrt.dist_send(array, mesh=...) or mwrt.dist_send(torch tensor)")
    array = np.asarray(func(*args, **kwargs), order="C")  # keeps 0-d arrays 0-d
    node, device = like._node, like._device
    made = like.results(node, device, next(node.ids), Spec(array.shape, array.dtype),
                        context.stream_for(node.index, device))
    transfer.send(made, array)
    return made


def _on_mesh(value) -> bool:
    """True if a mesh tensor is among `value`'s tensors."""
    found: list = []
    _walk(value, found.append)
    return any(t._mesh is not None for t in found)


_PLANS = {"kron": products.kron, "einsum": einsums.einsum}  # NumPy functions with mesh plans


def _on_every_place(func: Callable, args: tuple, kwargs: dict) -> Any:
    """A NumPy function on mesh tensors: a registry op by its placement rule; any other
    function at every place on replicated tensors (or a PlacementError naming the fix)."""
    path = path_of(func)
    operands: list = []
    margs, mkwargs = dispatch.mark(args, operands, "np.function"), \
        dispatch.mark(kwargs, operands, "")
    name = getattr(func, "__name__", "")
    if name in _SPEC_ONLY or name in _ON_MASTER:  # shapes; printing
        known = [np.broadcast_to(np.zeros((), t.dtype), t.shape)
                 if name in _SPEC_ONLY else t.numpy() for t in operands]
        return func(*dispatch.fill(margs, known), **dispatch.fill(mkwargs, known))
    if path is not None and _is_registry_function(path, args, kwargs):
        return dispatch.call(path, *args, **kwargs)
    label = f"np.{path}" if path else getattr(func, "__qualname__", repr(func))

    def again(local):
        plan = _PLANS.get(path or "")  # its plan; any other runs on replicated operands
        made = None if plan is None else plan(local, margs, mkwargs, numpy_functions.RULED)
        return made if made is not None else moves.per_place(
            label, local, lambda blocks: _array_function(
                func, dispatch.fill(margs, blocks), dispatch.fill(mkwargs, blocks), False))
    try:
        return _sequence(path or "", kwargs, again(operands))
    except PlacementError as error:
        # a function that writes an argument would write a copy: it stays an error
        if name in dispatch.WRITING_FUNCTIONS or "out" in kwargs or \
                not fallback.applies(error):
            raise
        return _sequence(path or "", kwargs,
                         fallback.run(label, operands, None, again, dispatch.call, error))


def _is_registry_function(path: str, args: tuple, kwargs: dict) -> bool:
    """True if registry op `path` is NumPy's function of that name and its implementation
    takes these arguments (np.where(c) and np.round(t, decimals=2) take the general path)."""
    if not ops.has(path) or path in _NOT_FUNCTIONS or ops.get(path).inplace:
        return False
    key = (path, len(args), *kwargs)
    binds = _BINDS.get(key)
    if binds is None:
        try:
            inspect.signature(ops.get(path).impl).bind(None, *args, **kwargs)
            binds = True
        except TypeError:
            binds = False
        _BINDS[key] = binds
    return binds


def _walk(value, leaf):
    """`value` with every DistributedTensor in it (in tuples, lists, dicts) replaced by
    leaf(tensor)."""
    if isinstance(value, Handle):
        return leaf(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_walk(v, leaf) for v in value)
    if isinstance(value, dict):
        return {k: _walk(v, leaf) for k, v in value.items()}
    return value


def _one_place(label: str, value) -> list:
    """The tensors in `value`; a ValueError naming both places if they are not all in one."""
    found: list = []
    _walk(value, found.append)
    for tensor in found[1:]:
        check_same_place(found[0], tensor, f"{label}: arguments",
                         "move them to one place with .to(node=, device=) first")
    return found


def _specs(value):
    return _walk(value, lambda t: t.spec)


def _values(value):
    return _walk(value, lambda t: t.numpy())


def _standins(value):
    """Tensors as read-only arrays of their shape and dtype that take one element of memory."""
    return _walk(value, lambda t: np.broadcast_to(np.zeros((), t.dtype), t.shape))

"""NumPy functions by module path ("linalg.inv", "fft.rfft", "einsum"), for __array_function__.

One op, `numpy`, runs `xp.<path>(*args, **kwargs)` on the worker: numpy.linalg.inv becomes
cupy.linalg.inv on a GPU. Its meta rule is the function's entry in RULES when it has one (a
shape rule in numpy_shape_rules.py, the dtype found by running NumPy on probes of two elements per
axis), so the result's shape is known at once; any other public NumPy function runs with its
shape left to the worker (UNKNOWN), asked for when first needed. The master passes the number
of results (`outputs`) of those, so a function returning a tuple gets one tensor per array.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from . import numpy_allowlist
from .meta_helpers import shape_of
from .registry import UNKNOWN, Spec, register

# Which paths the master names a function by (it ships the others); a worker runs only
# those numpy_allowlist.py lists.
NAMESPACES = ("linalg.", "fft.", "lib.stride_tricks.")
RULED = -1  # `outputs` of a function with a meta rule: the rule's result says how many
RULES: dict[str, Callable] = {}  # path -> meta rule: a Spec, or a tuple of them
SHAPES: dict[str, Callable] = {}  # path -> its rule's shape part (the worker sizes with it)
OUTPUTS: dict[str, Callable] = {}  # path -> count of results, for functions without a rule


def public(path: str) -> bool:
    """True if np.<path> is a public function of NumPy's namespace or one of NAMESPACES."""
    name = path.rpartition(".")[2]
    within = "." not in path or any(path == p + name for p in NAMESPACES)
    return within and name.isidentifier() and not name.startswith("_")


def allowed(path: str) -> bool:
    """True if np.<path> may run by name on a worker (mwrt/ops/numpy_allowlist.py lists it)."""
    return numpy_allowlist.allowed(path)


def resolve(xp, path: str, inplace: bool = False):
    """The function at `path` ("linalg.inv") in namespace `xp`; refuses what is not listed."""
    if isinstance(path, str) and not numpy_allowlist.allowed(path, inplace) and public(path) \
            and isinstance(getattr(np, path, None), type):
        raise TypeError(f"np.{path}: not a function (got type), so not a NumPy function mwrt "
                        "runs by name on a worker")
    return numpy_allowlist.resolve(xp, path, inplace)


def _on_device(xp, value):
    """NumPy arrays sent from the master, as arrays of `xp` (a GPU function refuses them)."""
    if type(value) is np.ndarray:
        return xp.asarray(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_on_device(xp, v) for v in value)
    if isinstance(value, dict):
        return {k: _on_device(xp, v) for k, v in value.items()}
    return value


def as_lists(value):
    """`value` with its tuples as lists: np.block's nesting, which the wire sends as tuples."""
    if isinstance(value, (tuple, list)):
        return [as_lists(v) for v in value]
    return value


def _impl(xp, path: str, outputs: int, *args, **kwargs):
    if xp is not np:
        args, kwargs = _on_device(xp, args), _on_device(xp, kwargs)
    if path == "block":  # np.block arranges lists only
        args = (as_lists(args[0]), *args[1:])
    if isinstance(kwargs.get("axes"), tuple) and isinstance(getattr(np, path, None), np.ufunc):
        kwargs["axes"] = list(kwargs["axes"])  # a gufunc's axes= is a list (the wire's tuple)
    result = resolve(xp, path)(*args, **kwargs)
    if path == "histogramdd":  # (hist, [edges per dimension]): one tensor each
        result = (result[0], *result[1])
    if outputs == RULED:  # the meta rule, run on the master, told it how many
        return tuple(result) if isinstance(result, (tuple, list)) else result
    if outputs == 0:  # one array
        if isinstance(result, (tuple, list)):
            raise TypeError(f"np.{path}: returned {len(result)} arrays (expected one); mwrt "
                            "knows no result count for it: use mwrt.remote(fn, outputs=n)")
        return result
    if not isinstance(result, (tuple, list)) or len(result) != outputs:
        raise TypeError(f"np.{path}: returned {type(result).__name__} (expected a tuple of "
                        f"{outputs} arrays)")
    return tuple(result) if outputs > 1 else result[0]  # the worker stores one result bare


def _meta(path: str, outputs: int, *args, **kwargs):
    rule = RULES.get(path)
    if rule is None:
        return UNKNOWN if outputs == 0 else (UNKNOWN,) * outputs
    return rule(*args, **kwargs)


def outputs(path: str, args: tuple, kwargs: dict) -> int:
    """What np.<path> returns for these arguments (Specs for tensors): RULED where a meta rule
    says, else 0 for one array or n for a tuple of n."""
    if path in RULES:
        return RULED
    count = OUTPUTS.get(path)
    return 0 if count is None else count(*args, **kwargs)


def _inplace_impl(xp, target, path: str, *args, **kwargs):
    if xp is not np:
        args, kwargs = _on_device(xp, args), _on_device(xp, kwargs)
    resolve(xp, path, inplace=True)(target, *args, **kwargs)


def gives_scalar(path: str, outputs: int, *args, **kwargs) -> bool:
    """Whether np.<path>(*args) gives NumPy scalars where its results are 0-d (np.dot of two
    vectors, np.linalg.norm), not 0-d arrays (np.copy of one): as its probe did."""
    return path in RULES and _probed(path, args, kwargs)[1]


register("numpy", _impl, _meta, scalar=gives_scalar,
         doc="A NumPy function by module path, on the tensors' worker.")
# np.copyto(dst, src), np.fill_diagonal(a, v)…: the function changes its first argument.
register("numpy_", _inplace_impl, lambda target, path, *args, **kwargs: None, inplace=True,
         doc="A NumPy function that changes its first argument, by module path, in place.")


# -- rules (numpy_shape_rules.py): shapes by hand, dtypes by NumPy on small probes ---------------

def _probe(value, n: int = 2):
    """A small well-behaved stand-in of a Spec's dtype and ndim: identity matrices (invertible,
    positive definite), `n` elements on each axis (an inverse real FFT needs two)."""
    if isinstance(value, Spec):
        ndim = len(value.shape)
        if ndim < 2:
            return np.ones((n,) * ndim, dtype=value.dtype)
        return np.broadcast_to(np.eye(n, dtype=value.dtype), (n,) * ndim).copy()
    if isinstance(value, (tuple, list)):
        return type(value)(_probe(v, n) for v in value)
    return value


def _key(value):
    if isinstance(value, Spec):
        return ("spec", value.dtype, len(value.shape))
    if isinstance(value, (tuple, list)):
        return tuple(_key(v) for v in value)
    return value


def _run_probe(path: str, args: tuple, kwargs: dict) -> tuple:
    fn = resolve(np, path)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            out = fn(*_probe(args), **{k: _probe(v) for k, v in kwargs.items()})
        except ValueError:  # sizes the function compares (vdot of 0-d and (1,)): one each
            out = fn(*_probe(args, 1), **{k: _probe(v, 1) for k, v in kwargs.items()})
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(np.asarray(o).dtype for o in outs), all(isinstance(o, np.generic) for o in outs)


_CACHE: dict = {}


def _result_dtypes(path: str, args: tuple, kwargs: dict) -> tuple:
    """NumPy's result dtypes for np.<path>(*args) on probes (cached by dtypes and ndims)."""
    return _probed(path, args, kwargs)[0]


def _probed(path: str, args: tuple, kwargs: dict) -> tuple:
    """(dtypes, all scalars) of np.<path>(*args) on probes (cached by dtypes and ndims)."""
    key = (path, _key(args), tuple(sorted(kwargs.items())))
    try:
        hit = _CACHE.get(key)
    except TypeError:  # a list among the arguments: run the probe uncached
        return _run_probe(path, args, kwargs)
    if hit is None:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        hit = _CACHE[key] = _run_probe(path, args, kwargs)
    return hit


def rule(*paths: str):
    """Register a shape rule for np.<path> (each of `paths`); the dtype comes from a probe."""
    def deco(shape_fn):
        for path in paths:
            def meta(*args, _path=path, **kwargs):
                shapes = shape_fn(*args, **kwargs)
                if shapes is UNKNOWN:
                    return UNKNOWN
                dtypes = _result_dtypes(_path, args, kwargs)
                if isinstance(shapes, list):
                    return tuple(Spec(tuple(s), d) for s, d in zip(shapes, dtypes, strict=True))
                return Spec(tuple(shapes), dtypes[0])
            RULES[path] = meta
            SHAPES[path] = shape_fn
        return shape_fn
    return deco


# -- result counts of functions without a rule: n for a tuple of n, 0 for one array -----

def _ndim(a, *args, **kwargs):
    return len(shape_of(a))


def _flags(*names):
    def count(*args, **kwargs):
        n = 1 + sum(bool(kwargs.get(name)) for name in names)
        return n if n > 1 else 0
    return count


def _option(args: tuple, kwargs: dict, place: int, name: str) -> bool:
    """Whether flag `name`, the argument at `place` (0-based), is set."""
    return bool(args[place] if len(args) > place else kwargs.get(name))


def _dimensions(sample) -> int:
    """histogramdd's dimensions: an array's last axis, or a sequence's length."""
    if isinstance(sample, (tuple, list)) and not isinstance(sample, Spec):
        return len(sample)
    shape = shape_of(sample)
    return shape[-1] if len(shape) > 1 else 1


def _gradient(f, *varargs, axis=None, **kwargs):
    n = _ndim(f) if axis is None else len(axis) if isinstance(axis, tuple) else 1
    return n if n > 1 else 0


OUTPUTS.update({
    "linalg.eig": lambda *a, **k: 2, "linalg.lstsq": lambda *a, **k: 4,
    "nonzero": _ndim, "diag_indices_from": _ndim,
    "where": lambda *args, **kwargs: _ndim(args[0]) if len(args) == 1 else 0,
    "unique": _flags("return_index", "return_inverse", "return_counts"),
    "unique_counts": lambda *a, **k: 2, "unique_inverse": lambda *a, **k: 2,
    "unique_all": lambda *a, **k: 4,
    "histogram": lambda *a, **k: 2, "histogram2d": lambda *a, **k: 3,
    "histogramdd": lambda sample, *a, **k: 1 + _dimensions(sample),
    "intersect1d": lambda *a, **k: 3 if _option(a, k, 3, "return_indices") else 0,
    "average": lambda *a, **k: 2 if _option(a, k, 3, "returned") else 0,
    "tril_indices_from": lambda *a, **k: 2,
    "triu_indices_from": lambda *a, **k: 2, "gradient": _gradient,
    "meshgrid": lambda *args, **kwargs: len(args), "broadcast_arrays": lambda *a, **k: len(a),
    "unravel_index": lambda indices, shape, **kwargs: len(shape),
})

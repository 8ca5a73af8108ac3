"""NumPy functions by module path ("linalg.inv", "fft.rfft", "einsum"), for __array_function__.

One op, `numpy`, runs `xp.<path>(*args, **kwargs)` on the worker: numpy.linalg.inv becomes
cupy.linalg.inv on a GPU. Its meta rule is the function's entry in RULES when it has one (a
shape rule here, the dtype found by running NumPy on probes of two elements per axis), so the
result's shape is known at once; any other public NumPy function runs with its shape left to
the worker (UNKNOWN), asked for when first needed. The master passes the number of results
(`outputs`) of those, so a function returning a tuple gets one tensor per array.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np

from . import UNKNOWN, Spec, register
from ._meta import normalize_axes, shape_of, standin
from .misc import matmul_meta

# Where a path may lead: NumPy's own namespace and these of its submodules (not ctypeslib,
# testing, lib.npyio…: nothing that loads libraries or opens files).
NAMESPACES = ("linalg.", "fft.", "lib.stride_tricks.")
# File I/O: never run by name on a worker (the master runs them on copies).
REFUSED = {"save", "savez", "savez_compressed", "savetxt", "load", "loadtxt", "genfromtxt",
           "fromfile", "fromregex", "memmap", "tofile"}
RULED = -1  # `outputs` of a function with a meta rule: the rule's result says how many
RULES: dict[str, Callable] = {}  # path -> shape rule: a shape, or a list of them (tuple result)
OUTPUTS: dict[str, Callable] = {}  # path -> count of results, for functions without a rule


def allowed(path: str) -> bool:
    """True if np.<path> may run by name on a worker: a public function of NumPy's namespace
    or of one of NAMESPACES, and no file I/O."""
    name = path.rpartition(".")[2]
    within = "." not in path or any(path == p + name for p in NAMESPACES)
    return within and name.isidentifier() and not name.startswith("_") and name not in REFUSED


def resolve(xp, path: str):
    """The function at `path` ("linalg.inv") in namespace `xp`; refuses what `allowed` does."""
    if not allowed(path):
        raise ValueError(f"np.{path}: not a NumPy function mwrt runs by name on a worker; run "
                         "it on the master on t.numpy(), or with mwrt.remote")
    fn = xp
    for part in path.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise AttributeError(f"np.{path}: {getattr(xp, '__name__', xp)} has no {path} on "
                                 "this worker; .cpu() the tensor, or use mwrt.remote")
    if isinstance(fn, type) or not callable(fn):
        raise TypeError(f"np.{path}: not a function (got {type(fn).__name__})")
    return fn


def _on_device(xp, value):
    """NumPy arrays sent from the master, as arrays of `xp` (a GPU function refuses them)."""
    if type(value) is np.ndarray:
        return xp.asarray(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_on_device(xp, v) for v in value)
    if isinstance(value, dict):
        return {k: _on_device(xp, v) for k, v in value.items()}
    return value


def _impl(xp, path: str, outputs: int, *args, **kwargs):
    if xp is not np:
        args, kwargs = _on_device(xp, args), _on_device(xp, kwargs)
    result = resolve(xp, path)(*args, **kwargs)
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
    resolve(xp, path)(target, *args, **kwargs)


register("numpy", _impl, _meta, doc="A NumPy function by module path, on the tensors' worker.")
# np.copyto(dst, src), np.fill_diagonal(a, v)…: the function changes its first argument.
register("numpy_", _inplace_impl, lambda target, path, *args, **kwargs: None, inplace=True,
         doc="A NumPy function that changes its first argument, by module path, in place.")


# -- rules: shapes by hand, dtypes by NumPy on one-element probes ---------------------------

def _probe(value):
    """A small well-behaved stand-in of a Spec's dtype and ndim: identity matrices (invertible,
    positive definite), two elements on each axis (an inverse real FFT needs two)."""
    if isinstance(value, Spec):
        ndim = len(value.shape)
        if ndim < 2:
            return np.ones((2,) * ndim, dtype=value.dtype)
        return np.broadcast_to(np.eye(2, dtype=value.dtype), (2,) * ndim).copy()
    if isinstance(value, (tuple, list)):
        return type(value)(_probe(v) for v in value)
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
        out = fn(*_probe(args), **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(np.asarray(o).dtype for o in outs)


_CACHE: dict = {}


def _result_dtypes(path: str, args: tuple, kwargs: dict) -> tuple:
    """NumPy's result dtypes for np.<path>(*args) on probes (cached by dtypes and ndims)."""
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
        return shape_fn
    return deco


def _matrix(name: str, a, square: bool = False) -> tuple:
    shape = shape_of(a)
    if len(shape) < 2:
        raise np.linalg.LinAlgError(f"np.linalg.{name}: {len(shape)}-dimensional array given "
                                    "(expected at least 2 dimensions)")
    if square and shape[-1] != shape[-2]:
        raise np.linalg.LinAlgError(f"np.linalg.{name}: last 2 dimensions of the array must "
                                    f"be square (got shape {shape})")
    return shape


@rule("linalg.inv", "linalg.cholesky", "linalg.matrix_power")
def _square_same(a, *args, **kwargs):
    return _matrix("inv", a, square=True)


@rule("linalg.pinv")
def _pinv(a, *args, **kwargs):
    shape = _matrix("pinv", a)
    return shape[:-2] + (shape[-1], shape[-2])


@rule("linalg.det")
def _det(a):
    return _matrix("det", a, square=True)[:-2]


@rule("linalg.slogdet")
def _slogdet(a):
    batch = _matrix("slogdet", a, square=True)[:-2]
    return [batch, batch]


@rule("linalg.cond", "linalg.matrix_rank")
def _batch(a, *args, **kwargs):
    shape = shape_of(a)
    return shape[:-2] if len(shape) >= 2 else ()


@rule("linalg.eigh")
def _eigh(a, UPLO="L"):
    shape = _matrix("eigh", a, square=True)
    return [shape[:-1], shape]


@rule("linalg.eigvalsh")
def _eigvalsh(a, UPLO="L"):
    return _matrix("eigvalsh", a, square=True)[:-1]


@rule("linalg.svd")
def _svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    shape = _matrix("svd", a)
    batch, (m, n) = shape[:-2], shape[-2:]
    k = min(m, n)
    if not compute_uv:
        return batch + (k,)
    if full_matrices:
        return [batch + (m, m), batch + (k,), batch + (n, n)]
    return [batch + (m, k), batch + (k,), batch + (k, n)]


@rule("linalg.qr")
def _qr(a, mode="reduced"):
    shape = _matrix("qr", a)
    batch, (m, n) = shape[:-2], shape[-2:]
    k = min(m, n)
    if mode == "r":
        return batch + (k, n)
    if mode == "complete":
        return [batch + (m, m), batch + (m, n)]
    if mode == "reduced":
        return [batch + (m, k), batch + (k, n)]
    return UNKNOWN  # "raw": the shapes of (h, tau) are left to the worker


@rule("linalg.svdvals")
def _svdvals(x):
    shape = _matrix("svdvals", x)
    return shape[:-2] + (min(shape[-2:]),)


@rule("linalg.matrix_norm")
def _matrix_norm(x, keepdims=False, ord="fro"):
    shape = _matrix("matrix_norm", x)
    return shape[:-2] + ((1, 1) if keepdims else ())


@rule("linalg.matrix_transpose")
def _matrix_transpose(x):
    shape = _matrix("matrix_transpose", x)
    return shape[:-2] + (shape[-1], shape[-2])


@rule("vdot")
def _vdot(a, b):
    return ()


@rule("inner")
def _inner(a, b):
    sa, sb = shape_of(a), shape_of(b)
    if sa and sb and sa[-1] != sb[-1]:
        raise ValueError(f"np.inner: last dimensions differ (got shapes {sa} and {sb})")
    return sa[:-1] + sb[:-1]


@rule("linalg.solve")
def _solve(a, b):
    sa, sb = _matrix("solve", a, square=True), shape_of(b)
    if len(sb) == 1:
        if sb[0] != sa[-1]:
            raise ValueError(f"np.linalg.solve: b has {sb[0]} rows (expected {sa[-1]}, as a)")
        return sa[:-1]
    if len(sb) < 2 or sb[-2] != sa[-1]:
        raise ValueError(f"np.linalg.solve: shapes {sa} and {sb} do not match (b's second "
                         f"to last axis must be {sa[-1]})")
    return np.broadcast_shapes(sa[:-2], sb[:-2]) + sb[-2:]


@rule("linalg.norm", "linalg.vector_norm")
def _norm(x, ord=None, axis=None, keepdims=False):
    shape = shape_of(x)
    axes = normalize_axes(axis, len(shape), "np.linalg.norm")
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _axis_len(shape, axis, n, name):
    ax = normalize_axes(axis, len(shape), f"np.fft.{name}")[0]
    return ax, shape[ax]


@rule("fft.fft", "fft.ifft")
def _fft(a, n=None, axis=-1, norm=None):
    shape = list(shape_of(a))
    ax, m = _axis_len(shape, axis, n, "fft")
    shape[ax] = m if n is None else n
    return tuple(shape)


@rule("fft.rfft", "fft.ihfft")
def _rfft(a, n=None, axis=-1, norm=None):
    shape = list(shape_of(a))
    ax, m = _axis_len(shape, axis, n, "rfft")
    shape[ax] = (m if n is None else n) // 2 + 1
    return tuple(shape)


@rule("fft.irfft", "fft.hfft")
def _irfft(a, n=None, axis=-1, norm=None):
    shape = list(shape_of(a))
    ax, m = _axis_len(shape, axis, n, "irfft")
    shape[ax] = 2 * (m - 1) if n is None else n
    return tuple(shape)


def _nd(shape, s, axes, default_axes):
    if axes is None:
        axes = default_axes if s is None or default_axes is not None else \
            tuple(range(-len(s), 0))
    axes = [a % len(shape) for a in (axes if axes is not None else range(len(shape)))]
    return axes, (list(s) if s is not None else [shape[a] for a in axes])


def _nd_rule(real: str, default_axes):
    def shape_fn(a, s=None, axes=None, norm=None):
        shape = list(shape_of(a))
        axes_, sizes = _nd(shape, s, axes, default_axes)
        for ax, size in zip(axes_, sizes, strict=True):
            shape[ax] = size
        last = axes_[-1]
        if real == "forward":
            shape[last] = sizes[-1] // 2 + 1
        elif real == "inverse":
            shape[last] = s[-1] if s is not None else 2 * (sizes[-1] - 1)
        return tuple(shape)
    return shape_fn


rule("fft.fftn", "fft.ifftn")(_nd_rule("", None))
rule("fft.fft2", "fft.ifft2")(_nd_rule("", (-2, -1)))
rule("fft.rfftn")(_nd_rule("forward", None))
rule("fft.rfft2")(_nd_rule("forward", (-2, -1)))
rule("fft.irfftn")(_nd_rule("inverse", None))
rule("fft.irfft2")(_nd_rule("inverse", (-2, -1)))
rule("fft.fftshift", "fft.ifftshift")(lambda x, axes=None: shape_of(x))
RULES["linalg.matmul"] = matmul_meta  # NumPy's matmul rule gives the Spec itself


@rule("einsum")
def _einsum(subscripts, *operands, **kwargs):
    if not isinstance(subscripts, str) or "..." in subscripts:
        return UNKNOWN  # ellipses and the interleaved form: shapes left to the worker
    inputs, _, output = subscripts.replace(" ", "").partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"np.einsum: {subscripts!r} names {len(terms)} operands (got "
                         f"{len(operands)})")
    sizes: dict = {}
    for term, operand in zip(terms, operands):
        shape = shape_of(operand)
        if len(term) != len(shape):
            raise ValueError(f"np.einsum: term {term!r} has {len(term)} labels for an operand "
                             f"of shape {shape}")
        for label, size in zip(term, shape):
            if sizes.setdefault(label, size) != size and 1 not in (size, sizes[label]):
                raise ValueError(f"np.einsum: label {label!r} has sizes {sizes[label]} and "
                                 f"{size}")
            sizes[label] = max(sizes[label], size)
    if "->" not in subscripts:
        output = "".join(sorted(c for c in sizes if inputs.count(c) == 1))
    return tuple(sizes[c] for c in output)


@rule("outer")
def _outer(a, b, out=None):
    return (math.prod(shape_of(a)), math.prod(shape_of(b)))


@rule("kron")
def _kron(a, b):
    sa, sb = shape_of(a), shape_of(b)
    n = max(len(sa), len(sb))
    sa, sb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
    return tuple(x * y for x, y in zip(sa, sb))


@rule("diag")
def _diag(v, k=0):
    shape = shape_of(v)
    if len(shape) == 1:
        return (shape[0] + abs(k),) * 2
    return np.diagonal(standin(Spec(shape, None)), k).shape


# -- result counts of functions without a rule: n for a tuple of n, 0 for one array -----

def _ndim(a, *args, **kwargs):
    return len(shape_of(a))


def _flags(*names):
    def count(*args, **kwargs):
        n = 1 + sum(bool(kwargs.get(name)) for name in names)
        return n if n > 1 else 0
    return count


def _gradient(f, *varargs, axis=None, **kwargs):
    n = _ndim(f) if axis is None else len(axis) if isinstance(axis, tuple) else 1
    return n if n > 1 else 0


OUTPUTS.update({
    "linalg.eig": lambda *a, **k: 2, "linalg.lstsq": lambda *a, **k: 4,
    "nonzero": _ndim, "diag_indices_from": _ndim,
    "where": lambda *args, **kwargs: _ndim(args[0]) if len(args) == 1 else 0,
    "unique": _flags("return_index", "return_inverse", "return_counts"),
    "histogram": lambda *a, **k: 2, "histogram2d": lambda *a, **k: 3,
    "histogramdd": lambda *a, **k: 2, "tril_indices_from": lambda *a, **k: 2,
    "triu_indices_from": lambda *a, **k: 2, "gradient": _gradient,
    "meshgrid": lambda *args, **kwargs: len(args), "broadcast_arrays": lambda *a, **k: len(a),
    "unravel_index": lambda indices, shape, **kwargs: len(shape),
})

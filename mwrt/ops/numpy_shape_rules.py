"""Shape rules for NumPy functions by path (linalg, fft, einsum, outer, kron, diag): each gives
the result's shape from the arguments' Specs, raising what NumPy would for a bad shape; the
`rule` decorator adds the dtype NumPy gives on small probes (numpy_functions.py)."""

from __future__ import annotations

import math

import numpy as np

from .meta_helpers import normalize_axes, shape_of, shaped
from .misc import matmul_meta
from .numpy_functions import RULES, rule
from .registry import UNKNOWN


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
    if mode == "raw":  # (h, tau): h is LAPACK's, transposed
        return [batch + (n, m), batch + (k,)]
    raise ValueError(f"np.linalg.qr: unrecognized mode {mode!r} (expected 'reduced', "
                     "'complete', 'r' or 'raw')")


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
    na, nb = math.prod(shape_of(a)), math.prod(shape_of(b))
    if na != nb:
        raise ValueError(f"np.vdot: the operands have {na} and {nb} elements (expected as "
                         "many: vdot flattens both)")
    return ()


@rule("inner")
def _inner(a, b):
    sa, sb = shape_of(a), shape_of(b)
    if not sa or not sb:  # a 0-d operand multiplies
        return sa or sb
    if sa[-1] != sb[-1]:
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
    return np.diagonal(shaped(shape), k).shape

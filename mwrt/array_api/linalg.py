"""The standard's `linalg` extension: NumPy's (CuPy's on a GPU) linalg functions of the same
names, run on the worker that holds the tensors; tuple results as the standard's named
tuples."""

from __future__ import annotations

from typing import NamedTuple

from ..master.tensor import DistributedTensor
from ._functions import matmul, matrix_transpose, tensordot, vecdot
from ._run import run, wire_dtype

__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul",
           "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer", "pinv",
           "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace", "vecdot",
           "vector_norm"]


class EighResult(NamedTuple):
    """eigh's result."""

    eigenvalues: DistributedTensor
    eigenvectors: DistributedTensor


class QRResult(NamedTuple):
    """qr's result."""

    Q: DistributedTensor
    R: DistributedTensor


class SlogdetResult(NamedTuple):
    """slogdet's result."""

    sign: DistributedTensor
    logabsdet: DistributedTensor


class SVDResult(NamedTuple):
    """svd's result."""

    U: DistributedTensor
    S: DistributedTensor
    Vh: DistributedTensor


def cholesky(x, /, *, upper=False):
    """The Cholesky factor (lower, or upper if `upper`) of symmetric positive-definite `x`."""
    return run("linalg.cholesky", x, upper=upper)


def cross(x1, x2, /, *, axis=-1):
    """The cross product of 3-vectors along `axis`."""
    return run("linalg.cross", x1, x2, axis=axis)


def det(x, /):
    """The determinant of each square matrix."""
    return run("linalg.det", x)


def diagonal(x, /, *, offset=0):
    """The diagonal `offset` of each matrix (the last two axes)."""
    return run("linalg.diagonal", x, offset=offset)


def eigh(x, /) -> EighResult:
    """Eigenvalues (ascending) and eigenvectors of each Hermitian matrix."""
    return EighResult(*run("linalg.eigh", x))


def eigvalsh(x, /):
    """The eigenvalues (ascending) of each Hermitian matrix."""
    return run("linalg.eigvalsh", x)


def inv(x, /):
    """The inverse of each square matrix."""
    return run("linalg.inv", x)


def matrix_norm(x, /, *, keepdims=False, ord="fro"):
    """The norm `ord` of each matrix."""
    return run("linalg.matrix_norm", x, keepdims=keepdims, ord=ord)


def matrix_power(x, n, /):
    """Each square matrix raised to the integer power `n`."""
    return run("linalg.matrix_power", x, n)


def matrix_rank(x, /, *, rtol=None):
    """The rank of each matrix (singular values above `rtol` times the largest)."""
    return run("linalg.matrix_rank", x, rtol=rtol)


def outer(x1, x2, /):
    """The outer product of two vectors."""
    return run("linalg.outer", x1, x2)


def pinv(x, /, *, rtol=None):
    """The Moore-Penrose pseudo-inverse of each matrix."""
    return run("linalg.pinv", x, rtol=rtol)


def qr(x, /, *, mode="reduced") -> QRResult:
    """The QR factorization of each matrix ("reduced" or "complete")."""
    return QRResult(*run("linalg.qr", x, mode=mode))


def slogdet(x, /) -> SlogdetResult:
    """The sign and the log of the absolute value of each determinant."""
    return SlogdetResult(*run("linalg.slogdet", x))


def solve(x1, x2, /):
    """The solution of x1 @ result = x2 for each square x1."""
    return run("linalg.solve", x1, x2)


def svd(x, /, *, full_matrices=True) -> SVDResult:
    """U, S, Vh with x = U @ diag(S) @ Vh for each matrix."""
    return SVDResult(*run("linalg.svd", x, full_matrices=full_matrices))


def svdvals(x, /):
    """The singular values of each matrix, descending."""
    return run("linalg.svdvals", x)


def trace(x, /, *, offset=0, dtype=None):
    """The sum of diagonal `offset` of each matrix."""
    return run("linalg.trace", x, offset=offset, dtype=wire_dtype(dtype))


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    """The `ord`-norm over `axis` (all elements if None)."""
    return run("linalg.vector_norm", x, axis=axis, keepdims=keepdims, ord=ord)

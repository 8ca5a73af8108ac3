"""ReduceOp and the in-place NumPy reductions behind it."""

from __future__ import annotations

import enum

import numpy as np

from ..errors import ConfigError


class ReduceOp(enum.Enum):
    """How all_reduce, reduce and reduce_scatter combine values (torch.distributed names)."""

    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum,
           ReduceOp.MAX: np.maximum, ReduceOp.AVG: np.add, ReduceOp.BAND: np.bitwise_and,
           ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def reduce_op(op, dtype: np.dtype, what: str) -> ReduceOp:
    """Validate `op` (a ReduceOp or its name) for `dtype`; bitwise ops need integers/bools."""
    if isinstance(op, str):
        op = ReduceOp.__members__.get(op.upper(), op)
    if not isinstance(op, ReduceOp):
        raise ConfigError(f"{what}: op must be a ReduceOp (got {op!r}); use ReduceOp.SUM, "
                          f"one of {', '.join(ReduceOp.__members__)}")
    if op in _BITWISE and dtype.kind not in "iub":
        raise TypeError(f"{what}: ReduceOp.{op.name} needs an integer or bool dtype (got "
                        f"{dtype}); use SUM/MIN/MAX, or view the bits with arr.view(np.int32)")
    if op is ReduceOp.AVG and dtype.kind not in "fc":
        raise TypeError(f"{what}: ReduceOp.AVG needs a floating dtype (got {dtype}); use SUM "
                        "and divide, or cast to float")
    return op


def combine(op: ReduceOp, mine: np.ndarray, theirs: np.ndarray, mine_is_lower: bool):
    """mine = op(lower, higher) in place; the fixed order keeps results bitwise identical."""
    ufunc = _UFUNCS[op]
    if mine_is_lower:
        ufunc(mine, theirs, out=mine)
    else:
        ufunc(theirs, mine, out=mine)

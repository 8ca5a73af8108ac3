"""How the namespace's functions become remote ops: a registry op where mwrt has one with a
meta rule, else NumPy's (CuPy's on a GPU) function of the standard's name, run by path on
the worker that holds the arguments (the `numpy` op)."""

from __future__ import annotations

import numpy as np

from ..master.issue import call
from ..master.tensor import DistributedTensor
from ..ops import numpy_functions


def run(path: str, *args, outputs: int = 0, **kwargs):
    """np.<path>(*args, **kwargs) on the arguments' worker; `outputs` > 0 for a function
    without a meta rule that returns that many arrays (their shapes asked when needed)."""
    count = numpy_functions.RULED if path in numpy_functions.RULES else outputs
    return call("numpy", path, count, *args, **kwargs)


def op(name: str, *args, **kwargs):
    """Registry op `name` (its meta rule gives the result's shape at once)."""
    return call(name, *args, **kwargs)


def tensor(x, what: str) -> DistributedTensor:
    """`x` if it is a tensor; a TypeError naming the function otherwise."""
    if not isinstance(x, DistributedTensor):
        raise TypeError(f"{what}: expected an mwrt tensor (got {type(x).__name__}); make one "
                        "with xp.asarray(value, device=...)")
    return x


def wire_dtype(dtype) -> str | None:
    """A dtype argument as the wire carries it (NumPy's string), None staying None."""
    return None if dtype is None else np.dtype(dtype).str

"""The Array API standard over remote tensors: `t.__array_namespace__()` returns this module.

Every function and constant of the standard version NumPy declares
(`np.__array_api_version__`), and its `linalg` and `fft` extensions. Each function issues
remote ops on the worker that holds its tensors; creation functions take `device=` (a
`Device`: `t.device`), and `to_device(t, device)` moves. Array-API code (SciPy's,
scikit-learn's with `array_api_dispatch=True`) runs on mwrt tensors unchanged:

    import mwrt, mwrt.array_api as xp
    mwrt.init_master_worker()
    x = xp.asarray([[1.0, 2.0], [3.0, 4.0]], device=xp.Device(node=1))
    xp.linalg.inv(x).numpy()
"""

from __future__ import annotations

import math
import sys

import numpy as np

from ..master.issue import call
from ..master.tensor import set_array_namespace
from . import fft, linalg
from ._creation import (
    arange,
    asarray,
    astype,
    can_cast,
    empty,
    empty_like,
    eye,
    finfo,
    from_dlpack,
    full,
    full_like,
    iinfo,
    isdtype,
    linspace,
    meshgrid,
    ones,
    ones_like,
    result_type,
    to_device,
    tril,
    triu,
    zeros,
    zeros_like,
)
from ._functions import *  # noqa: F403 - the standard's functions, named in its __all__
from ._functions import __all__ as _function_names
from ._info import DTYPES, Device, Info
from ._run import run

__array_api_version__ = "2024.12"
if getattr(np, "__array_api_version__", __array_api_version__) != __array_api_version__:
    # The functions run NumPy's of the version it declares; say which one this is.
    __array_api_version__ = np.__array_api_version__

e, inf, nan, pi, newaxis = math.e, math.inf, math.nan, math.pi, None
# bool, int8 … complex128: NumPy's scalar types, as NumPy's namespace has them (a tensor's
# .dtype equals them; a dtype instance would also equal None, which NumPy reads as float64).
globals().update({name: dtype.type for name, dtype in DTYPES.items()})

# The standard's elementwise function -> NumPy's ufunc of that meaning (a registry op).
_UFUNCS = [
    "abs", "acos", "acosh", "add", "asin", "asinh", "atan", "atan2", "atanh", "bitwise_and",
    "bitwise_left_shift", "bitwise_invert", "bitwise_or", "bitwise_right_shift",
    "bitwise_xor", "ceil", "conj", "copysign", "cos", "cosh", "divide", "equal", "exp",
    "expm1", "floor", "floor_divide", "greater", "greater_equal", "hypot", "isfinite",
    "isinf", "isnan", "less", "less_equal", "log", "log1p", "log2", "log10", "logaddexp",
    "logical_and", "logical_not", "logical_or", "logical_xor", "maximum", "minimum",
    "multiply", "negative", "nextafter", "not_equal", "positive", "pow", "reciprocal",
    "remainder", "sign", "signbit", "sin", "sinh", "square", "sqrt", "subtract", "tan", "tanh",
    "trunc"]


def _elementwise(name: str):
    ufunc = getattr(np, name)
    op = ufunc.__name__

    def fn(*args):
        return call(op, *args)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"np.{op} elementwise, on the tensors' worker."
    # inspect.signature (help(), Sphinx) reads the attribute, which functions do not declare.
    fn.__text_signature__ = (  # type: ignore[attr-defined]
        "($x1, x2, /)" if ufunc.nin == 2 else "($x, /)")
    return fn


globals().update({name: _elementwise(name) for name in _UFUNCS})


def clip(x, /, min=None, max=None):
    """`x` with elements below `min` raised to it and above `max` lowered to it."""
    if min is None and max is None:
        return call("copy", x)
    return call("clip", x, min, max)


def real(x, /):
    """The real part of each element."""
    return run("real", x)


def imag(x, /):
    """The imaginary part of each element."""
    return run("imag", x)


def round(x, /):
    """Each element rounded to the nearest integer (halves to even)."""
    return call("round", x)


def __array_namespace_info__() -> Info:
    """What this namespace supports: capabilities, devices, default and known dtypes."""
    return Info()


__all__ = [  # noqa: PLE0604 (names made at import: the dtypes and ufuncs)
    "__array_api_version__", "__array_namespace_info__", "Device", "fft", "linalg", "e", "inf",
    "nan", "pi", "newaxis", *DTYPES, *_UFUNCS, "clip", "real", "imag", "round",
    "arange", "asarray", "astype", "can_cast", "empty", "empty_like", "eye", "finfo",
    "from_dlpack", "full", "full_like", "iinfo", "isdtype", "linspace", "meshgrid", "ones",
    "ones_like", "result_type", "to_device", "tril", "triu", "zeros", "zeros_like",
    *_function_names]

set_array_namespace(sys.modules[__name__])

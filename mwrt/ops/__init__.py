"""The op registry: each op's meta rule (run on the master) and implementation (on the worker).

An op is one `Op` entry: `impl(xp, *args, **kwargs)` computes with the array namespace
of the worker's device (NumPy or CuPy); `meta(*args, **kwargs)` receives `Spec`s in
place of tensors and returns the result's Spec (or a tuple of them, or None for an
in-place op), raising at issue time whatever NumPy would raise for shapes and dtypes.
A meta rule may return UNKNOWN when the result's shape depends on the data; the master
then asks the worker when the shape is first needed. Adding an op is one `register` call.
"""

# The families register their ops when imported; the registry itself is below them all.
from . import (  # noqa: F401
    array_api_rules,
    elementwise,
    misc,
    numpy_functions,
    numpy_shape_rules,
    reductions,
    shape,
    torchops,
    torchshards,
)
from .meta_helpers import OutputCastingError
from .registry import (
    KEEPS,
    UNKNOWN,
    Op,
    Spec,
    doc,
    get,
    gives_scalars,
    has,
    infer,
    names,
    register,
    summary,
)

__all__ = ["KEEPS", "UNKNOWN", "Op", "OutputCastingError", "Spec", "doc", "get", "gives_scalars",
           "has", "infer", "names", "register", "summary"]

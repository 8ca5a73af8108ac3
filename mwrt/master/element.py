"""Element: the handle of one element taken by integer indices (t[0], t[1, 2]), where NumPy
gives a scalar. A scalar is immutable, so augmented assignment makes a new value: `t[0] +=
2.5` and `b[0] |= 1` read the element, compute with NumPy's promotion, and assign back with
NumPy's casting on assignment (an int tensor keeps 3, a bool one True), as NumPy does.
"""

from __future__ import annotations

from numpy.typing import ArrayLike

from ..ops.elementwise import BINARY_OPERATORS
from .issue import call
from .methods import operand
from .tensor import DistributedTensor


class Element(DistributedTensor):
    """One element taken by integer indices: augmented assignment makes a new value."""

    __slots__ = ()

    def __imatmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        return call("matmul", self, operand(other))

    def __round__(self, ndigits: int | None = None) -> int | DistributedTensor:
        """round(t[i]): a Python int as round() of a NumPy scalar gives (waits for the value),
        or with `ndigits` a 0-d tensor rounded on the worker."""
        return round(self.item()) if ndigits is None else self.round(ndigits)


def _rebinding(op):
    def fn(self, other):
        return call(op, self, operand(other))
    fn.__name__ = fn.__qualname__ = f"Element.__i{op}__"
    return fn


for _py, _ufunc in BINARY_OPERATORS.items():
    setattr(Element, f"__i{_py}__", _rebinding(_ufunc))

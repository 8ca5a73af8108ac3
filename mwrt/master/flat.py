"""t.flat: NumPy's flat indexing of a tensor, as if it were 1-D (t.flat[::n + 1] += a adds to
a square matrix's diagonal, as scikit-learn and SciPy write it).

The master turns a flat index into the tensor's own places (np.unravel_index), so a read is
the tensor's fancy indexing and a write reaches the tensor itself, contiguous or not; only the
places selected are computed here, never an array of the tensor's size.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np


class FlatIndex:
    """t.flat: reads and writes by flat index (ints, slices, ..., int or bool arrays)."""

    __slots__ = ("base",)

    def __init__(self, base: Any):
        self.base = base

    def __len__(self) -> int:
        return int(self.base.size)

    def __iter__(self):
        """The elements in C order, each taken as the loop asks."""
        return iter(self.base.reshape(-1))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """The elements in C order, copied to the master (np.asarray(t.flat))."""
        return np.asarray(self.base, dtype=dtype).reshape(-1)

    def __getitem__(self, index: Any) -> Any:
        """The elements at flat `index`: an element for an int, else a tensor."""
        return self._target()[self._places(index)]

    def __setitem__(self, index: Any, value: Any) -> None:
        """Write `value` (a scalar, or one value per place) at flat `index`."""
        self._target()[self._places(index)] = value

    def _target(self) -> Any:
        # a 0-d tensor has no places to unravel into: its 1-element view has
        return self.base.reshape(1) if self.base.ndim == 0 else self.base

    def _places(self, index: Any) -> Any:
        positions = flat_positions(index, int(self.base.size))
        return positions if self.base.ndim <= 1 else np.unravel_index(positions, self.base.shape)


def flat_positions(index: Any, size: int) -> Any:
    """The flat positions `index` names in `size` elements, with NumPy's flatiter's rules."""
    if isinstance(index, slice):
        return np.arange(*index.indices(size))
    if index is Ellipsis:
        return np.arange(size)
    if isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_)):
        return _in_bounds(operator.index(index), size)
    places = np.asarray(index)
    if places.dtype == np.bool_:
        if places.size != size:
            raise IndexError(f"flat: a boolean index must have one flag per element (got "
                             f"{places.size}, expected {size})")
        return np.flatnonzero(places)
    if places.dtype.kind not in "iu":
        raise IndexError(f"flat: only integers, slices, ellipsis and integer or boolean "
                         f"arrays are valid indices (got {places.dtype})")
    return _in_bounds(places.astype(np.intp), size)


def _in_bounds(places: Any, size: int) -> Any:
    """`places` with negatives counted from the end; IndexError names one out of bounds."""
    wrapped = np.where(np.asarray(places) < 0, places + size, places)
    bad = np.asarray(places)[(wrapped < 0) | (wrapped >= size)]
    if bad.size:
        raise IndexError(f"index {bad.flat[0]} is out of bounds for size {size}")
    return int(wrapped) if np.ndim(wrapped) == 0 else wrapped

"""A one-place tensor's memory layout, asked of its worker: NumPy's `strides` and `flags`.

The master knows a tensor's shape and dtype but not how its worker laid the array out (a
transpose or a slice is a view there, as in NumPy), so these read it, one round trip each,
as a snapshot: `flags` cannot be set (NumPy's `a.flags.writeable = False` has no remote
counterpart).
"""

from __future__ import annotations

from typing import Any

from ..protocol import wire
from . import ordering

# NumPy's flags, as the worker reports them (NumPy's own values of the derived ones: its
# farray is true for any array that is not C-contiguous and is aligned or writeable).
_REPORTED = ("c_contiguous", "f_contiguous", "owndata", "writeable", "aligned",
             "writebackifcopy", "fnc", "forc", "behaved", "carray", "farray")
# ndarray.flags[key]'s keys (NumPy's, upper case only) and the attribute each reads.
_KEYS = {"C_CONTIGUOUS": "c_contiguous", "C": "c_contiguous", "CONTIGUOUS": "c_contiguous",
         "F_CONTIGUOUS": "f_contiguous", "F": "f_contiguous", "FORTRAN": "f_contiguous",
         "OWNDATA": "owndata", "O": "owndata", "WRITEABLE": "writeable", "W": "writeable",
         "ALIGNED": "aligned", "A": "aligned", "WRITEBACKIFCOPY": "writebackifcopy",
         "X": "writebackifcopy", "FNC": "fnc", "FORC": "forc", "BEHAVED": "behaved",
         "B": "behaved", "CARRAY": "carray", "CA": "carray", "FARRAY": "farray", "FA": "farray"}


class Flags:
    """NumPy's ndarray.flags of a tensor's array on its worker: a read-only snapshot."""

    __slots__ = _REPORTED

    def __init__(self, reported: dict) -> None:
        for name in _REPORTED:
            object.__setattr__(self, name, bool(reported[name]))

    c_contiguous: bool
    f_contiguous: bool
    owndata: bool
    writeable: bool
    aligned: bool
    writebackifcopy: bool
    fnc: bool  # F-contiguous and not C-contiguous (np.isfortran)
    forc: bool  # F- or C-contiguous
    behaved: bool  # aligned and writeable
    carray: bool  # behaved and C-contiguous
    farray: bool
    contiguous = property(lambda self: self.c_contiguous, doc="c_contiguous (NumPy's alias).")
    fortran = property(lambda self: self.f_contiguous, doc="f_contiguous (NumPy's alias).")

    def of_scalar(self) -> Flags:
        """These flags as a NumPy scalar's, which is read-only (an element's: a 0-d array on
        its worker)."""
        return Flags({**{name: getattr(self, name) for name in _REPORTED}, "writeable": False,
                      "behaved": False, "carray": False})

    def __getitem__(self, key: str) -> bool:
        """flags["C_CONTIGUOUS"], flags["W"], ...: NumPy's keys."""
        if key not in _KEYS:
            raise KeyError(f"flags: unknown flag (got {key!r}, expected one of NumPy's: "
                           f"{', '.join(_KEYS)})")
        return getattr(self, _KEYS[key])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"flags: a snapshot of the worker's array, read-only (got "
                             f"{name} = {value!r}); make a copy (t.copy()) to change it")

    def __repr__(self) -> str:
        """NumPy's layout of ndarray.flags."""
        return "".join(f"  {name.upper()} : {getattr(self, name)}\n" for name in _REPORTED[:6])


def asked(tensor: Any) -> dict:
    """{"strides": ..., "flags": {...}} of one-place `tensor`'s array, asked of its worker
    once the stream that last wrote it has run."""
    node = tensor._node
    ask = wire.Layout(id=next(node.ids), stream=ordering.read_stream(tensor), ref=tensor._id,
                      token=next(node.tokens))
    reply, _ = node.request(ask, f"layout of tensor {tensor._id}")
    return reply.value

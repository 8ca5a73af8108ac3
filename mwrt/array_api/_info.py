"""Devices and the namespace's inspection object (`__array_namespace_info__`).

An Array API device is a place: mwrt's (node, device) pair, device -1 being the node's host
memory. `t.device` gives one, `to_device(t, d)` moves there, and every creation function
takes `device=`.
"""

from __future__ import annotations

import numpy as np

from ..arrays import HOST
from ..master import context
from ..master.cluster import current
from ..master.context import Device

DTYPES = {name: np.dtype(name) for name in [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64", "complex64", "complex128"]}
_KINDS = {"bool": ["bool"], "signed integer": ["int8", "int16", "int32", "int64"],
          "unsigned integer": ["uint8", "uint16", "uint32", "uint64"],
          "real floating": ["float32", "float64"], "complex floating": ["complex64", "complex128"]}
_KINDS["integral"] = _KINDS["signed integer"] + _KINDS["unsigned integer"]
_KINDS["numeric"] = _KINDS["integral"] + _KINDS["real floating"] + _KINDS["complex floating"]


def place(device) -> tuple[int | None, int | None]:
    """(node, device) for a creation function's `device=`: a Device, a tensor's device, or
    None for the current place (`with mwrt.node(i)`, `mwrt.device(d)`)."""
    if device is None:
        return None, None
    if isinstance(device, Device):
        return device.node, device.device
    if device == "cpu":  # what array-API code passes for host memory
        return None, HOST
    raise ValueError(f"device: not an mwrt device (got {device!r}, expected a "
                     "mwrt.array_api.Device such as t.device, or None)")


def default_device() -> Device:
    """The place new tensors go now."""
    return Device(context.current_node(), context.current_device())


class Info:
    """What this namespace supports (`xp.__array_namespace_info__()`)."""

    def capabilities(self) -> dict:
        """Boolean indexing and data-dependent shapes work (the worker reports the shape)."""
        return {"boolean indexing": True, "data-dependent shapes": True,
                "max dimensions": 64}

    def default_device(self) -> Device:
        """The place new tensors go now (see mwrt.node, mwrt.device)."""
        return default_device()

    def devices(self) -> list[Device]:
        """Every node's host memory and GPUs."""
        out = []
        for node in current().nodes:
            out.append(Device(node.index, HOST))
            count = node.info.devices if node.info is not None else 0
            out.extend(Device(node.index, g) for g in range(count))
        return out

    def default_dtypes(self, *, device=None) -> dict:
        """NumPy's defaults: float64, complex128, int64 (also for indexing)."""
        place(device)
        return {"real floating": DTYPES["float64"], "complex floating": DTYPES["complex128"],
                "integral": DTYPES["int64"], "indexing": DTYPES["int64"]}

    def dtypes(self, *, device=None, kind=None) -> dict:
        """The dtypes of `kind` (a name of the standard's, a tuple of them, or None: all)."""
        place(device)
        if kind is None:
            return dict(DTYPES)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        out = {}
        for k in kinds:
            if k not in _KINDS:
                raise ValueError(f"dtypes: unknown kind {k!r} (known: {', '.join(_KINDS)})")
            out.update({name: DTYPES[name] for name in _KINDS[k]})
        return out

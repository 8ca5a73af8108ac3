"""The handlers of SaveTensors and LoadTensors: each worker writes and reads its own part of
a checkpoint (mwrt.save, mwrt.load), so no tensor's bytes pass through the master.

They run on a stream like any op, so a save reads what every earlier op on that stream
wrote, and a load's tensors exist for every later one.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

from .. import arrays, tensorfile
from ..ops import torchops
from . import quotas
from .tensors import check_size, resolve, store


def save_tensors(ex, cmd, frames):
    host, codes = {}, {}
    for name, value in zip(cmd.names, resolve(ex, cmd.refs), strict=True):
        if isinstance(value, _torch_tensor()):
            host[name], codes[name] = torchops.stored(value)  # torch's dtype, in its code
        else:
            host[name] = _host_copy(ex, value)
    crcs = tensorfile.write(cmd.folder, cmd.file, host, codes) if cmd.names else []
    ex.bytes_out += sum(a.nbytes for a in host.values())
    store(ex, cmd.out, np.array(crcs, np.int64))
    for stale in cmd.stale:
        if stale != cmd.file:
            tensorfile.remove(cmd.folder, stale)
    if cmd.older > 1:
        tensorfile.remove_older(cmd.folder, cmd.older)


def load_tensors(ex, cmd, frames):
    expected, table, staged = {}, ex.session.tensors, 0
    what = f"load of {', '.join(map(repr, cmd.names))} from {os.path.join(cmd.folder, cmd.file)}"
    for name, (dtype, shape, crc) in zip(cmd.names, cmd.expected, strict=True):
        dtype = np.dtype(dtype)
        check_size(tuple(shape), dtype, "load", table, ex.device)
        if ex.device != arrays.HOST:  # a GPU's tensor is read into host memory first
            nbytes = math.prod(shape) * dtype.itemsize
            quotas.check_bytes(nbytes, what, table, f"{dtype}{list(shape)}, read into host "
                               "memory before the device")
            staged += nbytes
        expected[name] = (dtype, shape, crc)
    table.check_room(staged)  # every tensor of the file is in host memory at once

    def admit(nbytes: int) -> None:  # the header is read into host memory, whatever the device
        quotas.check_bytes(nbytes, what, table, "its header")
    found = tensorfile.read(cmd.folder, cmd.file, expected, admit)
    for out, name in zip(cmd.outs, cmd.names, strict=True):
        value = found[name]
        ex.bytes_in += value.nbytes
        store(ex, out, value if ex.device == arrays.HOST else ex.xp.asarray(value))


def _torch_tensor() -> tuple:
    torch = sys.modules.get("torch")  # only a session that made torch tensors imported it
    return (torch.Tensor,) if torch is not None else ()


def _host_copy(ex, value) -> np.ndarray:
    """The array's bytes in host memory, as they are now on this stream."""
    if ex.device != arrays.HOST:
        ex.synchronize_device()
    return arrays.to_host(value)

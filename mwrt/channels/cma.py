"""Cross-memory attach (CMA): copy straight between two processes' memories on one host.

Linux's process_vm_readv/writev move bytes between this process and another one of the
same user (where ptrace is allowed) with one copy and no shared segment. This module is
only the primitive; the single-copy collectives built on it live in
mwrt.collective.cma and mwrt.collective.cma_ops.
"""

from __future__ import annotations

import ctypes
import errno
import os


class IoVec(ctypes.Structure):
    """One (address, length) pair of the syscall's vectors."""

    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc(name: str):
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong,
                   ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return fn


_readv, _writev = _libc("process_vm_readv"), _libc("process_vm_writev")


def available() -> bool:
    """True if this C library has process_vm_readv and process_vm_writev."""
    return _readv is not None and _writev is not None


def read_remote(pid: int, local: int, remote: int, nbytes: int, iov=None,
                write: bool = False) -> None:
    """Copy `nbytes` at address `remote` in process `pid` to address `local` here (or back,
    with `write`); `iov`: a reused pair of IoVec (building them costs more than the call)."""
    mine, theirs = iov or (IoVec(), IoVec())
    call, done = _writev if write else _readv, 0
    while done < nbytes:
        mine.base, mine.len = local + done, nbytes - done
        theirs.base, theirs.len = remote + done, nbytes - done
        got = call(pid, mine, 1, theirs, 1, 0)
        if got <= 0:
            code = ctypes.get_errno() if got < 0 else errno.EFAULT
            raise OSError(code, os.strerror(code))
        done += got


__all__ = ["IoVec", "available", "read_remote"]

"""Reads in place: a large tensor of a worker on this host, copied by the master straight
from the worker's memory into the array it returns, with one copy and no data channel.

Through the data channel, a same-host read pays the channel's setup on the session's first
large read (the master's listener, the worker's connection and handshake), a frame and an
answer per segment, and one thread's copy into fresh pages, each of which faults as the copy
first writes it. Here the worker pins the tensor and says where its bytes are (Lend); the
master copies them with process_vm_readv (mwrt.channels.cma), 4 MiB at a time, from 8 MiB
up on two threads, so one copies while the other takes its pages' faults, then lets go of
them (Unlend, on the same stream: it never overtakes the Lend). A Ctrl-C lands between two
chunks; the other thread ends its chunk, and the pin is given back all the same.

The worker says where it runs (netaddr.host_identity(): this host, its network and pid
namespaces), so one elsewhere, even under this host's name (a network namespace, a
container), is read over the channel, as is one whose memory the kernel does not let the
master read (Yama's ptrace_scope, another user, a worker that is not dumpable): that read
and every later one from that node. A tensor on a GPU, torch's, or a strided view goes
over the channel too (the worker would copy the view first, maybe on the thread that
serves every master). MWRT_SHM_CMA=0, or a channel other than auto or shm, turns reads in
place off.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import weakref

import numpy as np

from .. import config
from ..channels import cma
from ..errors import MwrtError, WorkerLostError
from ..netaddr import host_identity
from ..protocol import wire
from .cluster import current

log = logging.getLogger("mwrt")

_CHUNK = 4 << 20  # bytes per process_vm_readv: a chunk is what the other thread may take
_TWO_THREADS = 8 << 20  # from this size, a second thread copies too
_PROBE = 64 << 10  # the first bytes read, alone
_NOT_ALLOWED = {errno.EPERM, errno.EACCES, errno.ENOSYS}
_JOIN_SECONDS = 60.0  # a chunk is milliseconds of copying; past this, something is wrong

# Nodes whose reads go over the channel, and why (another host, a refused read).
_BY_CHANNEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def read(tensor, stream: int) -> np.ndarray | None:
    """`tensor`'s value (a host tensor, its read ordered on `stream`), copied from its
    worker's memory; None where it goes over the channel instead (nothing was read)."""
    node = tensor._node
    if not _may_read(node):
        return None
    out = np.empty(tensor.shape, tensor.dtype)
    return out if _lend_and_copy(node, tensor._id, stream, out) else None


def _may_read(node) -> bool:
    """Whether `node`'s worker may be on this host, reading in place is on, and no read
    from it went over the channel for a reason that lasts."""
    if node in _BY_CHANNEL or not cma.available() or not config.get("shm_cma"):
        return False
    if current().channel_name not in ("auto", "shm"):  # a channel chosen to carry the bytes
        return False
    return node.info is not None and node.info.hostname == socket.gethostname()


def _lend_and_copy(node, ref: int, stream: int, out: np.ndarray) -> bool:
    """Ask the worker to lend tensor `ref`, copy it into `out`, give it back; False where
    it cannot be read in place (nothing was copied)."""
    what = f"numpy() of tensor {ref}"
    lend = wire.Lend(id=next(node.ids), stream=stream, ref=ref, token=next(node.tokens))
    try:
        where = node.request(lend, what)[0].value
        if where is None:  # not in NumPy's host memory in C order: the channel's way
            return False
        if where["where"] != host_identity():
            _by_channel(node, "it runs on another host (or pid namespace)")
            return False
        if where["nbytes"] != out.nbytes:
            raise MwrtError(f"{node}: {what} lent {where['nbytes']} bytes (expected "
                            f"{out.nbytes}: {out.dtype}{list(out.shape)}); is the worker the "
                            "same mwrt version as this master?")
        return _copy(node, where["pid"], where["address"], out, what)
    finally:  # (an error, a Ctrl-C: the Lend may have pinned it, or will)
        _give_back(node, stream, lend.id)


def _by_channel(node, why: str) -> None:
    _BY_CHANNEL[node] = why
    log.info("%s: reads of large tensors go over the data channel: %s", node, why)


def _give_back(node, stream: int, lend: int) -> None:
    try:
        node.issue(wire.Unlend(id=next(node.ids), stream=stream, lend=lend))
    except MwrtError:  # lost or closed: its session, and the pin with it, are gone
        pass


def _copy(node, pid: int, address: int, out: np.ndarray, what: str) -> bool:
    """Copy `out.nbytes` at `address` in worker `pid` into `out`; False if the kernel
    refuses the first chunk (that node's reads go over the channel from now on)."""
    base, total = out.ctypes.data, out.nbytes
    first = min(_PROBE, total)  # copied alone: a refusal shows before a thread starts
    chunks = iter(range(first, total, _CHUNK))  # shared: next() hands each out once (the GIL)
    errors: list[OSError | None] = []  # the first failure; None: a Ctrl-C, stop

    def run(iov) -> None:
        for lo in chunks:
            if errors:
                return
            try:
                cma.read_remote(pid, base + lo, address + lo, min(_CHUNK, total - lo), iov)
            except OSError as exc:
                errors.append(exc)

    try:
        cma.read_remote(pid, base, address, first)
    except OSError as exc:
        if exc.errno not in _NOT_ALLOWED:
            raise _lost(node, what, exc) from None
        _by_channel(node, f"the kernel does not let this master read its memory "
                          f"({exc.strerror})")
        return False
    partner = None
    if total >= _TWO_THREADS:
        partner = threading.Thread(target=run, args=((cma.IoVec(), cma.IoVec()),),
                                   name="mwrt-read-in-place", daemon=True)
        partner.start()
    try:
        run((cma.IoVec(), cma.IoVec()))
        if partner is not None:
            partner.join(_JOIN_SECONDS)
    except BaseException:  # a Ctrl-C between two chunks: the partner ends its own first
        errors.append(None)
        if partner is not None:
            partner.join(_JOIN_SECONDS)
        raise
    if partner is not None and partner.is_alive():
        raise MwrtError(f"{node}: {what}: a copy from the worker's memory ran past "
                        f"{_JOIN_SECONDS} s")
    if errors and errors[0] is not None:
        raise _lost(node, what, errors[0])
    return True


def _lost(node, what: str, exc: OSError) -> MwrtError:
    """The error for a read of the worker's memory that failed part-way: it died (ESRCH),
    or what it lent is gone (EFAULT)."""
    node.check_lost()  # the heartbeat's word first, if it has one
    return WorkerLostError(f"{node}: its memory could not be read during {what} "
                           f"({exc.strerror}); the worker died or was stopped",
                           node=node.index, address=node.address)

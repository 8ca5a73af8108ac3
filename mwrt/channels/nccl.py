"""The nccl channel: GPU memory between ranks over NCCL (CuPy's `cupy.cuda.nccl`).

Each rank drives one GPU, the current CUDA device when the channel is made (set it first:
`cupy.cuda.Device(local_rank).use()`). The communicator is bootstrapped through the
rendezvous store, as NCCL asks: rank 0 makes the unique id (which names it as the root),
publishes it, and every rank builds its communicator once every rank has taken the id, so
a rank that never comes is a named timeout rather than NCCL's endless wait.

Buffers are device arrays (anything with `__cuda_array_interface__` on this rank's GPU);
host memory is refused with the fix, since NCCL moves GPU memory only. A send or receive
is enqueued on the calling thread's current stream and returns at once, as NCCL's and
torch's do: later work on that stream sees it done, and `isend`/`irecv` return a Work
that waits (with a timeout) for an event recorded after it. NCCL matches sends and
receives between two ranks in issue order and carries no tags: a receive must be posted
in the order of the peer's sends, with its size. Collectives run as NCCL's own
(mwrt.collective.nccl_ops), on one communicator per process group.
"""

from __future__ import annotations

import importlib
import threading
import time

import numpy as np

from .. import arrays
from ..errors import ChannelClosedError, ChannelError, ChannelTimeoutError, MwrtError
from .base import DataChannel, Work

_REMOTE_ERROR = 6  # ncclRemoteError: a peer failed or went away


class NcclUnsupportedError(TypeError):
    """A reduction NCCL lacks (a dtype, a ReduceOp): raised alike on every rank after the
    call check, so callers may run it another way together."""


def nccl_module():
    """The NCCL bindings of this process's GPU module (CuPy's, or mwrt.testing.fakenccl under
    MWRT_FAKE_GPUS); ImportError saying what to install where there are none."""
    gpu = arrays.gpu_module()
    if gpu is None:
        raise ImportError("nccl channel: needs CuPy with NCCL on a GPU host; "
                          f"{arrays.CUDA_FIX}, which brings NCCL (nvidia-nccl-cu12)")
    found = getattr(gpu.cuda, "nccl", None)
    try:
        found = found or importlib.import_module(gpu.__name__ + ".cuda.nccl")
    except ImportError as exc:
        raise ImportError(f"nccl channel: CuPy's NCCL bindings do not load ({exc}); "
                          "pip install nvidia-nccl-cu12 (mwrt[cuda12] brings it)") from None
    if not getattr(found, "available", False):
        raise ImportError("nccl channel: this CuPy was built without NCCL "
                          "(cupy.cuda.nccl.available is False); pip install mwrt[cuda12]")
    return found


def describe_buffer(buf) -> str:
    """`numpy.ndarray float32[4]`: a buffer's type, dtype and shape, for messages."""
    kind = type(buf)
    text = f"{kind.__module__.split('.')[0]}.{kind.__name__}"
    if hasattr(buf, "dtype") and hasattr(buf, "shape"):
        text += f" {buf.dtype}{list(buf.shape)}"
    return text


def host_refused(buf, where: str) -> TypeError:
    """The error for a host buffer given to NCCL, which moves GPU memory only."""
    return TypeError(f"nccl channel: buffer is host memory (got {describe_buffer(buf)}); NCCL "
                     f"moves GPU memory: .cuda() it first, or use the tcp/shm channel (in "
                     f"{where})")


def device_pointer(buf, device: int, what: str) -> tuple[int, int]:
    """(pointer, nbytes) of device array `buf` on GPU `device`; named errors otherwise."""
    iface = getattr(buf, "__cuda_array_interface__", None)
    if iface is None:
        raise host_refused(buf, what)
    on = getattr(getattr(buf, "device", None), "id", device)
    if on != device:
        raise ValueError(f"{what}: buffer is on GPU {on}, this rank's NCCL communicator on GPU "
                         f"{device}; move it there (arr.to(device=...), cupy.asarray under "
                         "cupy.cuda.Device) or make the channel with that device current")
    strides = iface.get("strides")
    if strides is not None and strides != _c_strides(buf):
        raise ValueError(f"{what}: buffer is not C-contiguous ({describe_buffer(buf)}); pass "
                         "cupy.ascontiguousarray(arr)")
    return int(iface["data"][0]), int(buf.nbytes)


def _c_strides(buf) -> tuple:
    return tuple(np.empty(0, buf.dtype).strides[0] * int(np.prod(buf.shape[i + 1:], dtype=int))
                 for i in range(len(buf.shape)))


def encode_id(unique_id) -> bytes:
    """NCCL's unique id as bytes for the store: CuPy >= 14 gives 128 bytes, older CuPy a
    tuple of 128 signed chars; a leading marker keeps the form, which the same CuPy takes."""
    if isinstance(unique_id, (bytes, bytearray)):
        return b"b" + bytes(unique_id)
    return b"t" + np.asarray(unique_id, np.int16).tobytes()


def decode_id(raw: bytes):
    """The unique id encode_id stored, in the form it had."""
    if raw[:1] == b"b":
        return raw[1:]
    return tuple(int(c) for c in np.frombuffer(raw[1:], np.int16))


def communicator(nccl, store, key: str, rank: int, size: int, timeout: float, what: str):
    """A communicator of `size` ranks: rank 0's unique id goes through the store under
    `key`; every rank takes it, says so, and builds its communicator once all have."""
    if rank == 0:
        store.set(f"{key}/id", encode_id(nccl.get_unique_id()))
    try:
        raw = store.get(f"{key}/id", timeout=timeout)
    except (MwrtError, TimeoutError) as exc:
        raise ChannelTimeoutError(
            f"{what}: rank {rank} waited {timeout} s for the NCCL unique id that rank 0 "
            f"publishes at store key {key}/id ({exc}); is rank 0 running, with the same "
            "init_method?") from None
    store.set(f"{key}/took/{rank}", b"1")
    keys = [f"{key}/took/{r}" for r in range(size)]
    try:
        store.wait(keys, timeout=timeout)
    except (MwrtError, TimeoutError):
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise ChannelTimeoutError(
            f"{what}: ranks {missing} did not take the NCCL unique id within {timeout} s "
            f"(rank {rank} waited); start them, or check they use the same store") from None
    try:
        return nccl.NcclCommunicator(size, decode_id(raw), rank)
    except nccl.NcclError as exc:
        raise converted(exc, f"{what}: rank {rank} could not join the NCCL communicator (each "
                             "rank needs a GPU of its own: cupy.cuda.Device(local_rank).use() "
                             "before joining)") from None


def converted(exc: Exception, text: str, peer: int | None = None) -> ChannelError:
    """An NcclError as mwrt's: a lost peer is ChannelClosedError, the rest ChannelError."""
    if getattr(exc, "status", None) == _REMOTE_ERROR:
        return ChannelClosedError(f"{text}: {exc}; check the logs of the other ranks",
                                  peer=peer)
    return ChannelError(f"{text}: {exc}")


class NcclChannel(DataChannel):
    """Point-to-point GPU buffers between ranks, each on its own GPU, over NCCL."""

    name = "nccl"
    native_collectives = "nccl"  # NCCL's own collectives (mwrt.collective.nccl_ops)
    device_buffers = True  # send/recv and collectives take device arrays themselves
    eager_bytes = 0  # an NCCL send may wait for its receive: never send-then-receive

    def __init__(self, rank, world_size, *, store, prefix="mwrt", key=None, timeout=None):
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)
        self.nccl = nccl_module()
        self.xp = arrays.gpu_module()
        self.device = self.xp.cuda.Device().id
        self.lock = threading.Lock()  # NCCL calls on one communicator: one thread at a time
        self.comm = communicator(self.nccl, store, f"{prefix}/nccl", rank, world_size,
                                 self.timeout, "nccl channel")

    def __repr__(self):
        return f"<NcclChannel rank {self.rank} of {self.world_size}, GPU {self.device}>"

    def stream_ptr(self) -> int:
        """The calling thread's current stream, where NCCL calls are enqueued."""
        return self.xp.cuda.get_current_stream().ptr

    # -- the contract, on device buffers -------------------------------------------------

    def send(self, buf, peer: int, tag: int = 0, timeout: float | None = None) -> None:
        """Enqueue a send of device array `buf` to `peer` on the current stream."""
        self._check(peer, tag)
        ptr, nbytes = device_pointer(buf, self.device, f"send to rank {peer}")
        self._p2p("send", ptr, nbytes, peer)

    def recv(self, buf, peer: int, tag: int = 0, timeout: float | None = None) -> None:
        """Enqueue a receive from `peer` into device array `buf` on the current stream."""
        self._check(peer, tag)
        ptr, nbytes = device_pointer(buf, self.device, f"recv from rank {peer}")
        self._p2p("recv", ptr, nbytes, peer)

    def isend(self, buf, peer: int, tag: int = 0, timeout: float | None = None) -> Work:
        self.send(buf, peer, tag)
        return self._after(f"nccl send rank {self.rank}->{peer}", timeout, peer)

    def irecv(self, buf, peer: int, tag: int = 0, timeout: float | None = None) -> Work:
        self.recv(buf, peer, tag)
        return self._after(f"nccl recv rank {self.rank}<-{peer}", timeout, peer)

    def _p2p(self, kind: str, ptr: int, nbytes: int, peer: int) -> None:
        if nbytes == 0:
            return
        with self.lock:
            try:
                getattr(self.comm, kind)(ptr, nbytes, self.nccl.NCCL_UINT8, peer,
                                         self.stream_ptr())
            except self.nccl.NcclError as exc:
                arrow = "->" if kind == "send" else "<-"
                raise converted(exc, f"nccl {kind} rank {self.rank}{arrow}{peer}",
                                peer) from None

    def _after(self, what: str, timeout: float | None, peer: int) -> Work:
        """A Work done when the current stream passes this point (an event recorded now)."""
        event = self.xp.cuda.Event(disable_timing=True)
        event.record(self.xp.cuda.get_current_stream())
        limit = self._timeout(timeout)

        def wait(seconds):
            wait_event(event, seconds if seconds is not None else limit, what,
                       f"is rank {peer} alive and in the matching call?")

        return Work(what, limit, wait, lambda: event.done, lambda: None)

    def _send(self, view, peer, tag, timeout, desc):
        raise TypeError("nccl channel: send takes device arrays (NcclChannel.send)")

    def _recv(self, view, peer, tag, timeout, desc):
        raise TypeError("nccl channel: recv takes device arrays (NcclChannel.recv)")

    def _close(self) -> None:
        self.comm.destroy()


def wait_event(event, timeout: float, what: str, hint: str, comm=None) -> None:
    """Poll a CUDA event until it has happened; ChannelTimeoutError naming `what` after
    `timeout` s (NCCL itself never times out; the host thread never blocks on the GPU).
    With `comm`, an error NCCL met meanwhile (a peer gone) is raised at once."""
    deadline, sleep = time.monotonic() + timeout, 1e-5
    while not event.done:  # CuPy events tell by `done` (cudaEventQuery)
        if comm is not None:
            comm.check_async_error()
        if time.monotonic() > deadline:
            raise ChannelTimeoutError(f"{what}: not done after {timeout} s; {hint}")
        time.sleep(sleep)
        sleep = min(sleep * 2, 1e-3)

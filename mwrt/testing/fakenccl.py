"""A fake NCCL for tests: the parts of `cupy.cuda.nccl` that mwrt uses, over loopback TCP.

With MWRT_FAKE_GPUS=n, `mwrt.testing.fakegpu.cuda.nccl` is this module, so the nccl channel runs
its real code on a machine without a GPU, and bytes really move between processes. As in
NCCL, `get_unique_id()` names the root: here it starts a hub (fakenccl_hub.py: a listener and its
threads) in the calling process and encodes the hub's address and a secret in the id's
128 signed chars. Each communicator connects to the hub, and every call is a request that
the hub answers: collectives run as a star (every rank sends its buffer, the hub combines
them in rank order and sends each rank its part), a send is queued at the hub until the
peer's recv takes it. Calls block until answered (a fake stream is always done), so
`groupStart`/`groupEnd` only defer their calls, issuing sends before receives.

Unlike NCCL, nothing here hangs or is undefined: a buffer that is not a fake-GPU array of
the communicator's device, ranks that disagree on a collective, a send and recv of
different sizes and a peer that dies or never comes (the hub waits MWRT_CHANNEL_TIMEOUT
seconds) are each an NcclError naming the ranks.
"""

from __future__ import annotations

import json
import socket
import threading

import numpy as np

from .. import config
from . import fakecuda
from .fakenccl_hub import *  # noqa: F403  (NCCL's codes, as cupy.cuda.nccl has them)
from .fakenccl_hub import (
    ARGUMENT,
    DTYPES,
    ERRORS,
    NCCL_UNIQUE_ID_BYTES,
    REMOTE,
    SYSTEM,
    USAGE,
    Hub,
    connected,
    recv,
    send,
)

available = True


class NcclError(RuntimeError):
    """As cupy.cuda.nccl.NcclError: `status` and NCCL's name for it, then what happened."""

    def __init__(self, status: int, detail: str = ""):
        self.status = status
        super().__init__(f"{ERRORS.get(status, status)}: {detail}")


def get_version() -> int:
    return 21805


_hubs: list[Hub] = []  # kept alive for the process's life, as NCCL's bootstrap thread is


def get_unique_id() -> bytes:
    """A new communicator's id: this process becomes its root (the hub's address, a secret)."""
    hub = Hub()
    _hubs.append(hub)
    text = json.dumps({"host": hub.address, "port": hub.listener.getsockname()[1],
                       "secret": hub.secret}).encode()
    return text.ljust(NCCL_UNIQUE_ID_BYTES, b"\0")  # bytes, as CuPy >= 14 gives


# -- communicators ------------------------------------------------------------------------------

_group = threading.local()  # calls deferred between groupStart and groupEnd, per thread


def groupStart() -> None:
    _group.depth = getattr(_group, "depth", 0) + 1
    _group.calls = getattr(_group, "calls", None) or []


def groupEnd() -> None:
    depth = getattr(_group, "depth", 0)
    if depth == 0:
        raise NcclError(USAGE, "groupEnd without groupStart")
    _group.depth = depth - 1
    if _group.depth:
        return
    calls, _group.calls = _group.calls, []
    # Sends first: the hub queues them, so no rank's receive waits on a send behind its own.
    for _, call in sorted(enumerate(calls), key=lambda c: (c[1][0] == "recv", c[0])):
        call[1](*call[2:])


class NcclCommunicator:
    """One rank of a communicator: NcclCommunicator(nranks, unique_id, rank), as CuPy's."""

    def __init__(self, ndev: int, commId: bytes | tuple, rank: int):
        if len(commId) != NCCL_UNIQUE_ID_BYTES:
            raise NcclError(ARGUMENT, f"unique id: expected {NCCL_UNIQUE_ID_BYTES} chars "
                                       f"(got {len(commId)})")
        if not 0 <= rank < ndev:
            raise NcclError(ARGUMENT, f"rank {rank} is not in [0, {ndev})")
        found = json.loads(bytes(c & 0xFF for c in commId).rstrip(b"\0"))
        self._hub = next((h for h in _hubs if h.secret == found["secret"]), None)
        self._rank, self._size, self._seq = rank, ndev, 0
        self._device = fakecuda.Device().id
        self._timeout = config.get("channel_timeout")
        self._lock = threading.Lock()
        self._sock: socket.socket | None
        try:
            self._sock = connected(socket.create_connection((found["host"], found["port"]),
                                                             timeout=10))
        except OSError as exc:
            raise NcclError(SYSTEM, f"rank {rank}: cannot reach the communicator's root "
                                     f"({found['host']}:{found['port']}: {exc}); is rank 0 "
                                     "alive?") from None
        self._sock.settimeout(self._timeout + 5)  # the hub names a late rank before this
        send(self._sock, {"secret": found["secret"], "rank": rank, "nranks": ndev,
                           "timeout": self._timeout})

    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def device_id(self) -> int:
        return self._device

    def destroy(self) -> None:
        if self._sock is None:
            return
        try:
            send(self._sock, {"op": "bye"})
        except OSError:
            pass
        self._sock.close()
        self._sock = None
        hub = self._hub
        if hub is not None:  # the root's process: answer the others before it exits
            with hub.cond:
                hub.cond.wait_for(lambda: len(hub.gone) == self._size, 5.0)

    abort = destroy

    def check_async_error(self) -> None:
        """Errors of the fake are raised by the call that meets them."""

    # -- calls ------------------------------------------------------------------------------

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        self._collective(stream, "allReduce", sendbuf, count, recvbuf, count, datatype, op)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        out = count if self._rank == root else 0
        self._collective(stream, "reduce", sendbuf, count, recvbuf, out, datatype, op, root)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        sent = count if self._rank == root else 0
        self._collective(stream, "broadcast", sendbuff, sent, recvbuff, count, datatype, None,
                         root, count=count)

    def bcast(self, buff, count, datatype, root, stream):
        self.broadcast(buff, buff, count, datatype, root, stream)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        self._collective(stream, "allGather", sendbuf, count, recvbuf, count * self._size,
                         datatype)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        self._collective(stream, "reduceScatter", sendbuf, recvcount * self._size, recvbuf,
                         recvcount, datatype, op, count=recvcount)

    def send(self, sendbuf, count, datatype, peer, stream):
        self._call(stream, "send", self._send_now, sendbuf, count, datatype, peer)

    def recv(self, recvbuf, count, datatype, peer, stream):
        self._call(stream, "recv", self._recv_now, recvbuf, count, datatype, peer)

    def _collective(self, stream, op, sendbuf, n_in, recvbuf, n_out, datatype, redop=None,
                    root=None, count=None):
        self._check_peer(root, "root")
        seq, self._seq = self._seq, self._seq + 1  # in issue order, as NCCL's
        head = {"op": op, "seq": seq, "count": n_in if count is None else count,
                "datatype": datatype, "redop": redop, "root": root}
        self._call(stream, op, self._collective_now, head, sendbuf, n_in, recvbuf, n_out)

    def _call(self, stream: int, kind: str, fn, *args) -> None:
        if self._sock is None:
            raise NcclError(USAGE, f"rank {self._rank}: {kind} on a destroyed communicator")
        fakecuda.launch_on(stream, f"nccl.{kind}")  # as a kernel would be, on that stream
        if getattr(_group, "depth", 0):
            _group.calls.append((kind, fn, *args))
        else:
            fn(*args)

    def _collective_now(self, head, sendbuf, n_in, recvbuf, n_out) -> None:
        size = np.dtype(self._dtype(head["datatype"])).itemsize
        data = self._memory(sendbuf, n_in * size, head["op"])
        out = self._memory(recvbuf, n_out * size, head["op"])
        out[:] = self._request(head, data, f"{head['op']} #{head['seq']}", n_out * size)

    def _send_now(self, sendbuf, count, datatype, peer) -> None:
        self._check_peer(peer, "peer")
        data = self._memory(sendbuf, count * np.dtype(self._dtype(datatype)).itemsize, "send")
        self._request({"op": "send", "peer": peer}, data, f"send to rank {peer}", 0)

    def _recv_now(self, recvbuf, count, datatype, peer) -> None:
        self._check_peer(peer, "peer")
        out = self._memory(recvbuf, count * np.dtype(self._dtype(datatype)).itemsize, "recv")
        out[:] = self._request({"op": "recv", "peer": peer, "nbytes": out.nbytes}, b"",
                               f"recv from rank {peer}", out.nbytes)

    def _request(self, head: dict, payload, what: str, expect: int):
        """Send one request to the hub and return its answer's payload (`expect` bytes)."""
        sock = self._sock
        if sock is None:  # destroyed after the call was queued in a group
            raise NcclError(USAGE, f"rank {self._rank}: {what} on a destroyed communicator")
        with self._lock:
            try:
                send(sock, head, payload)
                reply, data = recv(sock)
            except TimeoutError:
                raise NcclError(REMOTE, f"rank {self._rank}: {what}: no answer from the "
                                         f"root after {self._timeout} s") from None
            except (OSError, ValueError):
                raise NcclError(REMOTE, f"rank {self._rank}: {what}: lost the connection to "
                                         "the root (rank 0, which holds the communicator's "
                                         "hub, died or destroyed it)") from None
        if "error" in reply:
            raise NcclError(reply["status"], f"rank {self._rank}: {reply['error']}")
        if len(data) != expect:
            raise NcclError(USAGE, f"rank {self._rank}: {what}: got {len(data)} bytes "
                                    f"(expected {expect})")
        return np.frombuffer(data, np.uint8)

    # -- checks ------------------------------------------------------------------------------

    def _check_peer(self, peer, what: str) -> None:
        if peer is not None and not 0 <= peer < self._size:
            raise NcclError(ARGUMENT, f"rank {self._rank}: {what} {peer} is not in "
                                       f"[0, {self._size})")

    def _dtype(self, datatype: int):
        if datatype not in DTYPES:
            raise NcclError(ARGUMENT, f"rank {self._rank}: datatype {datatype} is not one "
                                       "this fake NCCL knows")
        return DTYPES[datatype]

    def _memory(self, ptr: int, nbytes: int, what: str) -> np.ndarray:
        """The bytes at device pointer `ptr`, which must be a fake-GPU array of our device."""
        if nbytes == 0:
            return np.empty(0, np.uint8)
        arr = fakecuda.device_array_at(ptr)
        if arr is None:
            raise NcclError(ARGUMENT, f"rank {self._rank}: {what}: pointer {ptr:#x} is not "
                                       "device memory (not a fake-GPU array's)")
        if arr.device.id != self._device:
            raise NcclError(ARGUMENT, f"rank {self._rank}: {what}: the buffer is on device "
                                       f"{arr.device.id}, the communicator on {self._device}")
        if not arr.flags.c_contiguous:
            raise NcclError(ARGUMENT, f"rank {self._rank}: {what}: the buffer is not "
                                       "contiguous")
        flat = arr.view(np.ndarray).reshape(-1).view(np.uint8)
        if flat.nbytes < nbytes:
            raise NcclError(ARGUMENT, f"rank {self._rank}: {what}: the buffer has "
                                       f"{flat.nbytes} bytes (the call needs {nbytes})")
        return flat[:nbytes]

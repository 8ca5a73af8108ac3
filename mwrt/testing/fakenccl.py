"""A fake NCCL for tests: the parts of `cupy.cuda.nccl` that mwrt uses, over loopback TCP.

With MWRT_FAKE_GPUS=n, `mwrt.testing.fakegpu.cuda.nccl` is this module, so the nccl channel runs
its real code on a machine without a GPU, and bytes really move between processes. As in
NCCL, `get_unique_id()` names the root: here it starts a hub (a loopback listener and its
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
import os
import socket
import struct
import threading
import time
from collections import defaultdict, deque

import numpy as np

from .. import config, netaddr
from ..errors import ConfigError
from . import fakecuda

NCCL_INT8, NCCL_CHAR, NCCL_UINT8, NCCL_INT32, NCCL_INT, NCCL_UINT32 = 0, 0, 1, 2, 2, 3
NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16, NCCL_HALF, NCCL_FLOAT32, NCCL_FLOAT = 4, 5, 6, 6, 7, 7
NCCL_FLOAT64, NCCL_DOUBLE = 8, 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_UNIQUE_ID_BYTES = 128
available = True

_DTYPES = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32,
           NCCL_UINT32: np.uint32, NCCL_INT64: np.int64, NCCL_UINT64: np.uint64,
           NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64}
_UFUNCS = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum,
           NCCL_MIN: np.minimum, NCCL_AVG: np.add}
_ERRORS = {2: "NCCL_ERROR_SYSTEM_ERROR", 3: "NCCL_ERROR_INTERNAL_ERROR",
           4: "NCCL_ERROR_INVALID_ARGUMENT", 5: "NCCL_ERROR_INVALID_USAGE",
           6: "NCCL_ERROR_REMOTE_ERROR"}
_SYSTEM, _ARGUMENT, _USAGE, _REMOTE = 2, 4, 5, 6
_HEADER = struct.Struct("!II")  # JSON length, payload length


class NcclError(RuntimeError):
    """As cupy.cuda.nccl.NcclError: `status` and NCCL's name for it, then what happened."""

    def __init__(self, status: int, detail: str = ""):
        self.status = status
        super().__init__(f"{_ERRORS.get(status, status)}: {detail}")


def get_version() -> int:
    return 21805


# -- framing ------------------------------------------------------------------------------------

def _send(sock: socket.socket, head: dict, payload=b"") -> None:
    text = json.dumps(head).encode()
    data = _HEADER.pack(len(text), len(payload)) + text
    if len(payload) <= 1 << 16:  # one segment: no wait for the peer's delayed ACK
        sock.sendall(data + bytes(payload))
    else:
        sock.sendall(data)
        sock.sendall(payload)


def _connected(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # requests are small, answered
    return sock


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("connection closed")
        got += k
    return buf


def _recv(sock: socket.socket) -> tuple[dict, bytearray]:
    size, nbytes = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    return json.loads(_recv_exactly(sock, size)), _recv_exactly(sock, nbytes)


# -- the root: the hub that get_unique_id starts --------------------------------------------------

class _Hub:
    """The root of one communicator: pairs sends with receives, combines collectives."""

    def __init__(self):
        self.address = _root_address()
        self.listener = socket.create_server((self.address, 0))
        self.secret = os.urandom(8).hex()
        self.cond = threading.Condition()
        self.conns: dict[int, socket.socket] = {}
        # Ranks in the communicator, as the first hello says (0 before it).
        self.size, self.timeout = 0, config.get("channel_timeout")
        self.gone: dict[int, str] = {}  # rank -> why it can no longer answer
        self.pending: dict[int, dict] = defaultdict(dict)  # collective seq -> rank -> call
        self.started: dict[int, float] = {}  # collective seq -> when its first rank came
        self.mail = defaultdict(deque)  # (src, dst) -> payloads sent, not yet received
        self.wants = defaultdict(deque)  # (src, dst) -> sizes of receives waiting
        threading.Thread(target=self._accept, daemon=True, name="fakenccl-hub").start()
        threading.Thread(target=self._watch, daemon=True, name="fakenccl-watch").start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(_connected(sock),), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(10.0)  # for the hello; then a member may stay quiet as long as it likes
        try:
            hello, _ = _recv(sock)
        except (OSError, ValueError):
            sock.close()
            return
        sock.settimeout(None)
        if hello.get("secret") != self.secret:
            sock.close()  # not a member of this communicator
            return
        rank = hello["rank"]
        with self.cond:
            self.size = hello["nranks"]
            self.timeout = max(self.timeout, hello["timeout"])
            self.conns[rank] = sock
        why = f"rank {rank} lost its connection (its process died or stopped)"
        try:
            while True:
                head, payload = _recv(sock)
                if head["op"] == "bye":
                    why = f"rank {rank} destroyed its communicator"
                    break
                with self.cond:
                    self._handle(rank, head, payload)
        except (OSError, ValueError):
            pass
        with self.cond:
            self._lose(rank, why)
        sock.close()

    def _reply(self, rank: int, head: dict, payload=b"") -> None:
        try:
            _send(self.conns[rank], head, payload)
        except OSError:
            pass  # its reader thread sees the loss

    def _fail(self, rank: int, status: int, text: str) -> None:
        self._reply(rank, {"error": text, "status": status})

    def _handle(self, rank: int, head: dict, payload) -> None:
        op = head["op"]
        if op == "send":
            peer = head["peer"]
            if peer in self.gone:
                return self._fail(rank, _REMOTE, f"send to rank {peer}: {self.gone[peer]}")
            self.mail[(rank, peer)].append(payload)
            self._reply(rank, {"ok": 1})
            self._deliver(rank, peer)
        elif op == "recv":
            self.wants[(head["peer"], rank)].append(head["nbytes"])
            self._deliver(head["peer"], rank)
        else:
            seq = head["seq"]
            self.started.setdefault(seq, time.monotonic())
            self.pending[seq][rank] = (head, payload)
            if self.gone:
                self._abort(seq, "; ".join(self.gone.values()))
            elif len(self.pending[seq]) == self.size:
                self._complete(seq)

    def _deliver(self, src: int, dst: int) -> None:
        mail, wants = self.mail[(src, dst)], self.wants[(src, dst)]
        while mail and wants:
            payload, nbytes = mail.popleft(), wants.popleft()
            if len(payload) != nbytes:
                self._fail(dst, _USAGE, f"recv from rank {src}: message size does not match "
                                        f"(got {len(payload)} bytes, expected {nbytes})")
            else:
                self._reply(dst, {"ok": 1}, payload)
        if wants and src in self.gone:
            while wants:
                wants.popleft()
                self._fail(dst, _REMOTE, f"recv from rank {src}: {self.gone[src]}")

    def _complete(self, seq: int) -> None:
        calls = self.pending.pop(seq)
        self.started.pop(seq, None)
        heads = [calls[r][0] for r in range(self.size)]
        keys = ("op", "count", "datatype", "redop", "root")
        if any(tuple(h.get(k) for k in keys) != tuple(heads[0].get(k) for k in keys)
               for h in heads):
            said = "; ".join(f"rank {r}: {[h.get(k) for k in keys]}" for r, h in enumerate(heads))
            for r in range(self.size):
                self._fail(r, _USAGE, f"collective #{seq}: ranks disagree on (op, count, "
                                      f"datatype, redop, root): {said}")
            return
        for r, part in enumerate(_combine(heads[0], [calls[r][1] for r in range(self.size)])):
            self._reply(r, {"ok": 1}, part)

    def _abort(self, seq: int, why: str) -> None:
        for r in self.pending.pop(seq, {}):
            self._fail(r, _REMOTE, f"collective #{seq}: {why}")
        self.started.pop(seq, None)

    def _lose(self, rank: int, why: str) -> None:
        self.gone[rank] = why
        self.cond.notify_all()
        for seq in list(self.pending):
            self._abort(seq, why)
        for src, dst in list(self.wants):
            if src == rank:
                self._deliver(src, dst)
        if len(self.gone) == self.size:
            self.listener.close()

    def _watch(self) -> None:
        """Fail a collective that some rank has not joined after the timeout, naming it."""
        while self.listener.fileno() >= 0:
            time.sleep(0.2)
            with self.cond:
                now = time.monotonic()
                for seq, since in list(self.started.items()):
                    if now - since > self.timeout:
                        missing = sorted(set(range(self.size)) - set(self.pending[seq]))
                        self._abort(seq, f"ranks {missing} did not join it within "
                                         f"{self.timeout} s")


def _combine(head: dict, payloads: list) -> list:
    """Each rank's reply payload for collective `head`, from every rank's payload."""
    op, n, count = head["op"], len(payloads), head["count"]
    dtype = _DTYPES[head["datatype"]]
    arrays = [np.frombuffer(p, dtype) for p in payloads]
    if op == "broadcast":
        return [payloads[head["root"]]] * n
    if op == "allGather":
        return [b"".join(bytes(p) for p in payloads)] * n
    total = arrays[0].copy()
    for other in arrays[1:]:  # in rank order, as every rank would see it
        _UFUNCS[head["redop"]](total, other, out=total)
    if head["redop"] == NCCL_AVG:
        total = (total / n).astype(dtype)
    if op == "allReduce":
        return [total.tobytes()] * n
    if op == "reduce":
        return [total.tobytes() if r == head["root"] else b"" for r in range(n)]
    return [total[r * count:(r + 1) * count].tobytes() for r in range(n)]  # reduceScatter


def _root_address() -> str:
    """Where the other hosts reach a root, chosen as NCCL chooses its bootstrap interface:
    MWRT_ADVERTISE_ADDR or MWRT_IFNAME if set, else the first interface that is not loopback
    and has an IPv4 address, else loopback."""
    if config.get("advertise_addr") or config.get("ifname"):
        return netaddr.advertise_address()
    for _, name in socket.if_nameindex():
        if name != "lo":
            try:
                return netaddr.interface_address(name)
            except ConfigError:  # no IPv4 address on it: the next one
                continue
    return netaddr.LOOPBACK


_hubs: list[_Hub] = []  # kept alive for the process's life, as NCCL's bootstrap thread is


def get_unique_id() -> bytes:
    """A new communicator's id: this process becomes its root (the hub's address, a secret)."""
    hub = _Hub()
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
        raise NcclError(_USAGE, "groupEnd without groupStart")
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
            raise NcclError(_ARGUMENT, f"unique id: expected {NCCL_UNIQUE_ID_BYTES} chars "
                                       f"(got {len(commId)})")
        if not 0 <= rank < ndev:
            raise NcclError(_ARGUMENT, f"rank {rank} is not in [0, {ndev})")
        found = json.loads(bytes(c & 0xFF for c in commId).rstrip(b"\0"))
        self._hub = next((h for h in _hubs if h.secret == found["secret"]), None)
        self._rank, self._size, self._seq = rank, ndev, 0
        self._device = fakecuda.Device().id
        self._timeout = config.get("channel_timeout")
        self._lock = threading.Lock()
        self._sock: socket.socket | None
        try:
            self._sock = _connected(socket.create_connection((found["host"], found["port"]),
                                                             timeout=10))
        except OSError as exc:
            raise NcclError(_SYSTEM, f"rank {rank}: cannot reach the communicator's root "
                                     f"({found['host']}:{found['port']}: {exc}); is rank 0 "
                                     "alive?") from None
        self._sock.settimeout(self._timeout + 5)  # the hub names a late rank before this
        _send(self._sock, {"secret": found["secret"], "rank": rank, "nranks": ndev,
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
            _send(self._sock, {"op": "bye"})
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
            raise NcclError(_USAGE, f"rank {self._rank}: {kind} on a destroyed communicator")
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
            raise NcclError(_USAGE, f"rank {self._rank}: {what} on a destroyed communicator")
        with self._lock:
            try:
                _send(sock, head, payload)
                reply, data = _recv(sock)
            except TimeoutError:
                raise NcclError(_REMOTE, f"rank {self._rank}: {what}: no answer from the "
                                         f"root after {self._timeout} s") from None
            except (OSError, ValueError):
                raise NcclError(_REMOTE, f"rank {self._rank}: {what}: lost the connection to "
                                         "the root (rank 0, which holds the communicator's "
                                         "hub, died or destroyed it)") from None
        if "error" in reply:
            raise NcclError(reply["status"], f"rank {self._rank}: {reply['error']}")
        if len(data) != expect:
            raise NcclError(_USAGE, f"rank {self._rank}: {what}: got {len(data)} bytes "
                                    f"(expected {expect})")
        return np.frombuffer(data, np.uint8)

    # -- checks ------------------------------------------------------------------------------

    def _check_peer(self, peer, what: str) -> None:
        if peer is not None and not 0 <= peer < self._size:
            raise NcclError(_ARGUMENT, f"rank {self._rank}: {what} {peer} is not in "
                                       f"[0, {self._size})")

    def _dtype(self, datatype: int):
        if datatype not in _DTYPES:
            raise NcclError(_ARGUMENT, f"rank {self._rank}: datatype {datatype} is not one "
                                       "this fake NCCL knows")
        return _DTYPES[datatype]

    def _memory(self, ptr: int, nbytes: int, what: str) -> np.ndarray:
        """The bytes at device pointer `ptr`, which must be a fake-GPU array of our device."""
        if nbytes == 0:
            return np.empty(0, np.uint8)
        arr = fakecuda.device_array_at(ptr)
        if arr is None:
            raise NcclError(_ARGUMENT, f"rank {self._rank}: {what}: pointer {ptr:#x} is not "
                                       "device memory (not a fake-GPU array's)")
        if arr.device.id != self._device:
            raise NcclError(_ARGUMENT, f"rank {self._rank}: {what}: the buffer is on device "
                                       f"{arr.device.id}, the communicator on {self._device}")
        if not arr.flags.c_contiguous:
            raise NcclError(_ARGUMENT, f"rank {self._rank}: {what}: the buffer is not "
                                       "contiguous")
        flat = arr.view(np.ndarray).reshape(-1).view(np.uint8)
        if flat.nbytes < nbytes:
            raise NcclError(_ARGUMENT, f"rank {self._rank}: {what}: the buffer has "
                                       f"{flat.nbytes} bytes (the call needs {nbytes})")
        return flat[:nbytes]

"""The fake NCCL's root: the hub that get_unique_id starts, NCCL's codes, and the frames its
members and the hub exchange (a JSON head and a payload), over loopback TCP or to the root's host.

The hub pairs each send with its receive and runs collectives as a star: every rank sends its
buffer, the hub combines them in rank order and answers each rank with its part. It fails a
collective that ranks disagree on, or that one has not joined within the timeout, naming
them; a rank that leaves fails what waits on it.
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

NCCL_INT8, NCCL_CHAR, NCCL_UINT8, NCCL_INT32, NCCL_INT, NCCL_UINT32 = 0, 0, 1, 2, 2, 3
NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16, NCCL_HALF, NCCL_FLOAT32, NCCL_FLOAT = 4, 5, 6, 6, 7, 7
NCCL_FLOAT64, NCCL_DOUBLE = 8, 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_UNIQUE_ID_BYTES = 128
# What fakenccl re-exports: NCCL's codes, as cupy.cuda.nccl has them.
__all__ = ["NCCL_INT8", "NCCL_CHAR", "NCCL_UINT8", "NCCL_INT32", "NCCL_INT", "NCCL_UINT32",
           "NCCL_INT64", "NCCL_UINT64", "NCCL_FLOAT16", "NCCL_HALF", "NCCL_FLOAT32",
           "NCCL_FLOAT", "NCCL_FLOAT64", "NCCL_DOUBLE", "NCCL_SUM", "NCCL_PROD", "NCCL_MAX",
           "NCCL_MIN", "NCCL_AVG", "NCCL_UNIQUE_ID_BYTES"]

DTYPES = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32,
          NCCL_UINT32: np.uint32, NCCL_INT64: np.int64, NCCL_UINT64: np.uint64,
          NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64}
UFUNCS = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum,
          NCCL_MIN: np.minimum, NCCL_AVG: np.add}
ERRORS = {2: "NCCL_ERROR_SYSTEM_ERROR", 3: "NCCL_ERROR_INTERNAL_ERROR",
          4: "NCCL_ERROR_INVALID_ARGUMENT", 5: "NCCL_ERROR_INVALID_USAGE",
          6: "NCCL_ERROR_REMOTE_ERROR"}
SYSTEM, ARGUMENT, USAGE, REMOTE = 2, 4, 5, 6
_HEADER = struct.Struct("!II")  # JSON length, payload length


# -- framing ------------------------------------------------------------------------------------

def send(sock: socket.socket, head: dict, payload=b"") -> None:
    text = json.dumps(head).encode()
    data = _HEADER.pack(len(text), len(payload)) + text
    if len(payload) <= 1 << 16:  # one segment: no wait for the peer's delayed ACK
        sock.sendall(data + bytes(payload))
    else:
        sock.sendall(data)
        sock.sendall(payload)


def connected(sock: socket.socket) -> socket.socket:
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


def recv(sock: socket.socket) -> tuple[dict, bytearray]:
    size, nbytes = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    return json.loads(_recv_exactly(sock, size)), _recv_exactly(sock, nbytes)


# -- the root: the hub that get_unique_id starts --------------------------------------------------

class Hub:
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
            threading.Thread(target=self._serve, args=(connected(sock),), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(10.0)  # for the hello; then a member may stay quiet as long as it likes
        try:
            hello, _ = recv(sock)
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
                head, payload = recv(sock)
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
            send(self.conns[rank], head, payload)
        except OSError:
            pass  # its reader thread sees the loss

    def _fail(self, rank: int, status: int, text: str) -> None:
        self._reply(rank, {"error": text, "status": status})

    def _handle(self, rank: int, head: dict, payload) -> None:
        op = head["op"]
        if op == "send":
            peer = head["peer"]
            if peer in self.gone:
                return self._fail(rank, REMOTE, f"send to rank {peer}: {self.gone[peer]}")
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
                self._fail(dst, USAGE, f"recv from rank {src}: message size does not match "
                                        f"(got {len(payload)} bytes, expected {nbytes})")
            else:
                self._reply(dst, {"ok": 1}, payload)
        if wants and src in self.gone:
            while wants:
                wants.popleft()
                self._fail(dst, REMOTE, f"recv from rank {src}: {self.gone[src]}")

    def _complete(self, seq: int) -> None:
        calls = self.pending.pop(seq)
        self.started.pop(seq, None)
        heads = [calls[r][0] for r in range(self.size)]
        keys = ("op", "count", "datatype", "redop", "root")
        if any(tuple(h.get(k) for k in keys) != tuple(heads[0].get(k) for k in keys)
               for h in heads):
            said = "; ".join(f"rank {r}: {[h.get(k) for k in keys]}" for r, h in enumerate(heads))
            for r in range(self.size):
                self._fail(r, USAGE, f"collective #{seq}: ranks disagree on (op, count, "
                                      f"datatype, redop, root): {said}")
            return
        for r, part in enumerate(_combine(heads[0], [calls[r][1] for r in range(self.size)])):
            self._reply(r, {"ok": 1}, part)

    def _abort(self, seq: int, why: str) -> None:
        for r in self.pending.pop(seq, {}):
            self._fail(r, REMOTE, f"collective #{seq}: {why}")
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
    dtype = DTYPES[head["datatype"]]
    arrays = [np.frombuffer(p, dtype) for p in payloads]
    if op == "broadcast":
        return [payloads[head["root"]]] * n
    if op == "allGather":
        return [b"".join(bytes(p) for p in payloads)] * n
    total = arrays[0].copy()
    for other in arrays[1:]:  # in rank order, as every rank would see it
        UFUNCS[head["redop"]](total, other, out=total)
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

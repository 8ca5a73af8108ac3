"""Why a CURVE handshake on the command socket failed, from a socket monitor's events: the
master's error (which side lacks a key, or that the keys differ) and the worker's log line
(once per peer, naming it where its address can still be read)."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Mapping
from typing import Any

import zmq

UNNAMED = "an unnamed peer (gone before its address could be read)"


def recv_monitor_message(monitor, flags: int = 0) -> dict[str, Any]:
    """One event from a socket monitor: {"event", "value", "endpoint"}, as pyzmq's
    zmq.utils.monitor reads it; that module imports asyncio (~0.1 s of every start)."""
    frames = monitor.recv_multipart(flags)
    if len(frames) != 2 or len(frames[0]) != 6:
        raise RuntimeError(f"socket monitor: malformed event (got {len(frames)} frames, "
                           "expected 2: a 6-byte event and value, then the endpoint)")
    event, value = struct.unpack("=hi", frames[0])
    return {"event": zmq.Event(event), "value": value, "endpoint": frames[1]}


def mechanism_mismatch(event: int, value: int) -> bool:
    """One side speaks CURVE, the other plain ZMTP (NULL): one of them has no key."""
    return (event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)


# How a probe's handshake ended (probe): only an answer tells why a worker hung up.
ADMITTED, MISMATCH, REFUSED = "admitted", "mechanism mismatch", "refused"
HUNG_UP, SILENT = "hung up", "no answer"


def probe(context, address: str, keys=None, timeout: float = 2.0) -> str:
    """How a fresh connection's handshake with the daemon at `address` ends (over CURVE given
    `keys`, else plain): ADMITTED, MISMATCH (one side speaks CURVE, the other not), REFUSED
    (its key), HUNG_UP, or SILENT (no answer within `timeout`)."""
    from .auth import connect_curve

    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        connect_curve(sock, keys)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                      | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                      | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                      | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    try:
        sock.connect(address)
        if not monitor.poll(timeout * 1000):
            return SILENT
        event = recv_monitor_message(monitor)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
    if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
        return ADMITTED
    if mechanism_mismatch(event["event"], event["value"]):
        return MISMATCH
    return HUNG_UP if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL else REFUSED


def why_hung_up(context, address: str, keys, timeout: float = 2.0) -> str:
    """Why the daemon at `address` hung up on a handshake with `keys`: a refusal (REFUSED, or
    MISMATCH) only when a probe with them is hung up on too and the daemon then greets a
    plain connection, alive, naming the mechanism that refuses them. A dying daemon hangs up
    as a refusing one does, and its port takes connections until its last socket closes
    (the kernel closes them one by one, the listener often last): silence is no verdict."""
    seen = probe(context, address, keys, timeout)
    if seen != HUNG_UP:
        return seen
    mechanism = greeting(address, timeout)
    if mechanism is None:
        return HUNG_UP
    if (mechanism == "CURVE") != (keys is not None):
        return MISMATCH
    return REFUSED if mechanism == "CURVE" else HUNG_UP  # a NULL daemon refuses no key


# A ZMTP 3 peer's greeting, up to its mechanism: signature (10 bytes), version (2), then
# the mechanism's name (20, NUL-padded). libzmq sends its version and mechanism only after
# the peer's signature and major version, which is all a greeting() sends.
_SIGNATURE = b"\xff" + bytes(8) + b"\x7f"
_MECHANISM_END = 32


def greeting(address: str, timeout: float = 2.0) -> str | None:
    """The mechanism (CURVE, NULL) that the ZMTP greeting of the daemon at `address` names,
    read over a plain socket that then hangs up before its own mechanism; None if it hangs up
    or says nothing within `timeout`. A keyless ZMTP probe learns no more than a hang-up
    where the daemon reads its NULL first (most times, on loopback)."""
    deadline = time.monotonic() + timeout
    try:
        with _connect(address, timeout) as sock:
            sock.sendall(_SIGNATURE + b"\x03")
            head = b""
            while len(head) < _MECHANISM_END and time.monotonic() < deadline:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = sock.recv(_MECHANISM_END - len(head))
                if not chunk:
                    return None
                head += chunk
    except (OSError, ValueError):
        return None
    if len(head) < _MECHANISM_END or head[0] != 0xFF or head[10] < 3:  # not ZMTP 3
        return None
    return head[12:_MECHANISM_END].rstrip(b"\0").decode("ascii", "replace")


def _connect(address: str, timeout: float) -> socket.socket:
    """A plain socket connected to `address` (tcp://host:port or ipc://path)."""
    if address.startswith("ipc://"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(address.removeprefix("ipc://"))
        except OSError:
            sock.close()
            raise
        return sock
    host, _, port = address.rpartition("://")[2].rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout)


def listening(address: str, timeout: float = 2.0) -> bool:
    """Whether anything accepts connections at `address` (tcp://host:port or ipc://path)
    now; a dying daemon's port does until its last socket closes."""
    try:
        with _connect(address, timeout):
            return True
    except (OSError, ValueError):
        return False


def hang_up(worker: str, seen: str, listens: bool, timeout: float = 2.0) -> str:
    """The master's error for a hang-up that the probes did not explain: what they saw."""
    if not listens:
        return (f"{worker}: closed the connection before answering the Hello (it died or was "
                "stopped); start it again, or use another")
    if seen == ADMITTED:
        return (f"{worker}: hung up during the handshake, but a second connection (with the "
                "same key, if any) got in: no key was refused; try again, and see its log")
    then = "was hung up on too" if seen == HUNG_UP else f"had no answer within {timeout:g} s"
    return (f"{worker}: hung up during the handshake, and a second connection {then}, though "
            "its port takes connections (a worker dying or stopping, too busy to answer, or "
            "not an mwrt worker; no refusal of a key was seen); start it again, or use another")


def master_refusal(keys, worker: str, mismatch: bool) -> str:
    """The master's error for a handshake refused for its key: which side lacks one
    (`mismatch`: one side speaks CURVE, the other not), or that they differ."""
    if keys is None:  # a keyless master's handshake fails only against a CURVE worker
        return (f"{worker}: requires a key and this master has none; pass the master.key "
                "made with the worker's key by `mwrt-worker keygen` as key= (--key to `mwrt "
                "status` and `mwrt dashboard`) or in MWRT_KEY_FILE")
    if mismatch:
        return (f"{worker}: has no key, but this master offers one (CURVE); start the worker "
                "with --key-file worker.key from the same `mwrt-worker keygen`, or connect "
                "without key= and MWRT_KEY_FILE")
    return (f"{worker}: refused this master's key (the keys do not match: a master.key made "
            "for other workers, or before a re-keygen); use the master.key made with the "
            "worker's key (mwrt-worker keygen) via key= or MWRT_KEY_FILE")


def worker_refusal(event: int, value: int, worker_keyed: bool) -> str:
    """Why a worker refused a connection, for its log."""
    if mechanism_mismatch(event, value) and worker_keyed:
        return "it offered no key (a master without a key file, or not a master at all)"
    if mechanism_mismatch(event, value):
        return "it offered a CURVE key but this worker has none (start it with --key-file)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and \
            value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return ("its CURVE handshake did not decrypt (a master.key made for other workers, or "
                "before a re-keygen)")
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and not worker_keyed:
        # A keyed master sees the mismatch first and hangs up: the worker sees only that.
        return ("it hung up during the handshake (a master with a key file? this worker has "
                "none: start it with --key-file)")
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return ("it hung up during the handshake (a master whose key does not fit this "
                "worker's, or not a master at all)")
    # A flag's name is None for a combination of events; monitor events come one at a time.
    return (zmq.Event(event).name or f"event {event}").lower().replace("_", " ")


def _rank(reason: str) -> int:
    """How much a refusal's reason tells: a key that does not decrypt says more than a
    connection that offered none (a master's keyless probe follows its own failed key)."""
    return 2 if "did not decrypt" in reason else 1 if "hung up" in reason else 0


LOCAL = "a process of this host (on the Unix socket)"


def peer_of_fd(fd: int) -> str:
    """'host:port' of the TCP connection on `fd` (a monitor's ACCEPTED event), LOCAL for a
    Unix socket's (whose peer has no address), else UNNAMED."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:  # its own family, on a dup of ours
            address = sock.getpeername()
    except OSError:  # closed already: a refusal is often faster than any monitor
        return UNNAMED
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return LOCAL if sock.family == socket.AF_UNIX else str(address)


class RefusalLog:
    """A daemon's refused connections, from its command socket's monitor, logged once per
    peer host and window (a master knocks on three sockets and retries). The ACCEPTED event
    before a refusal names the peer, when its connection is not gone before we ask."""

    EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
              | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_ACCEPTED)
    _MAX_PEERS = 1024  # many strangers: forget them (the daemon's log limit caps the lines)

    def __init__(self, keyed: bool, log_line, window: float):
        self.keyed, self.log_line, self.window = keyed, log_line, window
        self.peer = UNNAMED  # the last accepted connection's peer, until a refusal uses it
        self.pending: dict[str, tuple[str, str]] = {}  # host -> (peer, why), for flush()
        self.logged: dict[str, float] = {}  # host -> when last logged
        self.zap_logged: dict[str, float] = {}  # host -> when the ZAP handler refused its key

    def note(self, event: Mapping[str, Any]) -> None:
        """Take one monitor event; a refusal is logged at the next flush()."""
        kind, value = event["event"], event["value"]
        if kind == zmq.EVENT_ACCEPTED:
            self.peer = peer_of_fd(value)
            return
        if self.peer == UNNAMED and self.pending:
            return  # most likely another socket of a peer already noted
        host = self.peer.rsplit(":", 1)[0] if self.peer != UNNAMED else UNNAMED
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH and self.keyed:
            # The ZAP handler (auth.MasterAdmission) logged it, with the master's key; the
            # master's probes that follow (hang-ups) say nothing more.
            self.zap_logged[host] = time.monotonic()
            self.peer = UNNAMED
            return
        reason = worker_refusal(kind, value, self.keyed)
        known = self.pending.get(host)
        if (known is None and len(self.pending) < self._MAX_PEERS) or \
                (known is not None and _rank(reason) > _rank(known[1])):
            self.pending[host] = (self.peer if known is None else known[0], reason)
        self.peer = UNNAMED

    def _key_refused(self, host: str, now: float) -> bool:
        """Whether the ZAP handler refused `host`'s key within the window (any host's, for an
        unnamed peer: most likely the same master, gone before its address was read)."""
        times = self.zap_logged.values() if host == UNNAMED else [self.zap_logged.get(host)]
        return any(t is not None and now - t < self.window for t in times)

    def drain(self, monitor) -> None:
        """Take every event waiting on `monitor` (before a stop, so none goes unlogged)."""
        while monitor.poll(0):
            self.note(recv_monitor_message(monitor))

    def flush(self) -> None:
        """Log the refusals noted since the last flush: an unnamed one only if none is named."""
        pending, self.pending = self.pending, {}
        if len(pending) > 1:
            unnamed = pending.pop(UNNAMED, None)
            if unnamed is not None and len(pending) == 1:  # most likely the same peer: keep
                (host, (peer, reason)), = pending.items()  # the more telling reason
                if _rank(unnamed[1]) > _rank(reason):
                    pending[host] = (peer, unnamed[1])
        now = time.monotonic()
        if len(self.logged) >= self._MAX_PEERS:
            self.logged.clear()
        if len(self.zap_logged) >= self._MAX_PEERS:
            self.zap_logged.clear()
        for host, (peer, reason) in pending.items():
            if _rank(reason) == 1 and self._key_refused(host, now):
                continue  # a refused key's probes, logged as that refusal
            last = self.logged.get(host)
            if last is None or now - last >= self.window:
                self.logged[host] = now
                self.log_line("refused a connection from %s: %s", peer, reason)


class PeerLog:
    """Refusal log lines of a listener (a data channel, a store), at most one per peer host
    per `window` seconds: a stranger's 10,000 refused connections make one line a minute,
    which then counts the ones not logged. Thread-safe; hosts past `max_peers` share one
    line, so neither the log nor this table grows with a flood of addresses."""

    def __init__(self, logger, window: float = 60.0, max_peers: int = 1024):
        import threading

        self.logger, self.window, self.max_peers = logger, window, max_peers
        self.peers: dict[str, list] = {}  # host -> [when last logged, refusals not logged]
        self.total = 0  # refusals seen, logged or not
        self.lock = threading.Lock()

    def warning(self, peer: str, message: str, *args) -> None:
        """Log `message % args` for a refusal of `peer` ('host:port'), unless its host had a
        line in the last window."""
        host = peer.rsplit(":", 1)[0] if peer.count(":") == 1 else peer
        now = time.monotonic()
        with self.lock:
            self.total += 1
            if host not in self.peers and len(self.peers) >= self.max_peers:
                self.peers = {h: v for h, v in self.peers.items() if now - v[0] < self.window}
                if len(self.peers) >= self.max_peers:
                    host = "other peers"
            entry = self.peers.setdefault(host, [-self.window, 0])
            if now - entry[0] < self.window:
                entry[1] += 1
                return
            quiet, entry[:] = entry[1], [now, 0]
        if quiet:
            message += f" (and {quiet} more refusals of {host} not logged)"
        self.logger.warning(message, *args)

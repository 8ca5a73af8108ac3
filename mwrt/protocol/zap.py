"""The ZAP handler of a worker daemon's ZeroMQ context (RFC 27, ZAP 1.0): libzmq asks it
whether to admit each connection's CURVE key. pyzmq's ThreadAuthenticator does the same on
an asyncio loop, whose import alone took ~0.1 s of every daemon's start."""

from __future__ import annotations

import itertools
import threading

import zmq
from zmq.utils import z85

ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq sends a context's ZAP requests
_VERSION = b"1.0"
_stoppers = itertools.count()


class ZapHandler:
    """Admits NULL connections (the daemon's own inproc sockets) and the CURVE keys that
    `admission.admit(key, peer address)` accepts (auth.MasterAdmission)."""

    def __init__(self, context: zmq.Context, admission):
        self.admission = admission
        self.socket = context.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(ENDPOINT)  # before any CURVE socket of the context listens
        stopper = f"inproc://mwrt-zap-stop-{next(_stoppers)}"
        self._stop_in = context.socket(zmq.PAIR)
        self._stop_in.bind(stopper)
        self._stop_out = context.socket(zmq.PAIR)
        self._stop_out.connect(stopper)
        self.thread = threading.Thread(target=self._serve, daemon=True, name="mwrt-zap")
        self.thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._stop_in, zmq.POLLIN)
        try:
            while self._stop_in not in dict(poller.poll()):
                self.socket.send_multipart(self.answer(self.socket.recv_multipart()))
        finally:
            self.socket.close(linger=0)
            self._stop_in.close(linger=0)

    def answer(self, request: list[bytes]) -> list[bytes]:
        """The reply to one ZAP request: [version, id, status, text, user id, metadata]."""
        request_id = request[1] if len(request) > 1 else b""
        if len(request) < 6 or request[0] != _VERSION:
            return [_VERSION, request_id, b"400", b"malformed ZAP request", b"", b""]
        mechanism, credentials = request[5], request[6:]
        if mechanism == b"NULL":
            return [_VERSION, request_id, b"200", b"OK", b"anonymous", b""]
        if mechanism == b"CURVE" and len(credentials) == 1:
            if self.admission.admit(credentials[0], request[3].decode(errors="replace")):
                return [_VERSION, request_id, b"200", b"OK", z85.encode(credentials[0]), b""]
            return [_VERSION, request_id, b"400", b"Unknown key", b"", b""]
        return [_VERSION, request_id, b"400", b"mechanism not admitted", b"", b""]

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread (it closes its sockets) within `timeout` seconds."""
        if self.thread.is_alive():
            self._stop_out.send(b"")
            self.thread.join(timeout)
        self._stop_out.close(linger=0)

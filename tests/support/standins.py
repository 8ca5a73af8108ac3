"""Stand-ins for a worker in a state a real daemon reaches only by chance: real sockets, no
mwrt code."""

from __future__ import annotations

import select
import socket
import threading


class HangsUp:
    """A worker that hangs up mid-handshake on its first `count` connections (a master's two:
    its rx socket's first, whose handshake it watches, then its tx's). Then, given `then` (a worker's
    tcp://host:port), it relays later connections there: a worker that cut a connection
    and serves on. Else it stays silent until close(): a
    worker dying as a killed daemon does on a loaded machine, where the kernel closes its
    sockets one by one, so its connections to the master can close while its listener
    still takes connections (the kernel completes their TCP handshake) that nothing answers."""

    def __init__(self, count: int = 2, then: str | None = None):
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.count, self.then, self.hung_up = count, then, 0
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    def _serve(self) -> None:
        while not self.stopped.is_set() and (self.then or self.hung_up < self.count):
            if not select.select([self.listener], [], [], 0.05)[0]:
                continue
            connection, _ = self.listener.accept()
            if self.hung_up < self.count:
                connection.close()  # the master's greeting unread: a reset, as a kill's
                self.hung_up += 1
            else:
                relay = threading.Thread(target=self._relay, args=(connection,), daemon=True)
                self.threads.append(relay)
                relay.start()

    def _relay(self, near: socket.socket) -> None:
        host, _, port = str(self.then).rpartition("://")[2].rpartition(":")
        try:
            with near, socket.create_connection((host, int(port)), 5) as far:
                other = {near: far, far: near}
                while not self.stopped.is_set():
                    for sock in select.select(list(other), [], [], 0.05)[0]:
                        data = sock.recv(65536)
                        if not data:
                            return
                        other[sock].sendall(data)
        except OSError:  # a side reset the connection (a probe closes at once): relay no more
            return

    def close(self) -> None:
        """Close every connection and the listener: the death completes."""
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=10)
        self.listener.close()

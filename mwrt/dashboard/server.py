"""The dashboard's web server: Python's own http.server, one thread per request.

Three kinds of path, each refused without the token the printed URL carries (as Jupyter's
and Dask's are): `/` the page, `/state` the History as JSON (with `?since=CURSOR`, only the
timeline slices added after it), `/static/NAME` the page's script, its style and the
vendored uPlot. Nothing else is served and nothing is written.
"""

from __future__ import annotations

import hmac
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from .history import History

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
FILES = ("app.js", "app.css", "uplot.iife.min.js", "uplot.min.css")


# At most this many connections are served at once, each thread for at most TIMEOUT seconds
# of silence: idle connections (a stalled client, a port scan) cannot give the master a
# thread each. A connection over the bound is closed at once; the page retries at its next
# poll.
MAX_CONNECTIONS = 32


class Server(ThreadingHTTPServer):
    """Serves one History to whoever shows the token; stop with close()."""

    daemon_threads = True
    # The kernel's queue of connections not yet accepted: socketserver's 5 dropped the SYNs
    # of a burst (a page's requests, idle sockets), and each such client waited a second or
    # more for its retry.
    request_queue_size = 4 * MAX_CONNECTIONS

    def __init__(self, history: History, host: str, port: int, token: str):
        self.history, self.token = history, token
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__((host, port), Handler)
        self.thread = threading.Thread(target=self.serve_forever, name="mwrt-dashboard-http",
                                       kwargs={"poll_interval": 0.2}, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        if self.thread.is_alive():
            self.shutdown()
        self.server_close()

    def process_request(self, request, client_address) -> None:
        """A thread for the connection while a slot is free; else close it now."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class Handler(BaseHTTPRequestHandler):
    """GET only; the token from `?token=` or the `mwrt-token` header."""

    server: Server
    timeout = 10  # seconds a connection may stay silent before its thread lets it go

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        given = parse_qs(url.query).get("token", [self.headers.get("mwrt-token", "")])[0]
        if not hmac.compare_digest(given.encode(), self.server.token.encode()):
            self._send(403, "text/plain", b"mwrt dashboard: missing or wrong token (got "
                       + (b"none" if not given else b"another") + b"); open the URL with "
                       b"?token= that the dashboard printed when it started\n")
        elif url.path == "/":
            page = _read("index.html").replace(b"{{token}}", self.server.token.encode())
            self._send(200, TYPES[".html"], page)
        elif url.path == "/state":
            since = parse_qs(url.query).get("since", [""])[0]
            state = self.server.history.state(int(since) if since.isdigit() else None)
            body = json.dumps(state, default=str).encode()
            self._send(200, "application/json", body)
        elif url.path.startswith("/static/") and url.path[8:] in FILES:
            name = url.path[8:]
            self._send(200, TYPES[os.path.splitext(name)[1]], _read(name))
        else:
            self._send(404, "text/plain", f"mwrt dashboard: no page {url.path}\n".encode())

    def _send(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind + "; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")  # the token stays in this tab
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:
        """Quiet: a page polling every second would fill the master's terminal."""


def _read(name: str) -> bytes:
    with open(os.path.join(STATIC, name), "rb") as f:
        return f.read()

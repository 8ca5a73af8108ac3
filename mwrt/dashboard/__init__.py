"""`mwrt.dashboard()`: a live web page of every worker of this master's session.

A sampler thread asks `mwrt.status()` (what `mwrt status --json` prints) every `interval`
seconds and, inside a master, reads the timeline the workers record (what `mwrt.profile()`
records); a server thread (http.server) shows it. Plots are drawn by uPlot 1.6.32 (MIT,
51 KB, vendored in static/: no internet is needed, and it draws thousands of points per
series without lag where Chart.js is four times its size).
"""

from __future__ import annotations

import secrets
import socket
import sys

from ..errors import ConfigError
from ..netaddr import is_loopback, join_host_port
from .history import History
from .sampler import Sampler


class Dashboard:
    """A running dashboard: its `url` (with the token), and close()."""

    def __init__(self, host: str, port: int, interval: float, timeline: bool):
        from .server import Server  # http.server (and ssl under it): ~0.1 s of every import

        self.token = secrets.token_urlsafe(24)
        self.history = History()
        self.sampler = Sampler(self.history, interval, timeline)
        self.server = Server(self.history, host, port, self.token)
        port = self.server.server_address[1]
        self.url = f"http://{join_host_port(_shown(host), port)}/?token={self.token}"

    def start(self) -> Dashboard:
        self.sampler.start()
        self.server.start()
        return self

    def close(self) -> None:
        """Stop sampling (turning off the timeline it recorded) and serving."""
        self.sampler.stop()
        self.server.close()

    def __repr__(self) -> str:
        return f"<mwrt dashboard at {self.url}>"


def dashboard(port: int = 8790, host: str = "127.0.0.1", *, interval: float = 1.0,
              timeline: bool = True, quiet: bool = False) -> Dashboard:
    """Serve a live page of this session's workers at http://HOST:PORT/?token=...; close() it.

    Loopback only unless `host` says otherwise (the token then guards it alone: use a
    tunnel rather than an open port). `port=0` takes a free one. `timeline` records the
    ops this master runs, per stream, as `mwrt.profile()` does.
    """
    if not interval > 0:
        raise ConfigError(f"mwrt.dashboard: interval must be positive (got {interval!r})")
    try:
        board = Dashboard(host, port, interval, timeline)
    except OSError as exc:
        raise ConfigError(f"mwrt.dashboard: cannot listen on {join_host_port(host, port)} "
                          f"({exc}); pass port=0 for a free port, or another port") from None
    if not is_loopback(host):
        print(f"mwrt dashboard: listening on {host}, beyond this machine; the token is all "
              "that guards it", file=sys.stderr)
    if not quiet:
        print(f"mwrt dashboard: {board.url}", file=sys.stderr, flush=True)
    return board.start()


def _shown(host: str) -> str:
    """The host to print: the one asked for, or this machine's name for a wildcard."""
    return socket.gethostname() if host in ("", "0.0.0.0", "::") else host

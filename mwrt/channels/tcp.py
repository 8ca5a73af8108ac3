"""The tcp channel: the socket channel over TCP, every segment a DATA frame; the default
between hosts.

A rank listens on the address `mwrt.netaddr` picks (the interface that routes to the
store's host, or the one MWRT_IFNAME / MWRT_ADVERTISE_ADDR names) and publishes it.
Unkeyed, a channel listens on loopback only: beyond it, anyone who reaches the port
could read or feed tensors, so a job needs a secret there (MWRT_JOB_SECRET, a key file)
or the explicit MWRT_INSECURE=1.
"""

from __future__ import annotations

import logging
import socket

from .. import config
from ..errors import ChannelClosedError, ConfigError
from ..netaddr import advertise_address, bind_listener, join_host_port, split_host_port
from ..unkeyed import may_listen, refusal
from .sockets import SocketChannel

log = logging.getLogger("mwrt.channels")

# Loopback tops out near 1.7 GB/s with 4 MiB buffers (BASELINE.md); the kernel caps the value.
_BUFFER_BYTES = 4 << 20
_RISK = "could read or feed this job's tensors"


def tune(sock: socket.socket) -> None:
    """No Nagle delay for small frames; large kernel buffers for bulk ones."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER_BYTES)


def listen_host(store, key, host: str | None = None) -> tuple[str, bool]:
    """Where a channel listens for tcp peers, and whether it may (unkeyed.may_listen)."""
    if host is None:
        host = advertise_address(getattr(store, "host", None))
    return host, may_listen(host, key, "an unkeyed data channel", _RISK)


def no_secret(what: str, host: str) -> ConfigError:
    """The refusal of an unkeyed listener beyond loopback, with the fixes."""
    return refusal(what, host, _RISK)


def listen_tcp(host: str, backlog: int, what: str) -> tuple[socket.socket, str]:
    """A tuned TCP listener on `host` (any port) and the address peers connect to."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    tune(sock)  # accepted sockets inherit the buffer sizes, set before the handshake
    try:
        bind_listener(sock, host, 0, what)
    except BaseException:
        sock.close()
        raise
    sock.listen(max(backlog, 16))
    return sock, join_host_port(host, sock.getsockname()[1])


def connect_tcp(channel, address: str, peer: int, timeout: float) -> socket.socket:
    """A tuned connection to `peer` at `address`; an unreachable one fails within the
    connect timeout (MWRT_CONNECT_TIMEOUT), naming both ends and the fix."""
    host, port = split_host_port(address, f"rank {peer}'s address")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    tune(sock)
    sock.settimeout(min(timeout, config.get("connect_timeout")))
    try:
        sock.connect((host, port))
    except OSError as exc:
        sock.close()
        here = getattr(channel, "host", None) or "here"
        raise ChannelClosedError(
            f"{channel.name} send rank {channel.rank}->{peer}: cannot connect to rank {peer} at "
            f"{address} from {here} ({type(exc).__name__}: {exc}); rank {peer} closed its "
            "channel or died (check its logs), or that address is not reachable from here "
            f"(set MWRT_IFNAME or MWRT_ADVERTISE_ADDR on rank {peer})", peer=peer) from None
    return sock


class TcpChannel(SocketChannel):
    """Point-to-point buffers over TCP, on the address `listen_host` picks."""

    name = "tcp"
    eager_bytes: int | None = None  # each channel's own, from what the kernel grants (_listen)

    def __init__(self, rank, world_size, *, store, prefix="mwrt", key=None, timeout=None,
                 host: str | None = None):
        self.host, allowed = listen_host(store, key, host)
        if not allowed:
            raise no_secret(f"tcp channel rank {rank}", self.host)
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)

    def _listen(self):
        sock, address = listen_tcp(self.host, self.world_size, f"tcp channel rank {self.rank}")
        self.eager_bytes = _eager_bytes(sock)
        return [sock], address

    def _connect(self, address, peer, timeout):
        return connect_tcp(self, address, peer, timeout)


def _eager_bytes(sock: socket.socket) -> int:
    """The largest send that lands whole in the socket buffers, so an exchange may send
    then receive on one thread (no hand-off); a larger one would reach the peer before
    its receive is posted, and be copied twice. The kernel caps what tune() asks for
    (net.core.wmem_max: 4 MiB here, 208 KiB on a stock kernel)."""
    granted = min(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                  sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
    return min(2 << 20, granted // 2)  # Linux reports twice what it grants for data

"""The tcp channel: the socket machinery of `sockets.py` over TCP, the default between hosts."""

from __future__ import annotations

import ipaddress
import socket

from ..errors import ChannelClosedError, ConfigError
from .sockets import SocketChannel

# Loopback tops out near 1.7 GB/s with 4 MiB buffers (BASELINE.md); the kernel caps the value.
_BUFFER_BYTES = 4 << 20


def tune(sock: socket.socket) -> None:
    """No Nagle delay for small frames; large kernel buffers for bulk ones."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER_BYTES)


class TcpChannel(SocketChannel):
    """Point-to-point buffers over TCP; each rank listens on `host` (loopback by default)."""

    name = "tcp"

    def __init__(self, rank, world_size, *, store, prefix="mwrt", key=None, timeout=None,
                 host: str = "127.0.0.1"):
        if key is None and not _is_loopback(host):
            raise ConfigError(
                f"tcp channel: refusing to listen on non-loopback host {host!r} without a key; "
                "pass key=mwrt.auth.generate_hmac_key() (the same on every rank)")
        self.host = host
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)

    def _listen(self):
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        tune(sock)  # accepted sockets inherit the buffer sizes, set before the handshake
        self.eager_bytes = _eager_bytes(sock)
        sock.bind((self.host, 0))
        sock.listen(max(self.world_size, 16))
        port = sock.getsockname()[1]
        return sock, f"[{self.host}]:{port}" if family == socket.AF_INET6 else f"{self.host}:{port}"

    def _connect(self, address, peer, timeout):
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        tune(sock)
        sock.settimeout(timeout)
        try:
            sock.connect((host, int(port)))
        except OSError as exc:
            sock.close()
            raise ChannelClosedError(
                f"tcp send rank {self.rank}->{peer}: cannot connect to rank {peer} at {address} "
                f"({type(exc).__name__}: {exc}); rank {peer} closed its channel or died, check "
                "its logs", peer=peer) from None
        return sock


def _eager_bytes(sock: socket.socket) -> int:
    """The largest send that lands whole in the socket buffers, so an exchange may send
    then receive on one thread (no hand-off); a larger one would reach the peer before
    its receive is posted, and be copied twice. The kernel caps what tune() asks for
    (net.core.wmem_max: 4 MiB here, 208 KiB on a stock kernel)."""
    granted = min(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                  sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
    return min(2 << 20, granted // 2)  # Linux reports twice what it grants for data


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"

"""The auto channel: shared memory with the ranks of this host, TCP with the others.

Each rank listens twice, on an abstract UNIX socket (the shm channel's) and on TCP
(the tcp channel's address and key rules), and publishes both beside its host
identity (`netaddr.host_identity`: hostname, boot id, the /dev/shm filesystem and the
network namespace). A sender compares the peer's identity with its own when it first
connects: equal, it connects over the UNIX socket, whose connections take the shm
channel's path (`memorypaths.CmaPath`: large segments read in place or through shared
slots); different, over TCP, whose connections take the tcp channel's (`paths.SocketPath`).
Both ends of a pair decide alike, since identity equality is symmetric. The single-copy
collectives (CMA) run for a group whose ranks all share this host; any other group runs
the generic algorithms over the per-pair paths. Force one path for every pair with
channel 'shm' or 'tcp'.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import ClassVar

from ..errors import ChannelError
from ..netaddr import host_identity
from ..unkeyed import FIX
from .memorypaths import CmaPath, SharedMemory
from .paths import SocketPath
from .shm import connect_unix, listen_unix
from .sockets import SocketChannel
from .tcp import connect_tcp, listen_host, listen_tcp


class AutoChannel(SocketChannel):
    """Per peer pair: shm when the two processes share a host, else tcp."""

    name = "auto"
    native_collectives = "cma"  # for groups of one host (mwrt.collective.cma_ops)
    # tcp connections: SocketPath, every segment a DATA frame
    paths: ClassVar[Mapping[int, type[SocketPath]]] = {socket.AF_UNIX: CmaPath}

    def __init__(self, rank, world_size, *, store, prefix="mwrt", key=None, timeout=None,
                 host: str | None = None):
        self.host, self._tcp_allowed = listen_host(store, key, host)
        self.identity = host_identity()
        self._hosts: dict[int, str] = {}  # rank -> its host identity
        self.memory = SharedMemory()  # before peers connect: their paths read it
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)

    def _listen(self):
        sock, local = listen_unix(self.world_size)
        listeners, tcp = [sock], ""  # unkeyed beyond loopback: no tcp listener (peers of
        if self._tcp_allowed:        # this host still connect)
            sock, tcp = listen_tcp(self.host, self.world_size, f"auto channel rank {self.rank}")
            listeners.append(sock)
        return listeners, f"{local}|{tcp}"

    def _connect(self, address, peer, timeout):
        identity, name, tcp = address.split("|")
        if identity == self.identity:
            return connect_unix(self, f"{identity}|{name}", peer, timeout)
        if not tcp:
            raise ChannelError(
                f"auto send rank {self.rank}->{peer}: rank {peer} is on another host but "
                f"listens on this host's shared memory only: the job has no secret; {FIX}")
        return connect_tcp(self, tcp, peer, timeout)

    def _shown(self, record, sock):
        if sock.family == socket.AF_UNIX:
            return "this host's shared memory"
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"

    def host_of(self, rank: int) -> str:
        """`rank`'s host identity, from its published address."""
        if rank == self.rank:
            return self.identity
        if rank not in self._hosts:
            address = self.store.get(self._address_key(rank), timeout=self.timeout).decode()
            self._hosts[rank] = address.split("|")[0]
        return self._hosts[rank]

    def shares_host(self, rank: int) -> bool:
        """True if `rank` is this process or on this host (from its published address)."""
        return self.host_of(rank) == self.identity

"""The auto channel: shared memory with the ranks of this host, TCP with the others.

Each rank listens twice, on an abstract UNIX socket (the shm channel's) and on TCP
(the tcp channel's address and key rules), and publishes both beside its host
identity (`netaddr.host_identity`: hostname, boot id, the /dev/shm filesystem and the
network namespace). A sender compares the peer's identity with its own when it first
connects: equal, the pair talks as the shm channel does (large segments through shared
slots); different, as the tcp channel does. Both ends of a pair decide alike, since
identity equality is symmetric. The single-copy collectives (CMA) run for a group whose
ranks all share this host; any other group runs the generic algorithms over the
per-pair paths. Force one path for every pair with channel 'shm' or 'tcp'.
"""

from __future__ import annotations

import socket

from ..errors import ChannelError, WireError
from ..netaddr import host_identity
from ..unkeyed import FIX
from .shm import CMA, MAP, SHM, ShmChannel
from .tcp import connect_tcp, listen_host, listen_tcp


class AutoChannel(ShmChannel):
    """Per peer pair: shm when the two processes share a host, else tcp."""

    name = "auto"

    def __init__(self, rank, world_size, *, store, prefix="mwrt", key=None, timeout=None,
                 host: str | None = None):
        self.host, self._tcp_allowed = listen_host(store, key, host)
        self.identity = host_identity()
        self._remote: dict[int, bool] = {}  # peer -> True when it is on another host
        self._hosts: dict[int, str] = {}  # rank -> its host identity
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)

    def _listen(self):
        listeners, local = super()._listen()
        tcp = ""  # unkeyed beyond loopback: no tcp listener (peers of this host still connect)
        if self._tcp_allowed:
            sock, tcp = listen_tcp(self.host, self.world_size, f"auto channel rank {self.rank}")
            listeners.append(sock)
        return listeners, f"{local}|{tcp}"

    def _connect(self, address, peer, timeout):
        identity, name, tcp = address.split("|")
        self._remote[peer] = identity != self.identity
        if not self._remote[peer]:
            return super()._connect(f"{identity}|{name}", peer, timeout)
        if not tcp:
            raise ChannelError(
                f"auto send rank {self.rank}->{peer}: rank {peer} is on another host but "
                f"listens on this host's shared memory only: the job has no secret; {FIX}")
        return connect_tcp(self, tcp, peer, timeout)

    def _through_memory(self, peer: int) -> bool:
        return not self._remote.get(peer)  # set by _connect, before the first segment

    def _on_frame(self, sock, peer, frame):
        if frame.kind in (MAP, SHM, CMA) and sock.family != socket.AF_UNIX:
            raise WireError(f"rank {peer} sent a shared-memory frame over tcp (from another "
                            "host, its segments cannot be ours)")
        return super()._on_frame(sock, peer, frame)

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

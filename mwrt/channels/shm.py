"""The shm channel: ranks of one host hand large segments through shared memory.

Control frames and small messages ride an abstract-namespace UNIX socket with the
machinery of `sockets.py` (HMAC challenge included; no socket file to clean up); large
segments take the peer's `memorypaths.CmaPath`: read in place by the receiver where the
kernel lets it (one copy), else through reused shared-memory slots (two).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping
from typing import ClassVar

from ..errors import ChannelClosedError, ChannelError
from ..netaddr import host_identity
from ..procs import process_alive
from .memorypaths import CmaPath, SharedMemory
from .paths import SocketPath
from .segments import DIR, new_name
from .sockets import SocketChannel

log = logging.getLogger("mwrt.channels")


def listen_unix(backlog: int) -> tuple[socket.socket, str]:
    """A listener in the abstract namespace (it vanishes with the socket), and the address
    peers of this host connect to: this host's identity, then the name."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = new_name()
    sock.bind("\0" + name)
    sock.listen(max(backlog, 16))
    return sock, f"{host_identity()}|{name}"


def connect_unix(channel, address: str, peer: int, timeout: float) -> socket.socket:
    """A connection to `peer` at `address` (listen_unix's), which must be on this host."""
    host, _, name = address.rpartition("|")
    if host != host_identity():
        raise ChannelError(
            f"shm send rank {channel.rank}->{peer}: rank {peer} is on another host (got "
            f"{host}, this is {host_identity()}); the shm channel joins ranks of one host "
            "only, use channel 'auto' (shm within a host, tcp between) or 'tcp'")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect("\0" + name)
    except OSError as exc:
        sock.close()
        raise ChannelClosedError(
            f"shm send rank {channel.rank}->{peer}: cannot connect to rank {peer} "
            f"({type(exc).__name__}: {exc}); rank {peer} closed its channel or died, check "
            "its logs", peer=peer) from None
    return sock


class ShmChannel(SocketChannel):
    """Point-to-point buffers between processes of one host through shared memory."""

    name = "shm"
    native_collectives = "cma"  # single-copy collectives (mwrt.collective.cma_ops)
    paths: ClassVar[Mapping[int, type[SocketPath]]] = {socket.AF_UNIX: CmaPath}

    def __init__(self, rank, world_size, *, store, prefix="mwrt", key=None, timeout=None,
                 inline_bytes: int | None = None):
        self.memory = SharedMemory(inline_bytes)  # before peers connect: their paths read it
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)

    def _listen(self):
        sock, address = listen_unix(self.world_size)
        return [sock], address

    def _connect(self, address, peer, timeout):
        return connect_unix(self, address, peer, timeout)

    def shares_host(self, peer: int) -> bool:
        return True  # _connect refuses a peer on another host

    def _shown(self, record, sock):
        return "this host's shared memory"


_SEGMENT = re.compile(r"mwrt-(\d+)-[0-9a-f]{16}")  # segments.new_name(): mwrt-PID-HEX


def reap_orphan_segments(directory: str = DIR, skip: set | None = None) -> list[str]:
    """Unlink shm-channel segments of this user whose creator is dead; return their names.

    A sender names its segment mwrt-PID-HEX and the receiver unlinks it once mapped; a
    sender killed before that leaves it behind, and no live process knows the name. A live
    maker's are never touched, so one it forgot stays until it is dead and another process
    looks: each unlinks its own, and a daemon any it left as it exits (segments.unlink_own). Only
    names of that form, owned by this user, are looked at: /dev/shm is anyone's to fill,
    and another user's files are not ours to judge (their names go into `skip`, so a
    directory full of them costs one look each, not one per scan).
    """
    reaped: list[str] = []
    alive: dict[int, bool] = {}
    uid = os.geteuid()
    skip = set() if skip is None else skip
    try:
        entries = os.scandir(directory)
    except OSError:
        return []
    with entries:
        for entry in entries:
            name = entry.name
            found = _SEGMENT.fullmatch(name) if name not in skip else None
            if found is None:
                continue
            pid = int(found.group(1))
            if alive.setdefault(pid, process_alive(pid)):
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    if len(skip) < 1 << 17:
                        skip.add(name)
                    continue
                os.unlink(entry.path)
                reaped.append(name)
            except OSError:
                pass  # another reaper was first
    if reaped:
        log.warning("removed %d shared-memory segment(s) of dead processes: %s", len(reaped),
                    ", ".join(reaped[:20]))
    return reaped

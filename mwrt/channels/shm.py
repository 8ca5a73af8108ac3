"""The shm channel: ranks of one host hand large segments through reused shared memory.

Control frames and small messages ride an abstract-namespace UNIX socket with the
machinery of `sockets.py` (HMAC challenge included; no socket file to clean up).
For a message above `inline_bytes`, the sender creates one /dev/shm segment per
peer on first use, `shm_slots` slots of `shm_slot_bytes` each, and names it in a MAP
frame; the receiver maps it and unlinks the name at once, so nothing stays in
/dev/shm whichever process dies later. Each segment of the message is copied into
a free slot and announced by a SHM frame; the receiver thread copies the slot into
the user's buffer and answers with the slot number on the same socket, which frees
it. With several slots the sender fills one while the receiver drains another, so
the two copies overlap on two cores, and the mapping is reused for the life of the
channel (a fresh segment per transfer is 5x slower: BASELINE.md). A sender short of
slots reads those answers itself: no spinning, and a dead receiver shows as end of
stream.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import sys
import threading
from collections import deque
from time import monotonic as _now

import numpy as np

from .. import config
from ..errors import ChannelClosedError, ChannelError, ChannelTimeoutError, ConfigError, WireError
from ..netaddr import host_identity
from ..procs import process_alive
from .segments import DIR, Segment, new_name
from .sockets import HEADER, MAGIC, SocketChannel

log = logging.getLogger("mwrt.channels")

SHM, MAP = 2, 3
_MAX_SLOTS, _MAX_SLOT_BYTES = 1024, 1 << 30  # what a peer's MAP frame may announce
_ACK = struct.Struct("<I")


class _OutSlots:
    """The sender's side of one peer's segment: free slots, and who may read acks."""

    def __init__(self, segment: Segment, nslots: int):
        self.segment, self.free, self.lock = segment, deque(range(nslots)), threading.Lock()


class ShmChannel(SocketChannel):
    """Point-to-point buffers between processes of one host through shared memory."""

    name = "shm"
    native_collectives = "cma"  # single-copy collectives (mwrt.collective.cma_ops)

    def __init__(self, rank, world_size, *, store, prefix="mwrt", key=None, timeout=None,
                 inline_bytes: int | None = None):
        if not sys.platform.startswith("linux") or not os.path.isdir(DIR):
            raise ConfigError(f"shm channel: needs Linux with {DIR} (got {sys.platform}); "
                              "use channel 'tcp'")
        self.nslots, slot_bytes = config.get("shm_slots"), config.get("shm_slot_bytes")
        if self.nslots < 1 or slot_bytes < 1:
            raise ConfigError(f"MWRT_SHM_SLOTS, MWRT_SHM_SLOT_BYTES: must be >= 1 (got "
                              f"{self.nslots}, {slot_bytes})")
        self._in_segments: dict[int, Segment] = {}
        self._out_slots: dict[int, _OutSlots] = {}
        self._slots_lock = threading.Lock()
        self._warned_no_shm: set[int] = set()
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)
        # Slots that fit in L2 let the receiver read what the sender just wrote from cache.
        self.segment_bytes = min(self.segment_bytes, slot_bytes)
        limit = min(65536, self.segment_bytes)  # below this a socket copy beats a slot handoff
        self.inline_bytes = limit if inline_bytes is None else int(inline_bytes)

    def _listen(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = new_name()
        sock.bind("\0" + name)  # abstract namespace: vanishes with the socket
        sock.listen(max(self.world_size, 16))
        return [sock], f"{host_identity()}|{name}"

    def _connect(self, address, peer, timeout):
        host, _, name = address.rpartition("|")
        if host != host_identity():
            raise ChannelError(
                f"shm send rank {self.rank}->{peer}: rank {peer} is on another host (got "
                f"{host}, this is {host_identity()}); the shm channel joins ranks of one host "
                "only, use channel 'auto' (shm within a host, tcp between) or 'tcp'")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect("\0" + name)
        except OSError as exc:
            sock.close()
            raise ChannelClosedError(
                f"shm send rank {self.rank}->{peer}: cannot connect to rank {peer} "
                f"({type(exc).__name__}: {exc}); rank {peer} closed its channel or died, check "
                "its logs", peer=peer) from None
        return sock

    def shares_host(self, peer: int) -> bool:
        return True  # _connect refuses a peer on another host

    def _shown(self, record, sock):
        return "this host's shared memory" if sock.family == socket.AF_UNIX else \
            "%s:%d" % sock.getpeername()[:2]

    # -- sending -----------------------------------------------------------------------

    def _send_segment(self, conn, peer, tag, total, offset, seg, desc, deadline):
        out = None if total <= self.inline_bytes else self._out(conn, peer, deadline)
        if out is None:  # small, or no shared memory to be had: through the socket
            return super()._send_segment(conn, peer, tag, total, offset, seg, desc, deadline)
        slot = self._acquire_slot(out, conn, peer, deadline)
        np.copyto(out.segment.slots[slot, : seg.nbytes], np.frombuffer(seg, np.uint8))
        head = HEADER.pack(MAGIC, SHM, 0, len(desc), slot, tag, total, offset, seg.nbytes)
        self._write(conn, peer, [head + desc], deadline)

    def _out(self, conn, peer, deadline) -> _OutSlots | None:
        """Our slots toward `peer`, made on first use; None while /dev/shm has no room."""
        with self._slots_lock:
            out = self._out_slots.get(peer)
            if out is None:
                name = new_name()
                try:
                    segment = Segment(name, self.nslots, self.segment_bytes, create=True)
                except OSError as exc:  # ENOSPC: a full (or capped) /dev/shm
                    self._warn_no_shm(peer, exc)
                    return None
                out = self._out_slots[peer] = _OutSlots(segment, self.nslots)
                head = HEADER.pack(MAGIC, MAP, 0, len(name), self.nslots, 0,
                                   self.segment_bytes, 0, 0)
                self._write(conn, peer, [head + name.encode()], deadline)
            return out

    def _warn_no_shm(self, peer: int, exc: OSError) -> None:
        if peer not in self._warned_no_shm:  # once per peer: it is tried again each message
            self._warned_no_shm.add(peer)
            log.warning("%s channel rank %d: no shared memory for rank %d (%s: %s); large "
                        "messages to it go through the socket until %s has room", self.name,
                        self.rank, peer, type(exc).__name__, exc.strerror or exc, DIR)

    def _acquire_slot(self, out: _OutSlots, conn, peer, deadline) -> int:
        what = f"shm send rank {self.rank}->{peer}"
        if not out.lock.acquire(timeout=max(deadline - _now(), 0)):
            raise ChannelTimeoutError(f"{what}: no shared-memory slot freed before the timeout")
        try:
            ack = memoryview(bytearray(_ACK.size))
            while not out.free:
                got = 0
                while got < ack.nbytes:
                    poller = select.poll()
                    poller.register(conn.sock, select.POLLIN)
                    if not poller.poll(max(deadline - _now(), 0) * 1000):
                        raise ChannelTimeoutError(
                            f"{what}: rank {peer} freed no shared-memory slot before the "
                            f"timeout; is it receiving?")
                    try:
                        k = conn.sock.recv_into(ack[got:])
                    except OSError as exc:
                        k, conn.error = 0, f"{type(exc).__name__}: {exc}"
                    if k == 0:
                        raise ChannelClosedError(
                            f"{what}: rank {peer} closed the connection mid-transfer; check "
                            f"the logs of rank {peer}", peer=peer)
                    got += k
                (slot,) = _ACK.unpack(ack)
                if slot >= self.nslots:
                    raise WireError(f"{what}: rank {peer} freed slot {slot} of {self.nslots}")
                out.free.append(slot)
            return out.free.popleft()
        finally:
            out.lock.release()

    # -- receiving ---------------------------------------------------------------------

    def _on_frame(self, sock, peer, kind, aux, tag, total, offset, seglen, desc):
        if kind == MAP:
            if not desc.startswith("mwrt-") or "/" in desc or not 1 <= aux <= _MAX_SLOTS or \
                    not 1 <= total <= _MAX_SLOT_BYTES:
                raise WireError(f"rank {peer} named a bad segment {desc!r} ({aux} slots of "
                                f"{total} bytes)")
            try:
                segment = Segment.of_peer(desc, aux, total, sock.sock)
            except (OSError, ValueError) as exc:
                raise WireError(f"rank {peer} named a segment it cannot share: {exc}") from None
            segment.unlink()  # both sides hold it mapped now; the name is no longer needed
            old = self._in_segments.pop(peer, None)
            self._in_segments[peer] = segment
            if old is not None:
                old.close()
            return
        segment = self._in_segments.get(peer)
        if kind != SHM or segment is None or aux >= segment.slots.shape[0] or \
                seglen > segment.slots.shape[1]:
            return super()._on_frame(sock, peer, kind, aux, tag, total, offset, seglen, desc)
        target = self._segment_target(peer, tag, total, offset, seglen, desc)
        if target is not None:
            np.copyto(np.frombuffer(target, np.uint8), segment.slots[aux, :seglen])
        sock.sendall(_ACK.pack(aux))
        self._segment_done(peer, tag, seglen)

    def _on_peer_gone(self, peer):
        segment = self._in_segments.pop(peer, None)
        if segment is not None:
            segment.close()

    def _close(self):
        super()._close()
        with self._slots_lock:
            outs, self._out_slots = list(self._out_slots.values()), {}
        for out in outs:
            out.segment.unlink()  # the receiver never mapped it (it died or never received)
            out.segment.close()


def reap_orphan_segments(directory: str = DIR) -> list[str]:
    """Unlink shm-channel segments whose creator is dead; return their names.

    A sender names its segment mwrt-PID-HEX and the receiver unlinks it once mapped; a
    sender killed before that leaves it behind, and no live process knows the name.
    """
    try:
        names = [n for n in os.listdir(directory) if n.startswith("mwrt-")]
    except OSError:
        return []
    reaped = []
    for name in names:
        pid = name.split("-")[1]
        if pid.isdigit() and not process_alive(int(pid)):
            try:
                os.unlink(os.path.join(directory, name))
                reaped.append(name)
            except OSError:
                pass  # another reaper was first, or not ours to remove
    if reaped:
        log.warning("removed %d shared-memory segment(s) of dead processes: %s", len(reaped),
                    ", ".join(reaped))
    return reaped

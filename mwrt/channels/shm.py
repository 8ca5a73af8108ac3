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

A message of `cma_bytes` or more moves with one copy instead of two where the kernel lets
the receiver read the sender's memory (cross-memory attach, mwrt.channels.cma): each
segment is announced by a CMA frame carrying its address, the receiver thread reads it
with process_vm_readv straight into the receive's buffer and answers DONE, and the
sender returns once every segment of the message is answered (its buffer is read in
place, so it must not change before). The first such frame to a peer waits for its
answer: a receiver the kernel refuses answers REFUSED, and that peer gets slots from then
on (the refused segment is sent again through a slot, at the same offset).
"""

from __future__ import annotations

import errno
import logging
import os
import re
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
from . import cma
from .segments import DIR, Segment, new_name
from .sockets import Frame, SocketChannel

log = logging.getLogger("mwrt.channels")

SHM, MAP, CMA = 2, 3, 4
_MAX_SLOTS, _MAX_SLOT_BYTES = 1024, 1 << 30  # what a peer's MAP frame may announce
_ACK = struct.Struct("<I")
_ADDRESS = struct.Struct("<Q")  # after a CMA frame's description: where its bytes are
_DONE, _REFUSED = 0xFFFFFFFF, 0xFFFFFFFE  # answers to a CMA frame (others free a slot)
_NOT_ALLOWED = {errno.EPERM, errno.EACCES, errno.ENOSYS}


class _Out:
    """The sender's side toward one peer: its slots, its CMA frames owed an answer, and
    the lock of whoever reads the answers."""

    def __init__(self):
        self.segment: Segment | None = None  # made on the first message through slots
        self.free: deque[int] = deque()
        self.lock = threading.Lock()
        self.cma: bool | None = None if cma.available() else False  # None: not tried yet
        self.owed: deque[int] = deque()  # the tag of each CMA frame not answered yet
        self.left: dict[int, int] = {}  # tag -> its CMA frames not answered yet
        self.refused: set[int] = set()  # tags whose CMA frame the peer could not read


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
        self._out_slots: dict[int, _Out] = {}
        self._peer_pids: dict[int, int] = {}
        self._iov = threading.local()  # each reading thread's reused IoVec pair
        self.cma_bytes = config.get("shm_cma_bytes") if config.get("shm_cma") else 1 << 62
        self._slots_lock = threading.Lock()
        self._warned_no_shm: set[int] = set()
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)
        # Slots that fit in L2 let the receiver read what the sender just wrote from cache;
        # a segment read in place needs no slot, and fewer frames cost less.
        self.cma_segment_bytes = self.segment_bytes
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

    def _through_memory(self, peer: int) -> bool:
        """True if large segments to `peer` go through shared memory (slots, or read in
        place), False where they ride the socket (the auto channel's peers on other hosts)."""
        return True

    def _shown(self, record, sock):
        if sock.family == socket.AF_UNIX:
            return "this host's shared memory"
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"

    # -- sending -----------------------------------------------------------------------

    def _send_segment(self, conn, peer, frame, seg, deadline):
        if frame.total <= self.inline_bytes or not self._through_memory(peer):
            return super()._send_segment(conn, peer, frame, seg, deadline)
        out = self._out(peer)
        if frame.total >= self.cma_bytes and out.cma is not False and \
                self._send_cma(out, conn, peer, frame._replace(kind=CMA), seg, deadline):
            return
        segment = self._mapped(out, conn, peer, deadline)
        if segment is None:  # no shared memory to be had
            return super()._send_segment(conn, peer, frame, seg, deadline)
        slot = self._acquire_slot(out, conn, peer, deadline)
        np.copyto(segment.slots[slot, : seg.nbytes], np.frombuffer(seg, np.uint8))
        self._write(conn, peer, [frame._replace(kind=SHM, aux=slot).pack()], deadline)

    def _segment_step(self, peer: int, total: int) -> int:
        out = self._out_slots.get(peer)
        if total >= self.cma_bytes and out is not None and out.cma:  # known to read us
            return self.cma_segment_bytes
        return self.segment_bytes  # a first in-place segment may come back for a slot

    def _out(self, peer) -> _Out:
        with self._slots_lock:
            out = self._out_slots.get(peer)
            if out is None:
                out = self._out_slots[peer] = _Out()
            return out

    def _mapped(self, out: _Out, conn, peer, deadline) -> Segment | None:
        """Our slots toward `peer`, made on first use; None while /dev/shm has no room."""
        with self._slots_lock:
            if out.segment is None:
                name = new_name()
                try:
                    out.segment = Segment(name, self.nslots, self.segment_bytes, create=True)
                except OSError as exc:  # ENOSPC: a full (or capped) /dev/shm
                    self._warn_no_shm(peer, exc)
                    return None
                out.free.extend(range(self.nslots))
                frame = Frame(MAP, 0, self.segment_bytes, 0, 0, name, aux=self.nslots)
                self._write(conn, peer, [frame.pack()], deadline)
            return out.segment

    def _send_cma(self, out: _Out, conn, peer, frame: Frame, seg, deadline) -> bool:
        """Announce `seg` for the peer to read in place; False if the peer cannot read us."""
        address = np.frombuffer(seg, np.uint8).ctypes.data
        tag = frame.tag
        if not out.lock.acquire(timeout=max(deadline - _now(), 0)):
            raise ChannelTimeoutError(f"shm send rank {self.rank}->{peer}: answers of rank "
                                      f"{peer} still read by another send past the timeout")
        try:
            first = out.cma is None
            out.owed.append(tag)
            out.left[tag] = out.left.get(tag, 0) + 1
            self._write(conn, peer, [frame.pack() + _ADDRESS.pack(address)], deadline)
            # Its buffer is read until answered.
            if first or frame.offset + seg.nbytes >= frame.total:
                self._read_answers(out, conn, peer, deadline, lambda: tag not in out.left)
        finally:
            out.lock.release()
        if tag in out.refused:
            out.refused.discard(tag)
            return False
        return True

    def _warn_no_shm(self, peer: int, exc: OSError) -> None:
        if peer not in self._warned_no_shm:  # once per peer: it is tried again each message
            self._warned_no_shm.add(peer)
            log.warning("%s channel rank %d: no shared memory for rank %d (%s: %s); large "
                        "messages to it go through the socket until %s has room", self.name,
                        self.rank, peer, type(exc).__name__, exc.strerror or exc, DIR)

    def _acquire_slot(self, out: _Out, conn, peer, deadline) -> int:
        if not out.lock.acquire(timeout=max(deadline - _now(), 0)):
            raise ChannelTimeoutError(f"shm send rank {self.rank}->{peer}: no shared-memory "
                                      "slot freed before the timeout")
        try:
            self._read_answers(out, conn, peer, deadline, lambda: bool(out.free))
            return out.free.popleft()
        finally:
            out.lock.release()

    def _read_answers(self, out: _Out, conn, peer, deadline, enough) -> None:
        """Read the peer's answers (freed slots, CMA frames read) until `enough()`; the
        caller holds out.lock."""
        what = f"shm send rank {self.rank}->{peer}"
        ack = memoryview(bytearray(_ACK.size))
        while not enough():
            got = 0
            while got < ack.nbytes:
                poller = select.poll()
                poller.register(conn.sock, select.POLLIN)
                if not poller.poll(max(deadline - _now(), 0) * 1000):
                    if out.owed:  # it may still read segments we return from: no more frames
                        conn.error = conn.error or "a send timed out while rank " \
                            f"{peer} still had segments to read in place"
                    raise ChannelTimeoutError(
                        f"{what}: rank {peer} freed no shared-memory slot (nor read the "
                        "segments it was shown) before the timeout; is it receiving?")
                try:
                    k = conn.sock.recv_into(ack[got:])
                except OSError as exc:
                    k, conn.error = 0, f"{type(exc).__name__}: {exc}"
                if k == 0:
                    raise ChannelClosedError(
                        f"{what}: rank {peer} closed the connection mid-transfer; check "
                        f"the logs of rank {peer}", peer=peer)
                got += k
            self._take_answer(out, _ACK.unpack(ack)[0], what)

    def _take_answer(self, out: _Out, answer: int, what: str) -> None:
        if answer < self.nslots and out.segment is not None:
            out.free.append(answer)
            return
        if answer not in (_DONE, _REFUSED) or not out.owed:
            raise WireError(f"{what}: the peer answered {answer:#x} (expected a slot below "
                            f"{self.nslots}, or a CMA answer while one is owed)")
        tag = out.owed.popleft()
        out.left[tag] -= 1
        if not out.left[tag]:
            del out.left[tag]
        if answer == _REFUSED:
            out.cma = False
            out.refused.add(tag)
        elif out.cma is None:
            out.cma = True

    # -- receiving ---------------------------------------------------------------------

    def _on_frame(self, sock, peer, frame):
        kind, aux, total, seglen, desc = frame.kind, frame.aux, frame.total, frame.seglen, \
            frame.desc
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
        if kind == CMA:
            return self._on_cma(sock, peer, frame)
        mapped = self._in_segments.get(peer)
        if kind != SHM or mapped is None or aux >= mapped.slots.shape[0] or \
                seglen > mapped.slots.shape[1]:
            return super()._on_frame(sock, peer, frame)
        target = self.matcher.segment_target(peer, frame)
        if target is not None:
            np.copyto(np.frombuffer(target, np.uint8), mapped.slots[aux, :seglen])
        sock.sendall(_ACK.pack(aux))
        self.matcher.segment_done(peer, frame.tag, seglen)

    def _on_cma(self, sock, peer, frame: Frame) -> None:
        """Read a segment the peer showed us straight from its memory, and answer."""
        (address,) = _ADDRESS.unpack(sock.take(_ADDRESS.size, "a CMA frame's address"))
        target = self.matcher.segment_target(peer, frame)
        seglen = frame.seglen
        if target is not None and seglen:
            iov = getattr(self._iov, "pair", None)
            if iov is None:
                iov = self._iov.pair = (cma.IoVec(), cma.IoVec())
            try:
                cma.read_remote(self._peer_pid(peer, sock), np.frombuffer(target, np.uint8)
                                .ctypes.data, address, seglen, iov)
            except OSError as exc:
                if exc.errno not in _NOT_ALLOWED:  # ESRCH: it died; EFAULT: it lied
                    raise ConnectionError(f"rank {peer}: cannot read the segment it showed "
                                          f"({exc.strerror}); it died mid-message?") from None
                log.info("shm channel rank %d: the kernel does not let us read rank %d's "
                         "memory (%s); it sends through slots", self.rank, peer, exc.strerror)
                sock.sendall(_ACK.pack(_REFUSED))  # the same segment comes again, in a slot
                return
        sock.sendall(_ACK.pack(_DONE))
        self.matcher.segment_done(peer, frame.tag, seglen)

    def _peer_pid(self, peer: int, sock) -> int:
        pid = self._peer_pids.get(peer)
        if pid is None:
            pid = self._peer_pids[peer] = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        return pid

    def _on_peer_gone(self, peer):
        self._peer_pids.pop(peer, None)
        segment = self._in_segments.pop(peer, None)
        if segment is not None:
            segment.close()

    def _close(self):
        super()._close()
        with self._slots_lock:
            outs, self._out_slots = list(self._out_slots.values()), {}
        for out in outs:
            if out.segment is not None:
                out.segment.unlink()  # the receiver never mapped it (it died or never received)
                out.segment.close()


_SEGMENT = re.compile(r"mwrt-(\d+)-[0-9a-f]{16}")  # segments.new_name(): mwrt-PID-HEX


def reap_orphan_segments(directory: str = DIR, skip: set | None = None) -> list[str]:
    """Unlink shm-channel segments of this user whose creator is dead; return their names.

    A sender names its segment mwrt-PID-HEX and the receiver unlinks it once mapped; a
    sender killed before that leaves it behind, and no live process knows the name. Only
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

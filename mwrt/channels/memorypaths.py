"""The paths between two processes of one host: large segments through shared memory.

`SlotPath`: for a message above `inline_bytes` (smaller ones ride the socket as DATA
frames), the sender creates one /dev/shm segment per peer on first use, `shm_slots` slots
of `shm_slot_bytes` each, and names it in a MAP frame; the receiver maps it and unlinks
the name at once, so nothing stays in /dev/shm whichever process dies later. Each segment
of the message is copied into a free slot and announced by a SHM frame; the receiver
thread copies the slot into the user's buffer and answers with the slot number on the
same socket, which frees it. With several slots the sender fills one while the receiver
drains another, so the two copies overlap on two cores, and the mapping is reused for the
life of the channel (a fresh segment per transfer is 5x slower: BASELINE.md). A sender
short of slots reads those answers itself: no spinning, and a dead receiver shows as end
of stream. Where /dev/shm has no room, segments ride the socket.

`CmaPath`: a message of `cma_bytes` or more moves with one copy instead of two where the
kernel lets the receiver read the sender's memory (cross-memory attach, mwrt.channels.cma):
each segment is announced by a CMA frame carrying its address, the receiver thread reads
it with process_vm_readv straight into the receive's buffer and answers DONE, and the
sender returns once every segment of the message is answered (its buffer is read in place,
so it must not change before). The first such frame to a peer waits for its answer: a
receiver the kernel refuses answers REFUSED, and that peer gets slots from then on (the
refused segment is sent again through a slot, at the same offset).
"""

from __future__ import annotations

import errno
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
from . import cma
from .framing import Frame
from .paths import SocketPath
from .segments import DIR, Segment, new_name

log = logging.getLogger("mwrt.channels")

SHM, MAP, CMA = 2, 3, 4
_MAX_SLOTS, _MAX_SLOT_BYTES = 1024, 1 << 30  # what a peer's MAP frame may announce
_ACK = struct.Struct("<I")
_ADDRESS = struct.Struct("<Q")  # after a CMA frame's description: where its bytes are
_DONE, _REFUSED = 0xFFFFFFFF, 0xFFFFFFFE  # answers to a CMA frame (others free a slot)
_NOT_ALLOWED = {errno.EPERM, errno.EACCES, errno.ENOSYS}


class SharedMemory:
    """A channel's shared-memory settings: its slots, and which messages use them."""

    def __init__(self, inline_bytes: int | None = None):
        if not sys.platform.startswith("linux") or not os.path.isdir(DIR):
            raise ConfigError(f"shm channel: needs Linux with {DIR} (got {sys.platform}); "
                              "use channel 'tcp'")
        self.nslots, slot_bytes = config.get("shm_slots"), config.get("shm_slot_bytes")
        if self.nslots < 1 or slot_bytes < 1:
            raise ConfigError(f"MWRT_SHM_SLOTS, MWRT_SHM_SLOT_BYTES: must be >= 1 (got "
                              f"{self.nslots}, {slot_bytes})")
        # Slots that fit in L2 let the receiver read what the sender just wrote from cache;
        # a segment read in place needs no slot, and fewer frames cost less.
        self.cma_segment_bytes = config.get("segment_bytes")
        self.slot_bytes = min(self.cma_segment_bytes, slot_bytes)
        self.cma_bytes = config.get("shm_cma_bytes") if config.get("shm_cma") else 1 << 62
        limit = min(65536, self.slot_bytes)  # below this a socket copy beats a slot handoff
        self.inline_bytes = limit if inline_bytes is None else int(inline_bytes)


class SlotPath(SocketPath):
    """Large segments through reused shared-memory slots (two copies), small ones inline."""

    def __init__(self, channel, peer, conn):
        super().__init__(channel, peer, conn)
        self.memory: SharedMemory = channel.memory
        self.what = f"shm send rank {channel.rank}->{peer}"
        # Sending: our slots, made on the first message through them, and the lock of
        # whoever reads the peer's answers.
        self.segment: Segment | None = None
        self.free: deque[int] = deque()
        self.lock = threading.Lock()
        self.owed: deque[int] = deque()  # the tag of each frame read in place, unanswered
        self._making = threading.Lock()
        self.closed = False  # set under _making: no segment is made after close()
        self._warned = False
        # Reading: the peer's slots, once its MAP frame came.
        self.mapped: Segment | None = None

    def segment_step(self, total: int) -> int:
        return self.memory.slot_bytes

    def send_segment(self, frame, seg, deadline):
        if frame.total <= self.memory.inline_bytes:
            return super().send_segment(frame, seg, deadline)
        segment = self._slots(deadline)
        if segment is None:  # no shared memory to be had
            return super().send_segment(frame, seg, deadline)
        slot = self._acquire_slot(deadline)
        np.copyto(segment.slots[slot, : seg.nbytes], np.frombuffer(seg, np.uint8))
        self.conn.write([frame.as_kind(SHM, slot).pack()], deadline)

    def _slots(self, deadline) -> Segment | None:
        """Our slots toward the peer, made on first use; None while /dev/shm has no room."""
        with self._making:
            if self.closed:  # a send racing the close: a segment made now nobody would unlink
                raise ChannelError(f"{self.what}: the channel is closed")
            if self.segment is None:
                name, memory = new_name(), self.memory
                try:
                    self.segment = Segment(name, memory.nslots, memory.slot_bytes, create=True)
                except OSError as exc:  # ENOSPC: a full (or capped) /dev/shm
                    self._warn_no_shm(exc)
                    return None
                self.free.extend(range(memory.nslots))
                frame = Frame(MAP, 0, memory.slot_bytes, 0, 0, name, aux=memory.nslots)
                self.conn.write([frame.pack()], deadline)
            return self.segment

    def _warn_no_shm(self, exc: OSError) -> None:
        if not self._warned:  # once per peer: it is tried again each message
            self._warned = True
            log.warning("%s channel rank %d: no shared memory for rank %d (%s: %s); large "
                        "messages to it go through the socket until %s has room",
                        self.channel.name, self.channel.rank, self.peer, type(exc).__name__,
                        exc.strerror or exc, DIR)

    def _acquire_slot(self, deadline) -> int:
        if not self.lock.acquire(timeout=max(deadline - _now(), 0)):
            raise ChannelTimeoutError(f"{self.what}: no shared-memory slot freed before the "
                                      "timeout")
        try:
            self._read_answers(deadline, lambda: bool(self.free))
            return self.free.popleft()
        finally:
            self.lock.release()

    def _read_answers(self, deadline, enough) -> None:
        """Read the peer's answers (freed slots, frames read in place) until `enough()`; the
        caller holds self.lock."""
        conn, peer = self.conn, self.peer
        ack = memoryview(bytearray(_ACK.size))
        while not enough():
            got = 0
            while got < ack.nbytes:
                poller = select.poll()
                poller.register(conn.sock, select.POLLIN)
                if not poller.poll(max(deadline - _now(), 0) * 1000):
                    if self.owed:  # it may still read segments we return from: no more frames
                        conn.error = conn.error or "a send timed out while rank " \
                            f"{peer} still had segments to read in place"
                    raise ChannelTimeoutError(
                        f"{self.what}: rank {peer} freed no shared-memory slot (nor read the "
                        "segments it was shown) before the timeout; is it receiving?")
                try:
                    k = conn.sock.recv_into(ack[got:])
                except OSError as exc:
                    k, conn.error = 0, f"{type(exc).__name__}: {exc}"
                if k == 0:
                    raise ChannelClosedError(
                        f"{self.what}: rank {peer} closed the connection mid-transfer; check "
                        f"the logs of rank {peer}", peer=peer)
                got += k
            self._take_answer(_ACK.unpack(ack)[0])

    def _take_answer(self, answer: int) -> None:
        if answer < self.memory.nslots and self.segment is not None:
            self.free.append(answer)
            return
        raise WireError(f"{self.what}: the peer answered {answer:#x} (expected a slot below "
                        f"{self.memory.nslots}, or a CMA answer while one is owed)")

    def on_frame(self, reader, frame):
        if frame.kind == MAP:
            return self._map(reader, frame)
        mapped = self.mapped
        if frame.kind != SHM or mapped is None or frame.aux >= mapped.slots.shape[0] or \
                frame.seglen > mapped.slots.shape[1]:
            return super().on_frame(reader, frame)
        target = self.matcher.segment_target(self.peer, frame)
        if target is not None:
            np.copyto(np.frombuffer(target, np.uint8), mapped.slots[frame.aux, :frame.seglen])
        reader.sendall(_ACK.pack(frame.aux))
        self.matcher.segment_done(self.peer, frame.tag, frame.seglen)

    def _map(self, reader, frame: Frame) -> None:
        """Map the slots the peer named (nslots in `aux`, each of `total` bytes)."""
        name, nslots, slot_bytes, peer = frame.desc, frame.aux, frame.total, self.peer
        if not name.startswith("mwrt-") or "/" in name or not 1 <= nslots <= _MAX_SLOTS or \
                not 1 <= slot_bytes <= _MAX_SLOT_BYTES:
            raise WireError(f"rank {peer} named a bad segment {name!r} ({nslots} slots of "
                            f"{slot_bytes} bytes)")
        try:
            segment = Segment.of_peer(name, nslots, slot_bytes, reader.sock)
        except (OSError, ValueError) as exc:
            raise WireError(f"rank {peer} named a segment it cannot share: {exc}") from None
        segment.unlink()  # both sides hold it mapped now; the name is no longer needed
        old, self.mapped = self.mapped, segment
        if old is not None:
            old.close()

    def close(self) -> None:
        mapped, self.mapped = self.mapped, None
        if mapped is not None:
            mapped.close()
        with self._making:  # a send making our slots now finishes first (its socket is shut)
            self.closed = True
        if self.segment is not None:
            self.segment.unlink()  # the receiver never mapped it (it died or never received)
            self.segment.close()


class CmaPath(SlotPath):
    """Large segments read in place by the peer (one copy) where the kernel lets it, else
    through slots."""

    def __init__(self, channel, peer, conn):
        super().__init__(channel, peer, conn)
        self.cma: bool | None = None if cma.available() else False  # None: not tried yet
        self.left: dict[int, int] = {}  # tag -> its CMA frames not answered yet
        self.refused: set[int] = set()  # tags whose CMA frame the peer could not read
        self._pid: int | None = None  # the peer's, once a CMA frame came
        self._iov: tuple | None = None  # a reused IoVec pair (building one costs more than a read)

    def segment_step(self, total: int) -> int:
        if total >= self.memory.cma_bytes and self.cma:  # known to read us
            return self.memory.cma_segment_bytes
        return self.memory.slot_bytes  # a first in-place segment may come back for a slot

    def send_segment(self, frame, seg, deadline):
        memory = self.memory
        if frame.total > memory.inline_bytes and frame.total >= memory.cma_bytes and \
                self.cma is not False and self._send_in_place(frame, seg, deadline):
            return
        super().send_segment(frame, seg, deadline)

    def _send_in_place(self, frame: Frame, seg, deadline) -> bool:
        """Announce `seg` for the peer to read in place; False if the peer cannot read us."""
        address = np.frombuffer(seg, np.uint8).ctypes.data
        tag = frame.tag
        if not self.lock.acquire(timeout=max(deadline - _now(), 0)):
            raise ChannelTimeoutError(f"{self.what}: answers of rank {self.peer} still read "
                                      "by another send past the timeout")
        try:
            first = self.cma is None
            self.owed.append(tag)
            self.left[tag] = self.left.get(tag, 0) + 1
            self.conn.write([frame.as_kind(CMA).pack() + _ADDRESS.pack(address)],
                            deadline)
            # Its buffer is read until answered.
            if first or frame.offset + seg.nbytes >= frame.total:
                self._read_answers(deadline, lambda: tag not in self.left)
        finally:
            self.lock.release()
        if tag in self.refused:
            self.refused.discard(tag)
            return False
        return True

    def _take_answer(self, answer: int) -> None:
        if answer not in (_DONE, _REFUSED) or not self.owed:
            return super()._take_answer(answer)
        tag = self.owed.popleft()
        self.left[tag] -= 1
        if not self.left[tag]:
            del self.left[tag]
        if answer == _REFUSED:
            self.cma = False
            self.refused.add(tag)
        elif self.cma is None:
            self.cma = True

    def on_frame(self, reader, frame):
        if frame.kind != CMA:
            return super().on_frame(reader, frame)
        self._read_in_place(reader, frame)

    def _read_in_place(self, reader, frame: Frame) -> None:
        """Read a segment the peer showed us straight from its memory, and answer."""
        (address,) = _ADDRESS.unpack(reader.take(_ADDRESS.size, "a CMA frame's address"))
        target = self.matcher.segment_target(self.peer, frame)
        if target is not None and frame.seglen:
            if self._iov is None:
                self._iov = (cma.IoVec(), cma.IoVec())
            try:
                cma.read_remote(self._peer_pid(reader), np.frombuffer(target, np.uint8)
                                .ctypes.data, address, frame.seglen, self._iov)
            except OSError as exc:
                if exc.errno not in _NOT_ALLOWED:  # ESRCH: it died; EFAULT: it lied
                    raise ConnectionError(f"rank {self.peer}: cannot read the segment it "
                                          f"showed ({exc.strerror}); it died mid-message?"
                                          ) from None
                log.info("shm channel rank %d: the kernel does not let us read rank %d's "
                         "memory (%s); it sends through slots", self.channel.rank, self.peer,
                         exc.strerror)
                reader.sendall(_ACK.pack(_REFUSED))  # the same segment comes again, in a slot
                return
        reader.sendall(_ACK.pack(_DONE))
        self.matcher.segment_done(self.peer, frame.tag, frame.seglen)

    def _peer_pid(self, reader) -> int:
        if self._pid is None:
            self._pid = struct.unpack("3i", reader.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        return self._pid

"""Point-to-point of the "mwrt" backend: receives from a named rank or from any rank, into
a tensor at least as large as the message, and withdrawn when their wait times out.

A send opens with a header that says its size: up to 64 KiB ride in the header's message,
larger ones follow it as a message of their own. A receive does not post the user's tensor
to the channel, whose receives need the exact size and a named sender. Instead, for
each (peer, tag) that some receive waits on, a pump (a daemon thread, so that one still
blocked in a receive never holds up the interpreter's exit) takes
the peer's next message of any size (`recv_message`) and hands it to the oldest receive
still waiting that accepts that peer (it named it, or any rank), or keeps it for the next
receive when none waits. So a receive from any source is a pump per peer, the first
message to come wins and the receive learns its sender; a tensor larger than the message
gets the message in its first bytes (as gloo's does); and a receive whose wait timed out
is taken off the queue, so the peer's next message goes to the next receive and never
into the abandoned tensor. A large message's bytes, announced by its header, go straight
into the tensor of the receive that took the header; a small one's are copied. A pump's own
wait ends at the deadline of the
receives it serves; a large message that is arriving at that very moment is dropped by the
channel (its timeout withdraws the receive mid-message), as any channel receive's would be.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future

import numpy as np

from ..errors import ChannelTimeoutError, WireError

Message = memoryview | np.ndarray  # what a channel received

_LINGER = 0.05  # seconds a pump waits for the next receive before its thread ends
_INLINE = 1 << 16  # bytes that travel in their header's message; larger ones follow it
_MAGIC = 0x6D77727474726368  # "mwrttrch": a message of the torch backend's point-to-point
_HEAD = 16  # the header: _MAGIC, then the size in bytes


class _Recv:
    """One receive: where its bytes go, who may send them, by when; its Future's result is
    the sender's group rank."""

    __slots__ = ("deadline", "dest", "done", "future", "peer")

    def __init__(self, dest: np.ndarray, peer: int | None, deadline: float, done):
        self.dest, self.peer, self.deadline, self.done = dest, peer, deadline, done
        self.future: Future = Future()

    def takes(self, peer: int) -> bool:
        return self.peer is None or self.peer == peer


class Receiver:
    """The receives of one group, matched to the messages its pumps take, per tag."""

    def __init__(self, group):
        self.group, self.lock = group, threading.Lock()
        self.posted = threading.Condition(self.lock)  # a lingering pump wakes for a receive
        self.waiting: dict[int, list[_Recv]] = {}  # by channel tag, oldest first
        # By channel tag: (peer, bytes) no receive took yet.
        self.kept: dict[int, deque[tuple[int, Message]]] = {}
        self.pumping: set[tuple[int, int]] = set()
        self.gone: dict[int, BaseException] = {}  # peers whose pump found them gone

    def post(self, dest: np.ndarray, peer: int | None, tag: int, timeout: float,
             done=None) -> _Recv:
        """Receive into `dest` (flat bytes) from group rank `peer` (None: any) on channel tag
        `tag`; done() runs after the bytes land (a copy back to a non-contiguous tensor)."""
        g = self.group
        if not g.channel.any_size_recv:
            raise ValueError(f"recv: the {g.channel.name} channel cannot take a message of a "
                             "size it is not told, which torch's recv needs; use "
                             "MWRT_CHANNEL=auto, shm or tcp for the torch backend")
        recv = _Recv(dest, peer, time.monotonic() + timeout, done)
        peers = [peer] if peer is not None else [p for p in range(g.size) if p != g.rank]
        with self.lock:
            kept = self._take_kept(tag, recv)
            if kept is None:
                failed = [self.gone[p] for p in peers if p in self.gone]
                if len(failed) == len(peers):
                    recv.future.set_exception(failed[0])
                    return recv
                self.waiting.setdefault(tag, []).append(recv)
                self.posted.notify_all()
                start = [p for p in peers if (p, tag) not in self.pumping and p not in self.gone]
                self.pumping.update((p, tag) for p in start)
        if kept is not None:
            _fill(recv, *kept, g)
            return recv
        for p in start:
            threading.Thread(target=self._pump, args=(p, tag), daemon=True,
                             name=f"mwrt-torch-recv-{g.ranks[p]}").start()
        return recv

    def withdraw(self, recv: _Recv, tag: int) -> bool:
        """Take a receive off the queue (its wait timed out): True if it was still waiting,
        False if a pump is filling it right now."""
        with self.lock:
            waiting = self.waiting.get(tag, [])
            if recv in waiting:
                waiting.remove(recv)
                return True
        return False

    def _take_kept(self, tag: int, recv: _Recv) -> tuple[int, Message] | None:
        """The oldest kept message that `recv` takes (under the lock), or None."""
        kept = self.kept.get(tag)
        if kept is None:
            return None
        for i, (peer, data) in enumerate(kept):
            if recv.takes(peer):
                del kept[i]
                return peer, data
        return None

    def _pump(self, peer: int, tag: int) -> None:
        """Take `peer`'s messages on `tag` while some receive waits for one."""
        g = self.group
        while True:
            with self.lock:
                # A receive posted soon after the last (a loop of them) finds us still here.
                self.posted.wait_for(lambda: self._wanted(peer, tag), _LINGER)
                wanted = self._wanted(peer, tag)
                if not wanted:
                    self.pumping.discard((peer, tag))
                    return
                deadline = min(r.deadline for r in wanted)
            try:
                data = g.channel.recv_message(g.ranks[peer], tag,
                                              max(deadline - time.monotonic(), 1e-3))
            except ChannelTimeoutError as exc:
                self._expire(tag, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - gone, closed, or broken: its receives say so
                self._peer_failed(peer, tag, exc)
                return
            if not self._take(peer, tag, data):
                return

    def _take(self, peer: int, tag: int, data) -> bool:
        """Give the message that `data` opens to the oldest receive that takes it, or keep
        it; False if the peer broke the protocol."""
        g = self.group
        try:
            size = _announced(data, g, peer)
        except WireError as exc:
            self._peer_failed(peer, tag, exc)
            return False
        with self.lock:
            recv = next((r for r in self.waiting.get(tag, ()) if r.takes(peer)), None)
            if recv is not None:
                self.waiting[tag].remove(recv)
        if size < 0:  # small: the bytes came with the header
            self._deliver(recv, peer, tag, memoryview(data)[_HEAD:])
            return True
        # Large: the bytes follow, straight into the tensor where it is large enough.
        into = recv if recv is not None and size <= recv.dest.nbytes else None
        dest = into.dest[:size] if into is not None else np.empty(size, np.uint8)
        try:
            g.channel.recv(dest, g.ranks[peer], tag, g.timeout)
        except Exception as exc:  # noqa: BLE001 - this receive fails with it
            if recv is not None:
                recv.future.set_exception(exc)
            return True
        if into is not None:
            _done(into, peer)
        else:
            self._deliver(recv, peer, tag, dest)
        return True

    def _deliver(self, recv: _Recv | None, peer: int, tag: int, data) -> None:
        """Hand a message to the receive chosen for it, or keep it for the next one."""
        if recv is None:
            with self.lock:
                self.kept.setdefault(tag, deque()).append((peer, data))
        else:
            _fill(recv, peer, data, self.group)

    def _wanted(self, peer: int, tag: int) -> list[_Recv]:
        return [r for r in self.waiting.get(tag, ()) if r.takes(peer)]

    def _expire(self, tag: int, exc: BaseException) -> None:
        """Fail the receives on `tag` past their deadline."""
        now = time.monotonic()
        with self.lock:
            waiting = self.waiting.get(tag, [])
            late = [r for r in waiting if r.deadline <= now]
            for r in late:
                waiting.remove(r)
        for r in late:
            r.future.set_exception(exc)

    def _peer_failed(self, peer: int, tag: int, exc: BaseException) -> None:
        """`peer` is gone: fail the receives only it could fill."""
        g = self.group
        with self.lock:
            self.gone[peer] = exc
            self.pumping.discard((peer, tag))
            others = [p for p in range(g.size) if p not in (g.rank, peer) and p not in self.gone]
            waiting = self.waiting.get(tag, [])
            failed = [r for r in waiting if r.peer == peer or (r.peer is None and not others)]
            for r in failed:
                waiting.remove(r)
        for r in failed:
            r.future.set_exception(exc)


def send(group, arr: np.ndarray, peer: int, tag: int) -> list:
    """Start sending the bytes `arr` to group rank `peer` on channel tag `tag`: the channel
    Works. Each message opens with a header that says its size; up to _INLINE bytes ride in
    the header's message, larger ones follow it, so the receiver can put them in place."""
    head = np.array([_MAGIC, arr.nbytes], np.uint64).view(np.uint8)
    rank, ch, timeout = group.ranks[peer], group.channel, group.timeout
    if arr.nbytes > _INLINE:
        return [ch.isend(head, rank, tag, timeout), ch.isend(arr, rank, tag, timeout)]
    msg = np.empty(_HEAD + arr.nbytes, np.uint8)
    msg[:_HEAD], msg[_HEAD:] = head, arr
    return [ch.isend(msg, rank, tag, timeout)]


def _announced(data, group, peer: int) -> int:
    """The size a large message's header announces, or -1 for a small one's own bytes."""
    head = np.frombuffer(data, np.uint64, 2) if len(data) >= _HEAD else None
    if head is None or int(head[0]) != _MAGIC:
        raise WireError(f"recv on rank {group.channel.rank}: rank {group.ranks[peer]} sent a "
                        f"message without the torch backend's header ({len(data)} bytes); is "
                        "it running the same mwrt?")
    size = int(head[1])
    return -1 if len(data) == _HEAD + size else size


def _fill(recv: _Recv, peer: int, data, group) -> None:
    """Put a message in its receive's tensor, or fail the receive if it does not fit."""
    size = len(data)
    if size > recv.dest.nbytes:
        recv.future.set_exception(ValueError(
            f"recv on rank {group.channel.rank}: rank {group.ranks[peer]} sent {size} bytes, "
            f"more than the tensor's {recv.dest.nbytes}; receive into a tensor at least as "
            "large as the one sent"))
        return
    recv.dest[:size] = np.frombuffer(data, np.uint8)
    _done(recv, peer)


def _done(recv: _Recv, peer: int) -> None:
    if recv.done is not None:
        recv.done()
    recv.future.set_result(peer)


__all__ = ["Receiver", "send"]

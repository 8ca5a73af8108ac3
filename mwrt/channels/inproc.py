"""The reference channel: ranks are threads of one process, messages are queued copies."""

from __future__ import annotations

import threading
import time
import weakref
from collections import defaultdict, deque

from ..errors import ChannelClosedError, ChannelTimeoutError
from .base import DataChannel, size_mismatch

# One mailbox table per (store, prefix): every rank of a group built on that store shares it.
_GROUPS: weakref.WeakKeyDictionary[object, dict] = weakref.WeakKeyDictionary()
_GROUPS_LOCK = threading.Lock()


class _Mailboxes:
    """Queued messages keyed by (src, dst, tag), and which ranks have closed."""

    def __init__(self):
        self.queues: dict[tuple[int, int, int], deque] = defaultdict(deque)
        self.closed: set[int] = set()
        self.cond = threading.Condition()


class InprocChannel(DataChannel):
    """In-process reference implementation of the channel contract."""

    name = "inproc"
    buffered_sends = True  # messages queue until received
    any_size_recv = True
    posted_receives = False  # irecv runs a blocking recv on a helper thread

    def __init__(self, rank, world_size, *, store, prefix="mwrt", key=None, timeout=None):
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)
        with _GROUPS_LOCK:
            per_store = _GROUPS.setdefault(store, {})
            self._boxes = per_store.setdefault(prefix, _Mailboxes())

    def shares_host(self, peer: int) -> bool:
        return True  # every rank is a thread of this process

    def _send(self, view, peer, tag, timeout, desc):
        boxes = self._boxes
        with boxes.cond:
            if peer in boxes.closed:
                raise ChannelClosedError(
                    f"inproc send rank {self.rank}->{peer}: peer rank {peer} closed its channel",
                    peer=peer,
                )
            boxes.queues[(self.rank, peer, tag)].append((bytes(view), desc))
            boxes.cond.notify_all()

    def _recv(self, view, peer, tag, timeout, desc):
        data, sent_desc = self._take(peer, tag, timeout)
        if len(data) != view.nbytes:
            raise size_mismatch(self, peer, tag, sent_desc, desc)
        view[:] = data

    def _recv_message(self, peer, tag, timeout):
        return memoryview(self._take(peer, tag, timeout)[0])

    def arrived(self, peer: int, tag: int = 0) -> bool:
        with self._boxes.cond:
            if self._boxes.queues.get((peer, self.rank, tag)):
                return True
            if peer in self._boxes.closed:
                raise ChannelClosedError(f"inproc recv rank {self.rank}<-{peer}: peer rank "
                                         f"{peer} closed its channel", peer=peer)
            return False

    def _take(self, peer, tag, timeout) -> tuple[bytes, str]:
        """The next queued message from `peer` on `tag`, and the sender's description of it."""
        boxes, key = self._boxes, (peer, self.rank, tag)
        deadline = time.monotonic() + timeout
        with boxes.cond:
            while not boxes.queues[key]:
                if peer in boxes.closed:
                    raise ChannelClosedError(
                        f"inproc recv rank {self.rank}<-{peer}: peer rank {peer} closed its "
                        "channel before sending", peer=peer)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeoutError(
                        f"inproc recv rank {self.rank}<-{peer} tag {tag}: nothing arrived "
                        f"after {timeout} s")
                boxes.cond.wait(left)
            queue = boxes.queues[key]
            item = queue.popleft()
            if not queue:
                del boxes.queues[key]  # tags are per collective: drop the empty queue
            return item

    def _close(self):
        with self._boxes.cond:
            self._boxes.closed.add(self.rank)
            self._boxes.cond.notify_all()

"""What a channel's matcher keeps per (peer, tag): the receives posted, the messages that
arrived before any receive claimed them, and the one arriving now (matching.py matches them)."""

from __future__ import annotations

import threading
from collections import deque

PENDING = object()  # a receive's outcome before one is decided (its error, or None)


class Post:
    """A receive: the buffer to fill (None: any size, made on arrival) and its outcome."""

    __slots__ = ("desc", "error", "finished", "peer", "ready", "tag", "view")

    def __init__(self, view, desc, peer, tag):
        self.view, self.desc, self.peer, self.tag = view, desc, peer, tag
        self.finished, self.error = False, PENDING
        self.ready = threading.Lock()
        self.ready.acquire()

    def release(self, error=None) -> None:
        """Hand the outcome to the waiter; only the party that set `finished` calls this."""
        self.error = error
        self.ready.release()


class Stashed:
    """A stashed message from a peer: its bytes, and how many have arrived."""

    __slots__ = ("buf", "desc", "done", "got", "post", "total")

    def __init__(self, total, desc):
        self.total, self.desc, self.buf, self.got = total, desc, None, 0
        self.post, self.done = None, False


class Box:
    """Per (peer, tag): receives waiting, messages nobody claimed yet, the one arriving."""

    __slots__ = ("arrived", "current", "posted")

    def __init__(self):
        self.posted: deque[Post] = deque()
        self.arrived: deque[Stashed] = deque()
        self.current: Stashed | None = None

"""Matching received messages to receives by (peer, tag): the matcher a socket channel has.

A transport's receiver thread reports each message (or segment) it reads; this layer
decides where the bytes go. A message for which a receive is posted lands in the user's
buffer; otherwise it is stashed in a temporary buffer until a receive claims it (then
copied once, or handed over whole to `recv_message`). Receives on one (peer, tag) match
messages in send order. A message of the wrong size fails its receive with both sizes
named and is consumed. When a peer's connection ends, every receive waiting on it fails
with ChannelClosedError.

A waiting receive sleeps on a lock of its own that the receiver thread releases: the
cheapest hand-off between two threads, which small messages pay once each. Whoever first
decides a receive's outcome (the receiver thread, a timeout, a close) marks it `finished`
under the channel lock; only that party writes the outcome and releases the waiter.
"""

from __future__ import annotations

import threading
import time
from functools import partial

import numpy as np

from .. import config
from ..errors import ChannelClosedError, ChannelError, ChannelTimeoutError, WireError
from .base import Work, size_mismatch
from .mailbox import PENDING, Box, Post, Stashed


class Matcher:
    """Receives and arrivals of one channel, matched by (peer, tag); a transport reports
    arrivals (deliver, segment_target/segment_done) and ends (peer_gone)."""

    def __init__(self, channel, on_peer_gone=None):
        # `channel`: its name, rank and `closed` go into errors and decisions.
        # on_peer_gone(peer): release per-peer receive resources (shm mappings).
        self.channel, self.name, self.rank = channel, channel.name, channel.rank
        # read_for(post, deadline): before sleeping on a receive, its transport may read the
        # message itself (the socket channels' frame reader).
        self.read_for = _read_nothing
        self._on_peer_gone = on_peer_gone or (lambda peer: None)
        self._lock = threading.Lock()  # the boxes; a plain lock: `with` on it costs no Python
        self._boxes: dict[tuple[int, int], Box] = {}
        self.departed: dict[int, str] = {}  # peer -> why it is gone
        self._failed_tags: list[tuple] = []  # (match, why) of fail_tags: checked at each post
        # Bytes each peer sent that no receive claimed yet: a peer may not pile up more than
        # MWRT_MAX_UNCLAIMED_BYTES (a stranger with the public key of an unkeyed daemon could).
        self._unclaimed: dict[int, int] = {}
        self._unclaimed_limit = int(config.get("max_unclaimed_bytes"))

    # -- receives ----------------------------------------------------------------------

    def recv(self, view, peer, tag, timeout, desc) -> None:
        """Fill `view` with the next message from `peer` on `tag`."""
        got = self._post(view, peer, tag, desc)
        if type(got) is Post:
            self.wait(got, timeout)

    def recv_message(self, peer, tag, timeout) -> memoryview:
        """The next message from `peer` on `tag`, whatever its size."""
        got = self._post(None, peer, tag, "any size")
        if type(got) is Post:
            self.wait(got, timeout)
            got = got.view
        return got

    def irecv(self, view, desc, peer, tag, timeout) -> Work:
        """Post a receive now; the receiver thread fills `view` without a helper thread."""
        try:
            post = self._post(view, peer, tag, desc)
            error = None
        except ChannelError as exc:  # it arrived with another size, or the peer is gone: the
            post, error = None, exc  # Work's wait says so, as a receive that failed later does
        if type(post) is not Post:  # it had arrived: a receive that is already complete
            post = Post(view, desc, peer, tag)
            post.finished = True
            post.release(error)
        return Work(f"{self.name} irecv rank {self.rank}<-{peer}", timeout,
                    partial(self.wait, post), partial(_completed, post),
                    partial(self._cancel_post, post))

    def _post(self, view, peer, tag, desc):
        """The arrived message for (peer, tag) in `view` (or the stash itself), or a Post."""
        with self._lock:
            box = self._boxes.get((peer, tag))
            if box is not None and box.arrived:
                msg = box.arrived.popleft()
                self._claimed(peer, msg.total)
                self._gc(peer, tag, box)
                if view is not None and msg.total != view.nbytes:
                    raise size_mismatch(self.channel, peer, tag, msg.desc, desc)
                if not msg.done:  # still arriving: the receiver thread hands it over at the end
                    msg.post = Post(view if view is not None else msg.buf, desc, peer, tag)
                    return msg.post
            elif peer in self.departed or self.channel.closed:
                raise self._closed_error(peer, tag)
            elif self._failed_tags and (why := self.tag_failed(tag)):
                raise self._failed_tag_error(peer, tag, why)
            else:
                post = Post(view, desc, peer, tag)
                if box is None:
                    box = self._boxes[(peer, tag)] = Box()
                box.posted.append(post)
                return post
        if view is None:
            return msg.buf
        view[:] = msg.buf
        return view

    def arrived(self, peer: int, tag: int = 0) -> bool:
        with self._lock:
            box = self._boxes.get((peer, tag))
            if box is not None and box.arrived and not box.posted:
                return True
            if peer in self.departed or self.channel.closed:
                raise self._closed_error(peer, tag)
            return False

    def wait(self, post: Post, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0)
        if not post.finished:
            self.read_for(post, deadline)
        left = -1 if deadline is None else max(deadline - time.monotonic(), 0)
        if not post.ready.acquire(True, left):
            with self._lock:
                mine = not post.finished
                if mine:  # a message that arrives later goes to the stash
                    post.finished = True
                    self._unpost(post)
            if mine:
                post.release(self.timeout_error(post.peer, post.tag, post.desc, timeout))
            post.ready.acquire()  # released by us, or by whoever is completing it right now
        post.ready.release()  # leave it open: a second wait returns at once
        if isinstance(post.error, BaseException):  # else None: it arrived
            raise post.error

    def timeout_error(self, peer, tag, desc, timeout) -> ChannelTimeoutError:
        return ChannelTimeoutError(
            f"{self.name} recv on rank {self.rank} from rank {peer} tag {tag}: no message of "
            f"{desc} completed within {timeout} s; is rank {peer} sending on this tag?")

    def claim_arrived(self, peer, tag) -> memoryview | None:
        """The message that arrived whole on (peer, tag), if no receive waits before us."""
        with self._lock:
            box = self._boxes.get((peer, tag))
            if box is None or box.posted or not box.arrived or not box.arrived[0].done:
                return None
            msg = box.arrived.popleft()
            self._claimed(peer, msg.total)
            self._gc(peer, tag, box)
            return msg.buf

    def _unpost(self, post: Post) -> None:
        """Take a posted receive out of its box (under the lock)."""
        box = self._boxes.get((post.peer, post.tag))
        if box is not None and post in box.posted:
            box.posted.remove(post)
            self._gc(post.peer, post.tag, box)

    def _closed_error(self, peer, tag, got=None, total=None) -> ChannelError:
        where = f"{self.name} recv on rank {self.rank} from rank {peer} tag {tag}"
        if self.channel.closed:
            return ChannelError(f"{where}: this channel was closed while waiting")
        part = "" if got is None else f" after {got} of {total} bytes"
        return ChannelClosedError(f"{where}: rank {peer} {self.departed.get(peer, 'is gone')}"
                                  f"{part}; check the logs of rank {peer}", peer=peer)

    def _gc(self, peer, tag, box) -> None:
        if not box.posted and not box.arrived and box.current is None:
            self._boxes.pop((peer, tag), None)

    # -- the receiver thread's side ----------------------------------------------------

    def deliver(self, peer, tag, data: memoryview, desc: str, keep: bool = False):
        """A whole message arrived: hand it to a receive, or stash it; see the comment below."""
        # Returns the receive it finished, as (post, error), for the caller to release; or,
        # when no receive waits and `keep` is set, a copy of the message instead of stashing
        # it; or None. `data` is reused after the call.
        error = None
        with self._lock:
            box = self._boxes.get((peer, tag))
            if box is not None and box.current is not None:
                raise WireError(f"tag {tag}: a new message while {box.current.got} of "
                                f"{box.current.total} bytes of the last one are due")
            post = self._next_post(box)
            if post is None and keep:
                return memoryview(bytearray(data))
            if post is None and self._failed_tags and self.tag_failed(tag):
                return None  # nothing will ever receive it
            if post is None:
                self._unclaimed_more(peer, data.nbytes)
                msg = Stashed(data.nbytes, desc)
                msg.buf, msg.got, msg.done = memoryview(bytearray(data)), data.nbytes, True
                if box is None:
                    box = self._boxes[(peer, tag)] = Box()
                box.arrived.append(msg)
            else:
                post.finished = True
                if post.view is None:
                    post.view = memoryview(bytearray(data))
                elif post.view.nbytes == data.nbytes:
                    post.view[:] = data
                else:
                    error = size_mismatch(self.channel, peer, tag, desc, post.desc)
            if box is not None:
                self._gc(peer, tag, box)
        return None if post is None else (post, error)

    def _next_post(self, box) -> Post | None:
        """Take the oldest receive still waiting in `box` (under the lock)."""
        while box is not None and box.posted:
            post = box.posted.popleft()
            if not post.finished:  # a closed channel leaves failed ones in place
                return post
        return None

    def segment_target(self, peer: int, frame):
        """Where a segment's bytes go (a slice of the user's buffer or a stash), or None."""
        tag, total, offset, seglen, desc = frame.tag, frame.total, frame.offset, frame.seglen, \
            frame.desc
        with self._lock:
            box = self._boxes.get((peer, tag))
            if box is None:
                box = self._boxes[(peer, tag)] = Box()
            msg = box.current
            if msg is None:
                if offset != 0:
                    raise WireError(f"tag {tag}: segment at offset {offset} starts no message")
                msg = box.current = self._start_message(box, peer, tag, total, desc)
            elif offset != msg.got or total != msg.total:
                raise WireError(f"tag {tag}: segment out of order (got offset {offset} of "
                                f"{total}, expected {msg.got} of {msg.total})")
            if offset + seglen > total:
                raise WireError(f"tag {tag}: segment runs past the message end ({total} bytes)")
            if msg.buf is None or (msg.post is not None and msg.post.finished):
                return None
            return msg.buf[offset:offset + seglen]

    def _start_message(self, box, peer, tag, total, desc) -> Stashed:
        msg = Stashed(total, desc)
        post = self._next_post(box)
        if post is None and self._failed_tags and self.tag_failed(tag):
            return msg  # no buffer: its segments are discarded, nothing will receive it
        if post is None:
            msg.buf = self._stash(peer, total)
            self._unclaimed_more(peer, total)
            box.arrived.append(msg)
        elif post.view is not None and post.view.nbytes != total:
            post.finished = True
            # Consumed: discarded.
            post.release(size_mismatch(self.channel, peer, tag, desc, post.desc))
        else:
            if post.view is None:
                post.view = self._stash(peer, total)
            msg.buf, msg.post = post.view, post  # the last segment's arrival finishes it
        return msg

    def _stash(self, peer, total) -> memoryview:
        limit = config.get("max_tensor_bytes")
        if total > limit:  # a peer's header must not make us allocate without bound
            raise WireError(f"rank {peer} announced a {total}-byte message, over the limit of "
                            f"{limit} bytes (MWRT_MAX_TENSOR_BYTES)")
        # Uninitialized: its pages cost memory only as the bytes arrive, so a header that
        # announces much and sends nothing costs nothing.
        return np.empty(total, np.uint8).data

    def _unclaimed_more(self, peer: int, nbytes: int) -> None:
        """Count a stashed message against `peer`'s allowance (under the lock)."""
        held = self._unclaimed.get(peer, 0) + nbytes
        if held > self._unclaimed_limit:
            raise WireError(f"rank {peer} has sent {held} bytes that no receive claimed, over "
                            f"the limit of {self._unclaimed_limit} (MWRT_MAX_UNCLAIMED_BYTES)")
        self._unclaimed[peer] = held

    def _claimed(self, peer: int, nbytes: int) -> None:
        self._unclaimed[peer] = self._unclaimed.get(peer, 0) - nbytes

    def segment_done(self, peer, tag, seglen) -> None:
        with self._lock:
            box = self._boxes[(peer, tag)]
            msg = box.current
            if msg is None:  # segment_target made it current for this segment
                raise WireError(f"tag {tag}: a segment ended that no message began")
            msg.got += seglen
            if msg.got < msg.total:
                return
            box.current, msg.done, post = None, True, msg.post
            self._gc(peer, tag, box)
            if post is None or post.finished:
                return
            post.finished = True
        if msg.buf is not post.view:
            post.view[:] = msg.buf  # a stashed message that a receive claimed meanwhile
        post.release()

    def peer_gone(self, peer: int, why: str) -> None:
        failed: list[tuple[Post, int | None, int | None]] = []  # (post, bytes got, of total)
        with self._lock:
            self.departed[peer] = why
            for (p, tag), box in list(self._boxes.items()):
                if p != peer:
                    continue
                # A closed channel already failed (and released) the posts it left here.
                failed += [(post, None, None) for post in box.posted if not post.finished]
                box.posted.clear()
                msg = box.current
                if msg is not None:
                    if msg.post is not None and not msg.post.finished:
                        failed.append((msg.post, msg.got, msg.total))
                    if msg in box.arrived:
                        box.arrived.remove(msg)
                        self._claimed(peer, msg.total)  # half a message: never received
                    box.current = None
                self._gc(peer, tag, box)
            for post, _, _ in failed:
                post.finished = True
        for post, got, total in failed:
            post.release(self._closed_error(peer, post.tag, got, total))
        self._on_peer_gone(peer)

    def fail_posts(self) -> None:
        """On close: every receive still waiting fails, saying the channel was closed."""
        with self._lock:
            posts = [p for box in self._boxes.values() for p in box.posted]
            posts += [b.current.post for b in self._boxes.values()
                      if b.current is not None and b.current.post is not None]
            posts = [p for p in posts if not p.finished]
            for post in posts:
                post.finished = True
        for post in posts:
            post.release(self._closed_error(post.peer, post.tag))

    def _cancel_post(self, post: Post) -> None:
        """Withdraw a posted receive (nothing will come): its buffer is no longer written."""
        with self._lock:
            mine = not post.finished
            if mine:
                post.finished = True
                self._unpost(post)
        if mine:
            post.release(ChannelError(f"{self.name} irecv rank {self.rank}<-{post.peer}: "
                                      "cancelled"))

    def fail_peer(self, peer: int, why: str) -> None:
        """Fail every receive from `peer` now, saying `why`."""
        if 0 <= peer < self.channel.world_size and peer != self.rank:
            self.peer_gone(peer, why)

    def fail_tags(self, match, why: str) -> None:
        """Fail every receive on a tag match(tag) accepts, now and at every later post; the
        messages on those tags that nothing claimed, and those still to come, are dropped."""
        failed = []
        with self._lock:
            self._failed_tags.append((match, why))
            for (peer, tag), box in list(self._boxes.items()):
                if not match(tag):
                    continue
                posts = [post for post in box.posted if not post.finished]
                box.posted.clear()
                msg = box.current
                if msg is not None and msg.post is not None and not msg.post.finished:
                    posts.append(msg.post)  # its later segments are discarded
                for post in posts:
                    post.finished = True
                failed += posts
                for msg in [m for m in box.arrived if m.done]:  # nothing will claim them
                    box.arrived.remove(msg)
                    self._claimed(peer, msg.total)
                self._gc(peer, tag, box)
        for post in failed:
            post.release(self._failed_tag_error(post.peer, post.tag, why))

    def tag_failed(self, tag: int) -> str | None:
        """Why receives on `tag` fail at once (fail_tags), or None (under the lock)."""
        for match, why in self._failed_tags:
            if match(tag):
                return why
        return None

    def _failed_tag_error(self, peer, tag, why) -> ChannelClosedError:
        return ChannelClosedError(f"{self.name} recv on rank {self.rank} from rank {peer} tag "
                                  f"{tag}: {why}")


def _read_nothing(post: Post, deadline: float | None) -> None:
    """A transport that reads nothing for its waiters."""


def _completed(post: Post) -> bool:
    return post.error is not PENDING

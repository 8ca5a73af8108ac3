"""Matching received messages to receives by (peer, tag), for channels with a receiver thread.

A transport's receiver thread reports each segment it reads; this layer decides where
the bytes go. A message for which a receive is posted lands straight in the user's
buffer; otherwise it is stashed in a temporary buffer until a receive claims it (then
copied once). Receives on one (peer, tag) match messages in send order. A message of
the wrong size fails its receive with both sizes named and is consumed. When a peer's
connection ends, every receive waiting on it fails with ChannelClosedError.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError

from .. import config
from ..errors import ChannelClosedError, ChannelError, ChannelTimeoutError, WireError
from .base import DataChannel, Work, byte_view, describe, size_mismatch


class _Post:
    """A receive: the buffer to fill, and the future the caller waits on."""

    __slots__ = ("view", "desc", "peer", "tag", "future", "cancelled")

    def __init__(self, view, desc, peer, tag):
        self.view, self.desc, self.peer, self.tag = view, desc, peer, tag
        self.future, self.cancelled = Future(), False


class _Msg:
    """A message from a peer: where its bytes go, and how many have arrived."""

    __slots__ = ("total", "desc", "buf", "got", "post", "done")

    def __init__(self, total, desc):
        self.total, self.desc, self.buf, self.got = total, desc, None, 0
        self.post, self.done = None, False


class _Box:
    """Per (peer, tag): receives waiting, messages nobody claimed yet, the one arriving."""

    __slots__ = ("posted", "arrived", "current")

    def __init__(self):
        self.posted, self.arrived, self.current = deque(), deque(), None



def resolve(post: _Post, exc: BaseException | None = None) -> None:
    try:
        if exc is None:
            post.future.set_result(None)
        else:
            post.future.set_exception(exc)
    except InvalidStateError:
        pass  # already failed by a timeout or a close; the late outcome is moot



class MatchingChannel(DataChannel):
    """A channel whose transport calls _segment_target/_segment_done/_peer_gone as bytes arrive."""

    buffered_sends = True  # unmatched messages are stashed, so sends never wait for receives
    posted_receives = True  # irecv posts the buffer and returns: any number may be pending

    def __init__(self, rank, world_size, **kwargs):
        super().__init__(rank, world_size, **kwargs)
        self._cond = threading.Condition()
        self._boxes: dict[tuple[int, int], _Box] = {}
        self._gone: dict[int, str] = {}

    def _on_peer_gone(self, peer: int) -> None:
        """Release per-peer receive resources (shm mappings)."""

    def _recv(self, view, peer, tag, timeout, desc):
        self._wait_post(self._post(view, peer, tag, desc), peer, timeout)

    def irecv(self, buf, peer, tag=0, timeout=None):
        """Post a receive now; the receiver thread fills `buf` without a helper thread."""
        view = byte_view(buf, writable=True, what=f"{self.name} irecv from rank {peer}")
        self._check(peer, tag)
        post = self._post(view, peer, tag, describe(buf))
        return _PostWork(self, post, peer, self._timeout(timeout))

    def _post(self, view, peer, tag, desc) -> _Post:
        post, copy_from = _Post(view, desc, peer, tag), None
        with self._cond:
            box = self._boxes.setdefault((peer, tag), _Box())
            if box.arrived:
                msg = box.arrived.popleft()
                self._gc(peer, tag, box)
                if msg.total != view.nbytes:
                    raise size_mismatch(self, peer, tag, msg.desc, desc)
                if msg.done:
                    copy_from = msg.buf
                else:
                    msg.post = post  # the receiver thread copies it out on completion
            elif peer in self._gone or self.closed:
                self._gc(peer, tag, box)
                raise self._closed_error(peer, tag)
            else:
                box.posted.append(post)
        if copy_from is not None:
            view[:] = copy_from
            resolve(post)
        return post

    def _withdraw(self, post: _Post, peer: int) -> None:
        """Take a posted receive back: a message that arrives later goes to the stash."""
        with self._cond:
            post.cancelled = True
            box = self._boxes.get((peer, post.tag))
            if box is not None and post in box.posted:
                box.posted.remove(post)
                self._gc(peer, post.tag, box)

    def _wait_post(self, post: _Post, peer: int, timeout: float) -> None:
        try:
            post.future.result(timeout)
            return
        except TimeoutError:
            if post.future.done():  # the future's own error, or it completed just now
                return post.future.result()
        self._withdraw(post, peer)
        resolve(post, ChannelTimeoutError(
            f"{self.name} recv on rank {self.rank} from rank {peer} tag {post.tag}: no "
            f"message of {post.desc} completed within {timeout} s; is rank {peer} sending "
            "on this tag?"))
        post.future.result()

    def _closed_error(self, peer, tag, got=None, total=None) -> ChannelError:
        where = f"{self.name} recv on rank {self.rank} from rank {peer} tag {tag}"
        if self.closed:
            return ChannelError(f"{where}: this channel was closed while waiting")
        part = "" if got is None else f" after {got} of {total} bytes"
        return ChannelClosedError(f"{where}: rank {peer} {self._gone.get(peer, 'is gone')}"
                                  f"{part}; check the logs of rank {peer}", peer=peer)

    def _gc(self, peer, tag, box) -> None:
        if not box.posted and not box.arrived and box.current is None:
            self._boxes.pop((peer, tag), None)

    def _segment_target(self, peer, tag, total, offset, seglen, desc):
        """Where a segment's bytes go (a slice of the user's buffer or a stash), or None."""
        with self._cond:
            box = self._boxes.setdefault((peer, tag), _Box())
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
            if msg.buf is None or (msg.post is not None and msg.post.cancelled):
                return None
            return msg.buf[offset:offset + seglen]

    def _start_message(self, box, peer, tag, total, desc) -> _Msg:
        msg = _Msg(total, desc)
        while box.posted:
            post = box.posted.popleft()
            if post.cancelled:
                continue
            if post.view.nbytes != total:
                resolve(post, size_mismatch(self, peer, tag, desc, post.desc))
            else:
                msg.buf, msg.post = post.view, post
            return msg
        limit = config.get("max_tensor_bytes")
        if total > limit:  # a peer's header must not make us allocate without bound
            raise WireError(f"rank {peer} announced a {total}-byte message, over the limit of "
                            f"{limit} bytes (MWRT_MAX_TENSOR_BYTES)")
        msg.buf = memoryview(bytearray(total))
        box.arrived.append(msg)
        return msg

    def _segment_done(self, peer, tag, seglen) -> None:
        with self._cond:
            box = self._boxes[(peer, tag)]
            msg = box.current
            msg.got += seglen
            if msg.got < msg.total:
                return
            box.current, msg.done, post = None, True, msg.post
            self._gc(peer, tag, box)
        if post is not None and not post.cancelled:
            if msg.buf is not post.view:
                post.view[:] = msg.buf  # a stashed message that a receive claimed meanwhile
            resolve(post)

    def _peer_gone(self, peer: int, why: str) -> None:
        failed = []
        with self._cond:
            self._gone[peer] = why
            for (p, tag), box in list(self._boxes.items()):
                if p != peer:
                    continue
                failed += [(post, None, None) for post in box.posted]
                box.posted.clear()
                msg = box.current
                if msg is not None:
                    if msg.post is not None:
                        failed.append((msg.post, msg.got, msg.total))
                    if msg in box.arrived:
                        box.arrived.remove(msg)
                    box.current = None
                self._gc(peer, tag, box)
            self._cond.notify_all()
        for post, got, total in failed:
            resolve(post, self._closed_error(peer, post.tag, got, total))
        self._on_peer_gone(peer)

    def fail_peer(self, peer: int, why: str) -> None:
        """Fail every receive from `peer` now, saying `why`."""
        if 0 <= peer < self.world_size and peer != self.rank:
            self._peer_gone(peer, why)


class _PostWork(Work):
    """An irecv posted to the receiver thread; wait() defaults to the irecv's timeout."""

    def __init__(self, channel, post, peer, timeout):
        super().__init__(post.future, f"{channel.name} irecv rank {channel.rank}<-{peer}")
        self._channel, self._post, self._peer, self._default = channel, post, peer, timeout

    def cancel(self) -> None:
        """Withdraw the receive (nothing will come): its buffer is no longer written."""
        self._channel._withdraw(self._post, self._peer)
        resolve(self._post, ChannelError(f"{self._what}: cancelled"))

    def wait(self, timeout=None):
        """Block until the buffer is filled, or raise ChannelTimeoutError after `timeout` s."""
        timeout = self._default if timeout is None else timeout
        self._channel._wait_post(self._post, self._peer, timeout)

"""The data-channel contract: point-to-point buffers between ranks, validated up front.

A channel moves raw bytes between the ranks of one group. `DataChannel` is abstract:
public methods validate their arguments and convert them to flat byte views; a channel
implements the `_private` methods (`_send` and `_recv` at least). Messages between two
ranks are matched by (peer, tag) and delivered in send order per (peer, tag). A receive
names the buffer to fill; a message of another size is an error naming both sizes, never
a silent truncation. A channel that can tell whether a message has come without taking it
overrides `arrived`, which receives from any source need.

What a channel can do beyond that it declares as class attributes (documented on
`DataChannel`, each with a default a channel that says nothing gets); the layers above
read them, they never probe for methods. Objects a higher layer keeps per channel (the
shared-memory state of single-copy collectives) are attached with `attachment()`, and
leave and close with the channel.
"""

from __future__ import annotations

import abc
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from .. import config
from ..errors import ChannelError, ChannelTimeoutError, ConfigError


def byte_view(buf, *, writable: bool, what: str) -> memoryview:
    """Return a flat, C-contiguous byte view of `buf` (NumPy array, memoryview, bytes…)."""
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(
            f"{what}: expected an object with the buffer protocol "
            f"(NumPy array, memoryview, bytearray), got {type(buf).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ValueError(f"{what}: buffer is not C-contiguous; pass np.ascontiguousarray(buf)")
    if writable and view.readonly:
        raise ValueError(f"{what}: buffer is read-only; receive into a writable array")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


_DESCRIPTIONS: dict[tuple, str] = {}
_UNMADE = object()  # an attachment whose make() has not returned yet


def describe(buf) -> str:
    """Say what a buffer is, for error messages: dtype and shape when it has them."""
    dtype, shape = getattr(buf, "dtype", None), getattr(buf, "shape", None)
    if dtype is None or shape is None:
        return f"{memoryview(buf).nbytes} bytes"
    # Every message carries this; str(dtype) alone costs microseconds, so remember it.
    key = (dtype, shape)
    text = _DESCRIPTIONS.get(key)
    if text is None:
        if len(_DESCRIPTIONS) > 4096:
            _DESCRIPTIONS.clear()
        text = _DESCRIPTIONS[key] = f"{getattr(buf, 'nbytes', None) or memoryview(buf).nbytes} " \
                                    f"bytes ({dtype}{list(shape)})"
    return text


class Work:
    """A pending isend/irecv: wait(timeout) raises its error, is_completed() polls.

    The one Work of the channel layer. A channel builds it from the functions that wait
    for, poll and withdraw its operation (a receive posted to a receiver thread), or from
    the Future of the helper thread that runs it (`Work.of_future`).
    """

    __slots__ = ("_cancel", "_done", "_wait", "timeout", "what")

    def __init__(self, what: str, timeout: float | None, wait, done, cancel):
        self.what, self.timeout = what, timeout
        self._wait, self._done, self._cancel = wait, done, cancel

    @classmethod
    def of_future(cls, future: Future, what: str) -> Work:
        """The Work of an operation a helper thread runs (it carries its own timeout)."""
        return cls(what, None, partial(_wait_future, future, what), future.done, future.cancel)

    def wait(self, timeout: float | None = None) -> None:
        """Block until done (at most `timeout` s; default: the operation's) and raise its
        error. A posted receive whose wait times out ends there (a later message goes to
        the next receive); an operation on a helper thread keeps running."""
        self._wait(self.timeout if timeout is None else timeout)

    def is_completed(self) -> bool:
        """True once the operation finished, successfully or not."""
        return self._done()

    def cancel(self) -> None:
        """Withdraw a receive that will never be matched: its buffer is no longer written
        (best effort: one already running completes)."""
        self._cancel()

    def exception(self):
        """The operation's error, or None; waits for it to finish."""
        try:
            self.wait()
        except BaseException as exc:  # noqa: BLE001 - returned, as Future.exception does
            return exc
        return None


def _wait_future(future: Future, what: str, timeout: float | None) -> None:
    try:
        future.result(timeout=timeout)
    except TimeoutError:
        if not future.done():
            raise ChannelTimeoutError(f"{what}: not complete after {timeout} s") from None
        raise


class DataChannel(abc.ABC):
    """Point-to-point byte transport among `world_size` ranks; rendezvous through a store.

    Capabilities, declared by each channel class (a channel that omits one gets the
    default here; the collective layer reads them as they are, never probing):
    """

    name = "base"
    # A send completes whether or not the peer has posted a receive (the socket channels'
    # receiver threads always drain): collectives may then send before their agreement
    # check settles (mwrt.collective.agreement).
    buffered_sends: bool = False
    # recv_message() works: collectives then carry their agreement check inside their own
    # messages, whose sizes may differ between ranks that disagree.
    any_size_recv: bool = False
    # irecv() posts the buffer and returns without a helper thread, so any number of
    # receives may be pending at once (a ring posts the next chunk's early).
    posted_receives: bool = False
    # Sends up to this many bytes return before the peer receives (socket buffers, shm
    # slots), so small exchanges may send then receive on one thread; None: the default
    # MWRT_EAGER_BYTES; 0: every send needs the matching receive posted first.
    eager_bytes: int | None = None
    # send/recv take GPU (CuPy) arrays themselves; otherwise collectives stage them
    # through host memory.
    device_buffers: bool = False
    # The name of this channel's native collectives, registered with
    # mwrt.collective.native.register (or that class itself, for a channel outside
    # mwrt); None: the generic algorithms over send/recv run every collective.
    native_collectives: str | type | None = None

    def __init__(self, rank: int, world_size: int, *, store, prefix: str = "mwrt",
                 key: bytes | None = None, timeout: float | None = None):
        if not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"world_size: must be a positive int (got {world_size!r})")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ConfigError(f"rank: must be in [0, {world_size}) (got {rank!r})")
        self.rank, self.world_size = rank, world_size
        self.store, self.prefix, self.key = store, prefix, key
        self.timeout = config.get("channel_timeout") if timeout is None else float(timeout)
        self._pools: dict[tuple[str, int], ThreadPoolExecutor] = {}
        self._pools_lock = threading.Lock()
        self._attached: dict = {}
        self.closed = False

    # -- public, validating ------------------------------------------------------------

    def send(self, buf, peer: int, tag: int = 0, timeout: float | None = None) -> None:
        """Send the bytes of `buf` to `peer`; returns when the buffer may be reused."""
        view = byte_view(buf, writable=False, what=f"{self.name} send to rank {peer}")
        self._check(peer, tag)
        self._send(view, peer, tag, self._timeout(timeout), describe(buf))

    def recv(self, buf, peer: int, tag: int = 0, timeout: float | None = None) -> None:
        """Receive a message from `peer` into `buf`, whose size must match the message."""
        view = byte_view(buf, writable=True, what=f"{self.name} recv from rank {peer}")
        self._check(peer, tag)
        self._recv(view, peer, tag, self._timeout(timeout), describe(buf))

    def recv_message(self, peer: int, tag: int = 0, timeout: float | None = None) -> memoryview:
        """Receive the next message from `peer` on `tag`, whatever its size, as a byte view."""
        self._check(peer, tag)
        return self._recv_message(peer, tag, self._timeout(timeout))

    def exchange_message(self, buf, peer: int, tag: int = 0,
                         timeout: float | None = None) -> memoryview:
        """Send `buf` to `peer`, then receive `peer`'s next message on `tag` (recv_message)."""
        view = byte_view(buf, writable=False, what=f"{self.name} exchange with rank {peer}")
        self._check(peer, tag)
        return self._exchange_message(view, peer, tag, self._timeout(timeout), describe(buf))

    def isend(self, buf, peer: int, tag: int = 0, timeout: float | None = None) -> Work:
        """Start a send; the returned Work completes when `buf` may be reused."""
        self._check(peer, tag)
        return self._submit("send", peer, self.send, buf, peer, tag, timeout)

    def irecv(self, buf, peer: int, tag: int = 0, timeout: float | None = None) -> Work:
        """Start a receive into `buf`; the returned Work completes when it is filled. A
        message of another size that came before it, or a peer gone, fails the Work's
        wait(), not this call: a caller that posts early and waits later must not lose it."""
        self._check(peer, tag)
        return self._submit("recv", peer, self.recv, buf, peer, tag, timeout)

    def close(self) -> None:
        """Release sockets, segments and threads; idempotent."""
        if self.closed:
            return
        self.closed = True
        with self._pools_lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        self.leave()  # before the transport goes: peers take a closed one as a death
        for attached in self._attachments():
            attached.close()
        self._close()

    def attachment(self, key, make):
        """The object a higher layer keeps on this channel under `key`, made by make() on
        first use (None is kept too: "tried, not possible"). A made object must have
        `leave()` and `close()`, which run when the channel leaves and closes."""
        with self._pools_lock:
            slot = self._attached.get(key)
            if slot is None:
                slot = self._attached[key] = [threading.Lock(), _UNMADE]
        if slot[1] is _UNMADE:
            with slot[0]:  # per key, and outside the channel's lock: make() may talk to peers
                if slot[1] is _UNMADE:
                    slot[1] = make()
        return slot[1]

    def _attachments(self) -> list:
        with self._pools_lock:
            return [made for _, made in self._attached.values()
                    if made is not None and made is not _UNMADE]

    def arrived(self, peer: int, tag: int = 0) -> bool:
        """True if a message from `peer` on `tag` came (or is coming) that no receive awaits:
        how a receive from any source learns who sent first. ChannelClosedError once `peer`
        is gone and left nothing."""
        raise NotImplementedError(f"{self.name} channel: cannot tell which peer sent first, so "
                                  "it cannot receive from any source; name the sender")

    def leave(self) -> None:
        """Before this process exits: wait (briefly) until no peer still reads our memory
        (what the attachments hold); a channel whose peers never do has nothing to wait for."""
        for attached in self._attachments():
            attached.leave()

    def gone(self, peer: int) -> str | None:
        """Why `peer` can no longer be reached (it closed, died, was declared gone), or None
        while it may be (and for a channel that cannot tell)."""
        return None

    def host_of(self, rank: int) -> str | None:
        """What names `rank`'s host, equal for ranks that share one (memory, /dev/shm) and the
        same answer on every rank; None where the channel cannot tell, and then collectives
        treat the ranks as one flat set."""
        return None

    def shares_host(self, peer: int) -> bool:
        """True if `peer` runs on this host (same memory, same /dev/shm), so same-host
        means (shared memory, cross-memory attach) can reach it."""
        return peer == self.rank

    def fail_peer(self, peer: int, why: str) -> None:  # noqa: B027 - a default: does nothing
        """Someone who knows (a master's heartbeat) says `peer` is gone: fail its receives now
        rather than at their timeout. A channel that cannot tell does nothing."""

    def fail_tags(self, match, why: str) -> None:  # noqa: B027 - a default: does nothing
        """Someone who knows says the messages on every tag for which match(tag) holds will
        never come (a collective one of whose members was lost): fail those receives, from
        any peer, now and from now on. A channel that cannot tell does nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<{type(self).__name__} rank {self.rank} of {self.world_size}>"

    # -- for subclasses ----------------------------------------------------------------

    @abc.abstractmethod
    def _send(self, view: memoryview, peer: int, tag: int, timeout: float, desc: str) -> None:
        """Send `view` (flat bytes) to `peer`; return when it may be reused."""

    @abc.abstractmethod
    def _recv(self, view: memoryview, peer: int, tag: int, timeout: float, desc: str) -> None:
        """Fill `view` with the next message from `peer` on `tag`, of exactly its size."""

    def _recv_message(self, peer: int, tag: int, timeout: float) -> memoryview:
        raise NotImplementedError(f"{self.name} channel: recv_message needs a transport that "
                                  "sends each message's size first (any_size_recv = False)")

    def _exchange_message(self, view: memoryview, peer: int, tag: int, timeout: float,
                          desc: str) -> memoryview:
        self._send(view, peer, tag, timeout, desc)
        return self._recv_message(peer, tag, timeout)

    def _close(self) -> None:  # noqa: B027 - a default: nothing of the subclass's to close
        pass

    # -- helpers -----------------------------------------------------------------------

    def _check(self, peer, tag) -> None:
        if self.closed:
            raise ChannelError(f"{self!r}: channel is closed")
        if not isinstance(peer, int) or not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(
                f"{self.name} channel rank {self.rank}: peer must be another rank in "
                f"[0, {self.world_size}) (got {peer!r})"
            )
        if not isinstance(tag, int) or tag < 0:
            raise ValueError(f"{self.name} channel: tag must be an int >= 0 (got {tag!r})")

    def _timeout(self, timeout) -> float:
        return self.timeout if timeout is None else float(timeout)

    def _submit(self, direction: str, peer: int, fn, *args) -> Work:
        # One thread per (direction, peer) keeps isends (and irecvs) to a peer in issue order.
        with self._pools_lock:
            pool = self._pools.get((direction, peer))
            if pool is None:
                pool = ThreadPoolExecutor(1, thread_name_prefix=f"mwrt-{direction}-{peer}")
                self._pools[(direction, peer)] = pool
        arrow = "->" if direction == "send" else "<-"
        what = f"{self.name} {direction} rank {self.rank}{arrow}{peer}"
        return Work.of_future(pool.submit(fn, *args), what)


def size_mismatch(channel: DataChannel, peer: int, tag: int, got: str, expected: str):
    """The error for a message whose size differs from the receive buffer's."""
    return ChannelError(
        f"{channel.name} recv on rank {channel.rank} from rank {peer} tag {tag}: "
        f"message size does not match the buffer (got {got}, expected {expected}); "
        "the two sides disagree on the array's shape or dtype"
    )

"""The data-channel contract: point-to-point buffers between ranks, validated up front.

A channel moves raw bytes between the ranks of one group. Public methods validate
their arguments and convert them to flat byte views; subclasses implement the
`_private` methods only. Messages between two ranks are matched by (peer, tag) and
delivered in send order per (peer, tag). A receive names the buffer to fill; a
message of another size is an error naming both sizes, never a silent truncation.
A channel whose transport learns a message's size before its bytes also offers
`recv_message`, which takes the next message whatever its size (`any_size_recv`), and
one that can tell whether a message has come without taking it offers `arrived`, which
receives from any source need.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

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


_DESCRIPTIONS: dict = {}


def describe(buf) -> str:
    """Say what a buffer is, for error messages: dtype and shape when it has them."""
    dtype, shape = getattr(buf, "dtype", None), getattr(buf, "shape", None)
    if dtype is None:
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
    """A pending isend/irecv: wait(timeout) raises its error, is_completed() polls."""

    def __init__(self, future: Future, what: str):
        self._future, self._what = future, what

    def wait(self, timeout: float | None = None) -> None:
        """Block until done (or `timeout` seconds pass) and raise the operation's error."""
        try:
            self._future.result(timeout=timeout)
        except TimeoutError:
            if not self._future.done():
                raise ChannelTimeoutError(
                    f"{self._what}: not complete after {timeout} s"
                ) from None
            raise

    def is_completed(self) -> bool:
        """True once the operation finished, successfully or not."""
        return self._future.done()

    def cancel(self) -> None:
        """Withdraw a receive that will never be matched (best effort; a no-op here)."""
        self._future.cancel()

    def exception(self):
        """The operation's error, or None; waits for it to finish."""
        return self._future.exception()


class DataChannel:
    """Point-to-point byte transport among `world_size` ranks; rendezvous through a store."""

    name = "base"
    # True when a send completes whether or not the peer has posted a receive (the socket
    # channels' receiver threads always drain): collectives may then send before their
    # agreement check settles (mwrt.collective.agreement).
    buffered_sends = False
    # True when recv_message() works: collectives then carry their agreement check inside
    # their own messages, whose sizes may differ between ranks that disagree.
    any_size_recv = False

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
        """Start a receive into `buf`; the returned Work completes when it is filled."""
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
        self._close()

    def arrived(self, peer: int, tag: int = 0) -> bool:
        """True if a message from `peer` on `tag` came (or is coming) that no receive awaits:
        how a receive from any source learns who sent first. ChannelClosedError once `peer`
        is gone and left nothing."""
        raise NotImplementedError(f"{self.name} channel: cannot tell which peer sent first, so "
                                  "it cannot receive from any source; name the sender")

    def leave(self) -> None:
        """Before this process exits: wait (briefly) until no peer still reads our memory.
        A channel whose peers never do has nothing to wait for."""

    def fail_peer(self, peer: int, why: str) -> None:
        """Someone who knows (a master's heartbeat) says `peer` is gone: fail its receives now
        rather than at their timeout. A channel that cannot tell does nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<{type(self).__name__} rank {self.rank} of {self.world_size}>"

    # -- for subclasses ----------------------------------------------------------------

    def _send(self, view: memoryview, peer: int, tag: int, timeout: float, desc: str) -> None:
        raise NotImplementedError

    def _recv(self, view: memoryview, peer: int, tag: int, timeout: float, desc: str) -> None:
        raise NotImplementedError

    def _recv_message(self, peer: int, tag: int, timeout: float) -> memoryview:
        raise NotImplementedError(f"{self.name} channel: recv_message needs a transport that "
                                  "sends each message's size first (any_size_recv = False)")

    def _exchange_message(self, view: memoryview, peer: int, tag: int, timeout: float,
                          desc: str) -> memoryview:
        self._send(view, peer, tag, timeout, desc)
        return self._recv_message(peer, tag, timeout)

    def _close(self) -> None:
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
        what = f"{self.name} {direction} rank {self.rank}{'->' if direction == 'send' else '<-'}{peer}"
        return Work(pool.submit(fn, *args), what)


def size_mismatch(channel: DataChannel, peer: int, tag: int, got: str, expected: str):
    """The error for a message whose size differs from the receive buffer's."""
    return ChannelError(
        f"{channel.name} recv on rank {channel.rank} from rank {peer} tag {tag}: "
        f"message size does not match the buffer (got {got}, expected {expected}); "
        "the two sides disagree on the array's shape or dtype"
    )

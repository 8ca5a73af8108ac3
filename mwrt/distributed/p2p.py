"""The facade's point-to-point: torch's send/recv/isend/irecv, and the 2017 proposal's
`tensor = recv(src)`.

Every send is preceded by a small header on a tag of its own (the array's dtype and
shape), so a receive may make its array (`recv(src)`) or check the one it was given
(`recv(tensor, src)`: a size mismatch names what was sent). The two forms are told apart
by the first argument: a rank number or an array.
"""

from __future__ import annotations

import itertools
import numbers
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..collective.buffers import as_flat, host_view
from ..errors import ChannelClosedError, ChannelTimeoutError
from .api import Work, _init_lock, _state, resolve_group

_HEADER = 128  # bytes: "<dtype> <dim> <dim>..." in ASCII, NUL-padded
_calls = itertools.count(1)  # p2p calls of this process, so the watchdog tells them apart


def _header(arr, tensor) -> np.ndarray:
    """The header announcing `tensor` (flat host view `arr`): its dtype and shape."""
    dtype = arr.dtype.name if arr.dtype.kind == "V" else arr.dtype.str
    shape = tuple(getattr(tensor, "shape", arr.shape))
    text = " ".join([dtype, *map(str, shape)]).encode()
    if len(text) > _HEADER:
        raise ValueError(f"send: shape {shape} is too long to announce ({len(text)} bytes of "
                         f"header, at most {_HEADER}); reshape to fewer dimensions")
    out = np.zeros(_HEADER, np.uint8)
    out[:len(text)] = np.frombuffer(text, np.uint8)
    return out


def _parse(header: np.ndarray) -> tuple[np.dtype, tuple]:
    dtype, *shape = header.tobytes().rstrip(b"\0").decode().split(" ")
    return np.dtype(dtype), tuple(int(d) for d in shape)


def _p2p_args(peer, tag, what, group):
    g = resolve_group(group)
    if peer is None:
        raise ValueError(f"{what}: a destination rank is required (got None)")
    if g is None or peer not in g.ranks:
        raise ValueError(f"{what}: rank {peer} is not in the group")
    return g, g.p2p_tag(int(tag)), g.p2p_header_tag(int(tag))


class _marked:
    """`with _marked(g, text)`: the call the hang watchdog reports while it waits."""

    __slots__ = ("g",)

    def __init__(self, g, text: str, peer: int | None = None):
        self.g = g
        g.p2p = (next(_calls), text, peer)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.g.p2p = None


def send(tensor, dst: int, group=None, tag: int = 0) -> None:
    """Send `tensor` to global rank `dst` (blocking until it may be reused)."""
    g, t, h = _p2p_args(dst, tag, "send", group)
    with host_view(tensor, g, "send", writable=False) as arr, \
            _marked(g, f"send to rank {dst} (tag {tag})", dst):
        g.channel.send(_header(arr, tensor), dst, h, g.timeout)
        g.channel.send(arr, dst, t, g.timeout)


def recv(tensor=None, src: int | None = None, group=None, tag: int = 0):
    """Receive from global rank `src` (None: whoever sends first): into `tensor`, returning
    the sender (torch's), or, called as recv(src), into a new array it returns (the 2017
    proposal's)."""
    if isinstance(tensor, numbers.Integral) and not isinstance(tensor, bool):
        return _recv_new(int(tensor), group, tag)
    if src is None:
        src = _first_sender(group, tag)
    g, t, h = _p2p_args(src, tag, "recv", group)
    with host_view(tensor, g, "recv") as arr, \
            _marked(g, f"recv from rank {src} (tag {tag})", src):
        header = np.empty(_HEADER, np.uint8)
        g.channel.recv(header, src, h, g.timeout)
        dtype, shape = _parse(header)
        sent = dtype.itemsize * int(np.prod(shape))
        if sent != arr.nbytes:
            raise ValueError(f"recv on rank {g.channel.rank}: rank {src} sent {dtype}{list(shape)}"
                             f" ({sent} bytes), this array holds {arr.nbytes} bytes "
                             f"({arr.dtype}{list(np.shape(tensor))}); receive into a matching "
                             f"array, or call recv({src}) for a new one")
        g.channel.recv(arr, src, t, g.timeout)
    return src


def _recv_new(src: int, group, tag: int) -> np.ndarray:
    """recv(src): a new array shaped and typed as the sender's."""
    g, t, h = _p2p_args(src, tag, "recv", group)
    with _marked(g, f"recv from rank {src} (tag {tag})", src):
        header = np.empty(_HEADER, np.uint8)
        g.channel.recv(header, src, h, g.timeout)
        dtype, shape = _parse(header)
        out = np.empty(shape, dtype)
        g.channel.recv(out.reshape(-1), src, t, g.timeout)
    return out


def _first_sender(group, tag: int) -> int:
    """The global rank whose message on `tag` came first; polls, as nothing can be posted
    for an unknown sender (a receive posted to each peer would take one from each)."""
    g = resolve_group(group)
    if g is None:
        raise ValueError("recv: this rank is not in the group")
    ch, t = g.channel, g.p2p_header_tag(int(tag))
    peers, gone = [p for p in g.ranks if p != ch.rank], []
    if not peers:
        raise ValueError("recv: no other rank in the group to receive from")
    deadline, pause = time.monotonic() + g.timeout, 1e-5
    with _marked(g, f"recv from any rank (tag {tag})"):
        while peers:
            for peer in list(peers):
                try:
                    if ch.arrived(peer, t):
                        return peer
                except ChannelClosedError as exc:  # it can send nothing more
                    peers.remove(peer)
                    gone.append((peer, exc))
            if time.monotonic() >= deadline:
                left = f"; ranks {[p for p, _ in gone]} are gone" if gone else ""
                raise ChannelTimeoutError(f"recv on rank {ch.rank} from any source, tag {tag}: "
                                          f"nothing from ranks {peers} within {g.timeout} s"
                                          f"{left}")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
    raise ChannelClosedError(f"recv on rank {ch.rank} from any source, tag {tag}: every peer "
                             f"is gone ({'; '.join(str(e) for _, e in gone)})",
                             peer=gone[0][0] if gone else None)


class _Pair:
    """The header's and the data's channel Works of one isend/irecv, as one."""

    __slots__ = ("works",)

    def __init__(self, *works):
        self.works = works

    def wait(self, timeout: float | None = None) -> None:
        for w in self.works:
            w.wait(timeout)

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


def isend(tensor, dst: int, group=None, tag: int = 0) -> Work:
    """Start sending `tensor` to `dst`; do not modify it before Work.wait()."""
    g, t, h = _p2p_args(dst, tag, "isend", group)
    arr = as_flat(tensor, "isend", writable=False)
    return Work(work=_Pair(g.channel.isend(_header(arr, tensor), dst, h, g.timeout),
                           g.channel.isend(arr, dst, t, g.timeout)))


def irecv(tensor, src: int | None = None, group=None, tag: int = 0) -> Work:
    """Start receiving into `tensor` from `src` (None: the first sender); read it after
    Work.wait(), and the sender from Work.source_rank()."""
    if src is None:  # nothing can be posted for an unknown sender: a thread waits for it
        as_flat(tensor, "irecv")
        with _init_lock:
            if _state.any_source is None:
                _state.any_source = ThreadPoolExecutor(1, thread_name_prefix="mwrt-any-source")
        return Work(future=_state.any_source.submit(recv, tensor, None, group, tag))
    g, t, h = _p2p_args(src, tag, "irecv", group)
    header = np.empty(_HEADER, np.uint8)  # posted and dropped: recv() checks sizes, irecv not
    return Work(work=_Pair(g.channel.irecv(header, src, h, g.timeout),
                           g.channel.irecv(as_flat(tensor, "irecv"), src, t, g.timeout)),
                source=src)


class P2POp:
    """One isend or irecv for batch_isend_irecv: P2POp(dist.isend, tensor, peer)."""

    def __init__(self, op, tensor, peer: int, group=None, tag: int = 0):
        if op not in (isend, irecv):
            raise ValueError(f"P2POp: op must be dist.isend or dist.irecv (got {op!r})")
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag


def batch_isend_irecv(p2p_op_list: list) -> list[Work]:
    """Start every operation of the list; return their Works, in order."""
    if not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise TypeError("batch_isend_irecv: expected a list of P2POp")
    return [p.op(p.tensor, p.peer, p.group, p.tag) for p in p2p_op_list]


__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv"]

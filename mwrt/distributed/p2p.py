"""The facade's point-to-point: torch's send/recv/isend/irecv, and the 2017 proposal's
`tensor = recv(src)`.

Every message starts with a small header (the array's dtype and shape), so a receive may
make its array (`recv(src)`) or check the one it was given (`recv(tensor, src)`: a size
mismatch names what was sent). Up to _SMALL bytes, header and data travel as one message
(a channel that takes messages of any size: all built-in ones), so a small send costs one
message as before; larger data follows its header on the same tag. The two forms of recv
are told apart by the first argument: a rank number or an array.
"""

from __future__ import annotations

import itertools
import numbers
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..collective.buffers import as_flat, host_view
from ..errors import ChannelClosedError, ChannelTimeoutError
from .process_groups import GroupLike, Tensor, Work, _init_lock, _state, resolve_group

_HEADER = 128  # bytes: "<dtype> <dim> <dim>..." in ASCII, NUL-padded
_SMALL = 1 << 16  # data up to this size rides in its header's message
_calls = itertools.count(1)  # p2p calls of this process, so the watchdog tells them apart


_HEADERS: dict[tuple, np.ndarray] = {}  # (dtype, shape) -> its header
_PARSED: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}  # header -> what it says


def _header(arr, tensor, combine: bool) -> np.ndarray:
    """The first message for `tensor` (flat host view `arr`): its dtype and shape, then the
    data itself if `combine`."""
    shape = tuple(getattr(tensor, "shape", arr.shape))
    key = (arr.dtype, shape)
    head = _HEADERS.get(key)
    if head is None:
        dtype = arr.dtype.name if arr.dtype.kind == "V" else arr.dtype.str
        text = " ".join([dtype, *map(str, shape)]).encode()
        if len(text) > _HEADER:
            raise ValueError(f"send: shape {shape} is too long to announce ({len(text)} bytes "
                             f"of header, at most {_HEADER}); reshape to fewer dimensions")
        if len(_HEADERS) > 4096:
            _HEADERS.clear()
        head = _HEADERS[key] = np.frombuffer(text.ljust(_HEADER, b"\0"), np.uint8)
    out = np.empty(_HEADER + (arr.nbytes if combine else 0), np.uint8)
    out[:_HEADER] = head
    if combine:
        out[_HEADER:] = arr.view(np.uint8)
    return out


def _combines(g, nbytes: int) -> bool:
    return nbytes <= _SMALL and bool(g.channel.any_size_recv)


def _parse(header) -> tuple[np.dtype, tuple[int, ...], int]:
    raw = bytes(header[:_HEADER])
    got = _PARSED.get(raw)
    if got is None:
        name, *dims = raw.rstrip(b"\0").decode().split(" ")
        dtype, shape = np.dtype(name), tuple(int(d) for d in dims)
        n = dtype.itemsize
        for d in shape:
            n *= d
        if len(_PARSED) > 4096:
            _PARSED.clear()
        got = _PARSED[raw] = (dtype, shape, n)
    return got


def _first(g, src: int, t: int) -> memoryview:
    """The first message from `src` on `t`: the header, with the data if it was small."""
    if g.channel.any_size_recv:
        return g.channel.recv_message(src, t, g.timeout)
    header = np.empty(_HEADER, np.uint8)
    g.channel.recv(header, src, t, g.timeout)
    return header.data


def _p2p_args(peer, tag, what, group):
    g = resolve_group(group)
    if peer is None:
        raise ValueError(f"{what}: a destination rank is required (got None)")
    if g is None or peer not in g.ranks:
        raise ValueError(f"{what}: rank {peer} is not in the group")
    return g, g.p2p_tag(int(tag))


class _marked:
    """`with _marked(g, text)`: the call the hang watchdog reports while it waits."""

    __slots__ = ("g",)

    def __init__(self, g, text: str, peer: int | None = None):
        self.g = g
        g.p2p = (next(_calls), text, peer, time.time())

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.g.p2p = None


def send(tensor: Tensor, dst: int, group: GroupLike = None, tag: int = 0) -> None:
    """Send `tensor` to global rank `dst` (blocking until it may be reused)."""
    g, t = _p2p_args(dst, tag, "send", group)
    if g.channel.device_buffers:  # nccl: the bytes alone, as torch's NCCL sends them
        return g.channel.send(tensor, dst, t, g.timeout)
    with host_view(tensor, g, "send", writable=False) as arr, \
            _marked(g, f"send to rank {dst} (tag {tag})", dst):
        combine = _combines(g, arr.nbytes)
        g.channel.send(_header(arr, tensor, combine), dst, t, g.timeout)
        if not combine and arr.nbytes:
            g.channel.send(arr, dst, t, g.timeout)


def recv(tensor: Tensor = None, src: int | None = None, group: GroupLike = None,
         tag: int = 0) -> Any:
    """Receive from global rank `src` (None: whoever sends first): into `tensor`, returning
    the sender (torch's), or, called as recv(src) or recv(src=src), into a new array it
    returns (the 2017 proposal's)."""
    if isinstance(tensor, numbers.Integral) and not isinstance(tensor, bool):
        return _recv_new(int(tensor), group, tag)
    if tensor is None:  # recv(src=0) is the proposal's form, by keyword
        if src is None:
            raise TypeError("recv: nothing to receive into and no sender named (got tensor=None"
                            ", src=None); pass an array, or recv(src) for a new one")
        return _recv_new(src, group, tag)
    if src is None:
        src = _first_sender(group, tag)
    g, t = _p2p_args(src, tag, "recv", group)
    if g.channel.device_buffers:  # no header (see send): the array must match what was sent
        g.channel.recv(tensor, src, t, g.timeout)
        return src
    with host_view(tensor, g, "recv") as arr, \
            _marked(g, f"recv from rank {src} (tag {tag})", src):
        first = _first(g, src, t)
        dtype, shape, sent = _parse(first)
        if sent != arr.nbytes:
            raise ValueError(f"recv on rank {g.channel.rank}: rank {src} sent {dtype}{list(shape)}"
                             f" ({sent} bytes), this array holds {arr.nbytes} bytes "
                             f"({arr.dtype}{list(np.shape(tensor))}); receive into a matching "
                             f"array, or call recv({src}) for a new one")
        _data(g, first, arr, src, t)
    return src


def _data(g, first, arr: np.ndarray, src: int, t: int) -> None:
    """Fill `arr` from the first message, or from the message that follows it."""
    if not arr.nbytes:
        return  # nothing follows an empty array's header
    if len(first) > _HEADER:
        arr.view(np.uint8)[:] = np.frombuffer(first, np.uint8, offset=_HEADER)
    else:
        g.channel.recv(arr, src, t, g.timeout)


def _recv_new(src: int, group, tag: int) -> np.ndarray:
    """recv(src): a new array shaped and typed as the sender's."""
    g, t = _p2p_args(src, tag, "recv", group)
    if g.channel.device_buffers:
        raise ValueError(f"recv({src}): the {g.channel.name} channel sends no header to make "
                         "the array from; receive into one: recv(array, src)")
    with _marked(g, f"recv from rank {src} (tag {tag})", src):
        first = _first(g, src, t)
        dtype, shape, _ = _parse(first)
        out = np.empty(shape, dtype)
        _data(g, first, out.reshape(-1), src, t)
    return out


def _first_sender(group, tag: int) -> int:
    """The global rank whose message on `tag` came first; polls, as nothing can be posted
    for an unknown sender (a receive posted to each peer would take one from each)."""
    g = resolve_group(group)
    if g is None:
        raise ValueError("recv: this rank is not in the group")
    ch, t = g.channel, g.p2p_tag(int(tag))
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
    """The header's and the data's channel Works of one isend/irecv, as one; then after()."""

    __slots__ = ("after", "keep", "works")

    def __init__(self, works, keep=None, after=None):
        self.works, self.keep, self.after = works, keep, after  # keep: buffers in flight

    def wait(self, timeout: float | None = None) -> None:
        for w in self.works:
            w.wait(timeout)
        if self.after is not None:
            self.after()
            self.after = None

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


def isend(tensor: Tensor, dst: int, group: GroupLike = None, tag: int = 0) -> Work:
    """Start sending `tensor` to `dst`; do not modify it before Work.wait()."""
    g, t = _p2p_args(dst, tag, "isend", group)
    if g.channel.device_buffers:
        return Work(work=g.channel.isend(tensor, dst, t, g.timeout))
    arr = as_flat(tensor, "isend", writable=False)
    combine = _combines(g, arr.nbytes)
    first = _header(arr, tensor, combine)
    works = [g.channel.isend(first, dst, t, g.timeout)]
    if not combine and arr.nbytes:
        works.append(g.channel.isend(arr, dst, t, g.timeout))
    return Work(work=_Pair(works, keep=first))


def irecv(tensor: Tensor, src: int | None = None, group: GroupLike = None,
          tag: int = 0) -> Work:
    """Start receiving into `tensor` from `src` (None: the first sender); read it after
    Work.wait(), and the sender from Work.source_rank()."""
    if src is None:  # nothing can be posted for an unknown sender: a thread waits for it
        as_flat(tensor, "irecv")
        with _init_lock:
            if _state.any_source is None:
                _state.any_source = ThreadPoolExecutor(1, thread_name_prefix="mwrt-any-source")
        return Work(future=_state.any_source.submit(recv, tensor, None, group, tag))
    g, t = _p2p_args(src, tag, "irecv", group)
    if g.channel.device_buffers:
        return Work(work=g.channel.irecv(tensor, src, t, g.timeout), source=src)
    arr = as_flat(tensor, "irecv")
    if _combines(g, arr.nbytes):  # the sender, sending this size, sent one message
        first = np.empty(_HEADER + arr.nbytes, np.uint8)
        return Work(work=_Pair([g.channel.irecv(first, src, t, g.timeout)], first,
                               lambda: _data(g, first, arr, src, t)), source=src)
    header = np.empty(_HEADER, np.uint8)  # posted first: messages on a tag keep their order
    return Work(work=_Pair([g.channel.irecv(header, src, t, g.timeout),
                            g.channel.irecv(arr, src, t, g.timeout)], header), source=src)


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

"""Where new tensors go: `with mwrt.node(i)`, `device=`, and the current stream (thread-local)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..arrays import HOST
from .cluster import current

_state = threading.local()


@dataclass(frozen=True)
class Device:
    """A place for tensors, as the Array API names one (`t.device`): `node`'s `device`
    (-1: its host memory, 0.. its GPUs)."""

    node: int
    device: int = HOST

    def __repr__(self) -> str:
        return f"mwrt.Device(node={self.node}, device={self.device})"


def _stack(name: str) -> list:
    stack = getattr(_state, name, None)
    if stack is None:
        stack = []
        setattr(_state, name, stack)
    return stack


def current_node() -> int:
    """The node new tensors are created on (0 unless inside `with mwrt.node(i)`)."""
    stack = _stack("nodes")
    return stack[-1] if stack else 0


def current_device() -> int:
    """The device new tensors are created on (host memory, -1, unless set)."""
    stack = _stack("devices")
    return stack[-1] if stack else HOST


@contextlib.contextmanager
def node(index: int, device: int | None = None) -> Iterator[None]:
    """Create new tensors on node `index` (and `device`, if given) inside this block."""
    current().node(index)  # validates the index now, not at the first op
    nodes, devices = _stack("nodes"), _stack("devices")
    nodes.append(index)
    if device is not None:
        devices.append(device)
    try:
        yield
    finally:
        nodes.pop()
        if device is not None:
            devices.pop()


@contextlib.contextmanager
def device(index: int) -> Iterator[None]:
    """Create new tensors on `index` (-1 = host memory) of the current node inside this block."""
    devices = _stack("devices")
    devices.append(index)
    try:
        yield
    finally:
        devices.pop()


def stream_stack() -> Sequence:
    """This thread's streams set with `with mwrt.stream(s)`, innermost last."""
    return _stack("streams") if _OPEN_STREAM_BLOCKS[0] else ()


@contextlib.contextmanager
def chosen_stream(s) -> Iterator[None]:
    """Push stream `s` on this thread's stack inside this block (mwrt.stream's)."""
    stack = _stack("streams")
    stack.append(s)
    with _COUNTING:  # (+= is a read and a write: two threads' blocks could lose one)
        _OPEN_STREAM_BLOCKS[0] += 1
    try:
        yield
    finally:
        with _COUNTING:
            _OPEN_STREAM_BLOCKS[0] -= 1
        stack.pop()


# `with mwrt.stream` blocks open in any thread: while none is, stream_for reads no
# threading.local (0.5 us an attribute, on every op); a plain list, as sites._PINNED is.
_OPEN_STREAM_BLOCKS = [0]
_COUNTING = threading.Lock()


def stream_for(node_index: int, device_index: int) -> int:
    """The stream id ops on (node, device) go to: the innermost `with mwrt.stream(s)` there.

    Nested stream blocks for different nodes all apply, so one collective can run on a
    chosen stream of every node it spans.
    """
    if not _OPEN_STREAM_BLOCKS[0]:
        return device_index
    blocks = getattr(_state, "streams", None)  # (_stack's, without making one)
    if blocks:
        for s in reversed(blocks):
            if s.node == node_index and s.device == device_index:
                return s.id
    return device_index  # the default stream of a device has the device's number as id

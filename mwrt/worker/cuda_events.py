"""Events of GPU streams are CUDA's: recorded without waiting, waited on by the GPU.

A record on a GPU stream records a `cuda.Event` on its CuPy stream and returns: the stream's
executor thread never waits for the GPU. A GPU stream of this worker that waits on it calls
`stream.wait_event` (the GPU holds the later kernels back, the thread goes on). Whoever
needs the event as a fact on the host (a host stream, another node, the master's query or
synchronize) gets it once the GPU passed it: a watcher thread per recording stream waits
on the CUDA event and fires the mwrt event then, stamped with the GPU's own clock (the
CUDA elapsed time since a reference event of the device, added to the host time of that
reference), so `elapsed_time` between two events of one GPU is CUDA's.

Implicit events (the master's automatic ordering) pair each record with one wait: their
CUDA events queue per event id, and the wait takes the oldest.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
import weakref

from ..protocol import wire

_lock = threading.Lock()
_implicit: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # session -> queues
_watchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # executor -> Watcher
_clocks: dict = {}  # (GPU module, device) -> (reference event, its host time)


def record(ex, cmd) -> None:
    """Record event `cmd.event` on GPU stream `ex` without waiting for the GPU."""
    _clock(ex.xp, ex.device)  # the device's reference comes before any event it times
    event = ex.cuda_stream.record(ex.xp.cuda.Event())
    session = ex.session
    if cmd.event <= wire.IMPLICIT_EVENTS:
        with _lock:
            queues = _implicit.setdefault(session, collections.defaultdict(collections.deque))
            queues[cmd.event].append(event)
        session.implicit.record(cmd.event)
        return
    state = session.event(cmd.event)
    state.cuda = event
    state.recorded.set()  # a GPU stream of this worker may wait on it from now
    watcher = _watchers.get(ex)
    if watcher is None:
        watcher = _watchers[ex] = Watcher(ex)
    watcher.watch(cmd.event, event)


def wait_implicit(ex, event_id: int) -> None:
    """After the implicit wait: hold this stream on the record's CUDA event, if it had one
    (on the GPU for a GPU stream; on this thread for a host stream, which reads the data)."""
    if ex.session not in _implicit:  # no GPU stream of this session recorded one
        return
    with _lock:
        queues = _implicit.get(ex.session, {})
        pending = queues.get(event_id)
        event = pending.popleft() if pending else None
        if pending is not None and not pending:
            del queues[event_id]
    if event is not None:
        _hold(ex, event)


def wait_local(ex, state) -> None:
    """Hold GPU stream `ex` on the event a GPU stream of this worker recorded, if it was one
    (recorded on a host stream, or another node's, it has fired already)."""
    if state.cuda is not None:
        _hold(ex, state.cuda)


def _hold(ex, event) -> None:
    if ex.device >= 0:
        ex.cuda_stream.wait_event(event)  # CUDA's cross-stream (and cross-device) wait
    else:
        event.synchronize()


class Watcher:
    """Fires a GPU stream's recorded events once the GPU passed them, in record order."""

    def __init__(self, ex):
        self.ex = ex
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True,
                         name=f"mwrt-events-{ex.session.node}-{ex.id}").start()

    def watch(self, event_id: int, event) -> None:
        self.queue.put((event_id, event))

    def _run(self) -> None:
        ex = self.ex
        sock = ex.session.daemon.reply_socket()  # zmq sockets are one thread's each

        def send(identity, message, frames=()):
            wire.send(sock, identity, message, frames)
        try:
            while not (ex.stopped or ex.session.closed):
                try:
                    event_id, event = self.queue.get(timeout=0.5)
                except queue.Empty:
                    continue
                event.synchronize()
                ex.session.fire_event(event_id, gpu_time(ex, event), send)
        finally:
            sock.close(linger=1000)


def gpu_time(ex, event) -> float:
    """The host time at which the GPU passed `event`, by the device's own clock."""
    xp = ex.xp
    reference, start = _clock(xp, ex.device)
    with xp.cuda.Device(ex.device):
        return start + xp.cuda.get_elapsed_time(reference, event) / 1000.0


def _clock(xp, device: int) -> tuple:
    """The device's reference event and the host time it passed (made once per process)."""
    key = (xp, device)
    clock = _clocks.get(key)
    if clock is None:
        with _lock, xp.cuda.Device(device):
            clock = _clocks.get(key)
            if clock is None:
                reference = xp.cuda.Event()
                reference.record(xp.cuda.Stream.null)
                reference.synchronize()
                clock = _clocks[key] = (reference, time.time())
    return clock

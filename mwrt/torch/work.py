"""The torch Work of the "mwrt" backend: a running mwrt call, and the torch Future torch
chains on it.

A torch Future runs its callbacks on the thread that completes it. Completing them on the
group's collective thread would run a callback there that may start another collective
and wait for it (DDP's PowerSGD hook does), and that collective queues behind the
callback for ever. So futures are completed on a pool of completion threads, of which a
new one starts when every other is inside a callback; or by the thread that calls
`wait()`, whichever comes first, so that `get_future().value()` right after `wait()`
always has the value.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta

import torch
import torch.distributed as dist

_COMPLETERS = 32  # callbacks nested this deep (a callback waiting on a callback) still run
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _completers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_COMPLETERS, thread_name_prefix="mwrt-torch-done")
        return _pool


def seconds(timeout, default: float) -> float:
    """torch's timeout (a timedelta, seconds, or 0/None for "none given") in seconds."""
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    return float(value) if value else default


class MwrtWork(dist.Work):
    """A torch Work over a running mwrt call (a concurrent Future): wait() raises mwrt's
    error; get_future() is the torch Future that DDP's comm hooks chain on, completed with
    `value` (what gloo's future holds for the same call)."""

    def __init__(self, future, value, timeout: float, what: str, withdraw=None):
        super().__init__()
        self.future, self.value, self.timeout, self.what = future, value, timeout, what
        self.withdraw = withdraw  # a receive's: False if it is being filled right now
        self.torch_future = torch.futures.Future()
        self._lock, self._claimed = threading.Lock(), False
        future.add_done_callback(self._done)  # at once if it is done already

    def _done(self, _future) -> None:
        """The call ended (on the thread that ran it): complete the torch future elsewhere."""
        _completers().submit(self._complete, False)

    def _complete(self, wait_done: bool) -> None:
        """Complete the torch future, once; or, where another thread is doing it and
        `wait_done`, wait until it is completed (its callbacks may still be running)."""
        with self._lock:
            mine, self._claimed = not self._claimed, True
        if mine:
            exc = self.future.exception()
            if exc is None:
                self.torch_future.set_result(self.value)
            else:
                self.torch_future.set_exception(exc)
        elif wait_done:
            with contextlib.suppress(Exception):  # the call's error: wait() raises it
                self.torch_future.wait()  # returns once the value is set, before callbacks end

    def wait(self, timeout=None) -> bool:
        """Block until done (torch's timeout, else the group's) and raise the call's error."""
        limit = seconds(timeout, self.timeout)
        try:
            self.future.result(timeout=limit)
        except FutureTimeout:
            if self.withdraw is None:
                raise TimeoutError(f"mwrt work: {self.what} not done after {limit} s; a peer "
                                   "may be slow or gone") from None
            if self.withdraw():
                raise TimeoutError(f"mwrt work: {self.what}: no message within {limit} s; "
                                   "the receive is withdrawn (a later message goes to the "
                                   "next receive)") from None
            self.future.result(timeout=limit)  # it was being filled as we withdrew it
        self._complete(True)
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def is_success(self) -> bool:
        return self.future.done() and self.future.exception() is None

    def exception(self):
        return self.future.exception() if self.future.done() else None

    def result(self):
        """The tensors of the call, as gloo's Work.result() returns them."""
        self.wait()
        return self.value if isinstance(self.value, list) else [self.value]

    def source_rank(self) -> int:
        """The group rank a receive got its message from (recv without src)."""
        self.wait()
        return int(self.future.result())

    _source_rank = source_rank

    def get_future(self):
        return self.torch_future


def done_work(value, what: str) -> MwrtWork:
    """A Work that is already complete (a call with nothing to do)."""
    future: Future = Future()
    future.set_result(None)
    return MwrtWork(future, value, 1.0, what)

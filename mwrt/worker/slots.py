"""Turns at running ops: a daemon's stream threads share a few slots, round-robin by session.

Every stream is a thread, and the daemon's socket thread serves every master. A master
that floods eight streams with long ops would otherwise have eight threads contending for
the CPUs and the GIL with the socket thread and the other masters' streams: the GIL goes
to one waiting thread at random every few milliseconds, so another master's Hello or small
op waited until the flood had drained. So an op (a `Call` on a host stream, a `remote()`
function on any) runs only in one of MWRT_WORKER_SLOTS slots (the CPUs by default). A slot
that frees goes to the next session in turn that waits for one, then that session moves
to the back: another master waits for at most one op per session ahead of it, never for a
flood. An op that waited MWRT_TURN_WAIT seconds runs anyway (a user function that never
returns must not hold the others forever); one that runs inline on the socket thread is
short by construction and takes no turn. Commands that wait (events, transfers,
collectives) hold no slot while they wait, so the slots never order one stream behind
another.
"""

from __future__ import annotations

import threading
from collections import deque


class OpSlots:
    """Slots for running ops, handed round-robin to the sessions that wait for one."""

    def __init__(self, slots: int, wait: float):
        self.slots, self.wait = max(slots, 1), wait
        self.running = 0  # slots taken, over `slots` by the ops that stopped waiting
        self.overdue = 0  # ops that ran without a turn after waiting `wait` seconds
        self._waiting: dict[object, deque[threading.Event]] = {}  # session -> its waiters
        self._order: deque = deque()  # sessions with waiters, the next to be served first
        self._lock = threading.Lock()

    def take(self, session) -> None:
        """Wait for a slot for one of `session`'s ops (at most `wait` seconds)."""
        with self._lock:
            if self.running < self.slots and not self._order:
                self.running += 1
                return
            granted = threading.Event()
            if session not in self._waiting:
                self._waiting[session] = deque()
                self._order.append(session)
            self._waiting[session].append(granted)
        if granted.wait(self.wait):
            return
        with self._lock:
            if granted.is_set():  # handed over as the wait ended
                return
            mine = self._waiting[session]
            mine.remove(granted)
            if not mine:
                del self._waiting[session]
                self._order.remove(session)
            self.running += 1
            self.overdue += 1

    def give(self) -> None:
        """Free a slot: to the next session in turn that waits, else back to the pool."""
        with self._lock:
            if self.running > self.slots or not self._order:
                self.running -= 1
                return
            session = self._order.popleft()
            mine = self._waiting[session]
            granted = mine.popleft()
            if mine:
                self._order.append(session)  # its next op waits behind the other sessions
            else:
                del self._waiting[session]
            granted.set()  # the slot passes straight on: nobody can take it in between

    def release(self, session) -> None:
        """Wake `session`'s waiting ops at once, over the bound: its session ended."""
        with self._lock:
            mine = self._waiting.pop(session, ())
            if mine:
                self._order.remove(session)
            for granted in mine:
                self.running += 1
                granted.set()

    def stats(self) -> dict:
        """Slots, how many are taken, sessions waiting, and ops that ran without a turn."""
        with self._lock:
            return {"slots": self.slots, "slots_taken": self.running,
                    "sessions_waiting": len(self._order), "overdue": self.overdue}

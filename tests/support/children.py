"""Children as a user runs them: reachable by Ctrl-C, their output read line by line with a
timeout on every wait (a thread reads each pipe, so no line is ever stuck in a reader's
buffer while select() waits on the descriptor)."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time


def ctrl_c_reaches(group: bool = False):
    """A Popen preexec_fn: the child handles SIGINT as Python does (a shell that started the
    suite in the background made SIGINT ignored, and children inherit that); with `group`,
    a process group of its own, so a SIGINT to the group (a terminal's Ctrl-C) reaches it and
    what it starts, and not the tests."""
    def setup():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if group:
            os.setpgrp()
    return setup


class Lines:
    """The lines of `stream` (a text pipe), read on a thread of its own."""

    def __init__(self, stream):
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in iter(stream.readline, ""):
            self._queue.put(line)
        stream.close()  # here, where it is read: closed elsewhere it could fail a readline
        self._queue.put("")  # end of output

    def next(self, timeout: float = 60.0) -> str:
        """The next line ('' at the end of the output); AssertionError after `timeout` s."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output line within {timeout} s") from None

    def until(self, text: str, timeout: float = 120.0) -> str:
        """Skip lines up to the first containing `text`, within `timeout` seconds in all;
        AssertionError naming the lines skipped if the output ends or the time passes."""
        deadline, skipped = time.monotonic() + timeout, []
        while True:
            line = self.next(max(deadline - time.monotonic(), 0.0))
            if text in line:
                return line
            if not line:
                raise AssertionError(f"the output ended before a line with {text!r}: "
                                     f"{''.join(skipped)[-2000:]}")
            skipped.append(line)

    def rest(self, timeout: float = 30.0) -> str:
        """Every line left until the end of the output, within `timeout` seconds in all."""
        deadline, lines = time.monotonic() + timeout, []
        while True:
            line = self.next(max(deadline - time.monotonic(), 0.0))
            if not line:
                return "".join(lines)
            lines.append(line)

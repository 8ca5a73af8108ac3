"""Local worker daemons, started by init_master_worker() when no workers are named."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time

from ..procs import stop_processes

# The folder that holds the mwrt package (mwrt/master/local.py, three levels up).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class LocalWorker:
    """A daemon process on this machine, listening on a loopback port it picked."""

    def __init__(self, process: subprocess.Popen, address: str):
        self.process, self.address = process, address

    @classmethod
    def start(cls, timeout: float, key_file: str | None = None,
              env: dict | None = None) -> "LocalWorker":
        """Start `python -m mwrt.worker` on a free loopback port; wait for its address."""
        package_root = _PACKAGE_ROOT
        child_env = dict(os.environ, **(env or {}))
        # The child imports the same mwrt as this master, installed or not.
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, child_env.get("PYTHONPATH", "")) if p)
        command = [sys.executable, "-m", "mwrt.worker", "--listen", "127.0.0.1:0",
                   "--parent-pid", str(os.getpid())]
        if key_file is not None:
            command += ["--key-file", key_file]
        # A session of its own: a terminal's Ctrl-C is for the master, which then frees its
        # sessions and stops the daemon; reaching the daemon too, it made the master's exit
        # report each node lost. A master that dies anyway is seen by --parent-pid.
        process = None
        try:
            with _interrupt_held():  # inside Popen, it would leave a daemon nobody can stop
                process = subprocess.Popen(
                    command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=child_env,
                    text=True, start_new_session=True)
            line = _read_line(process, timeout)
        except BaseException:  # Ctrl-C while it starts: it is not in any list to stop yet
            if process is not None:
                stop_processes([process])
            raise
        prefix = "mwrt-worker: listening on "
        if not line.startswith(prefix):
            process.kill()
            process.wait()
            raise ConnectionError(f"local worker (pid {process.pid}): did not start within "
                                  f"{timeout} s (said {line.strip()!r}); see its stderr")
        return cls(process, line[len(prefix):].strip())

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
        stop_processes([self.process], timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()


@contextlib.contextmanager
def _interrupt_held():
    """Hold a Ctrl-C that comes during the block, and raise it (KeyboardInterrupt) after."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is None:  # None: a handler set outside Python
        yield  # only the main thread gets signals, and may set their handlers
        return
    held = []
    previous = signal.signal(signal.SIGINT, lambda *args: held.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held and callable(previous):
        previous(*held[0])  # Python's own handler raises KeyboardInterrupt


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.1)
        if ready:
            return process.stdout.readline()
        if process.poll() is not None:
            return f"(exited with code {process.returncode})"
    return "(no answer)"

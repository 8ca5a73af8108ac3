"""Local worker daemons, started by init_master_worker() when no workers are named, each
with a fresh key that only this master holds."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from .. import config
from ..procs import ctrl_c_held, runnable_per_core, stop_processes
from ..protocol import auth
from . import forked
from .progress import Progress

# The folder that holds the mwrt package (mwrt/master/local.py, three levels up).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class LocalWorker:
    """A daemon process on this machine, listening on a loopback port it picked, and on a
    Unix socket (`route`, where the master connects; the address where it has none)."""

    def __init__(self, process: subprocess.Popen | forked.Forked, address: str):
        self.process, self.address, self.route = process, address, address
        self.forwarder: threading.Thread | None = None  # forward_output's, which closes stdout

    @classmethod
    def start(cls, timeout: float, key_file: str | None = None,
              env: dict | None = None, node: int = 0) -> LocalWorker:
        """Start `python -m mwrt.worker` on a free loopback port, to be node `node`; wait
        for its address."""
        return start_many(1, timeout, key_file, env, first=node)[0]

    @classmethod
    def _spawn(cls, key_file: str | None, env: dict | None, timeout: float) -> LocalWorker:
        """The daemon's process, started; its address comes with its first line."""
        package_root = _PACKAGE_ROOT
        child_env = dict(os.environ, **(env or {}))
        # torch's threads, one per daemon unless told: the daemons and the master share the
        # host's cores (torchrun sets OMP_NUM_THREADS=1 for the same reason)
        child_env.setdefault("MWRT_TORCH_THREADS", "1")
        # The child imports the same mwrt as this master, installed or not.
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, child_env.get("PYTHONPATH", "")) if p)
        command = [sys.executable, "-m", "mwrt.worker", "--listen", "127.0.0.1:0",
                   "--parent-pid", str(os.getpid()), "--ipc"]
        if key_file is not None:
            command += ["--key-file", key_file]
        # A session of its own: a terminal's Ctrl-C is for the master, which then frees its
        # sessions and stops the daemon; reaching the daemon too, it made the master's exit
        # report each node lost. A master that dies anyway is seen by --parent-pid.
        # Forked by the zygote where it serves, which starts in its own session too.
        process = forked.spawn(command[3:], child_env, timeout) or subprocess.Popen(
            command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=child_env, text=True,
            start_new_session=True)
        return cls(process, "")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
        stop_all([self], timeout)


def stop_all(workers: list[LocalWorker], timeout: float = 5.0) -> None:
    """SIGTERM every one, then SIGKILL those not gone within `timeout` seconds: all at once
    (one after another, 32 daemons took 10 s to stop)."""
    stop_processes([w.process for w in workers], timeout)
    deadline = time.monotonic() + 1.0  # what they printed last still shows, within a second
    for worker in workers:
        if worker.forwarder is not None:
            worker.forwarder.join(max(0.0, deadline - time.monotonic()))
        elif worker.process.stdout is not None:
            worker.process.stdout.close()
        if worker.route.startswith("ipc://"):  # the daemon removes it, unless it was killed
            shutil.rmtree(os.path.dirname(worker.route.removeprefix("ipc://")), ignore_errors=True)


def start_many(count: int, timeout: float, key_file: str | None = None,
               env: dict | None = None, started=None, first: int = 0) -> list[LocalWorker]:
    """Start `count` daemons, to be nodes `first`, `first` + 1, ..., a few at a time
    (_starting_at_once), each given `timeout` seconds from its own start to say its address;
    `started(k)` counts those that did. What each prints next goes to this process's stdout
    (forward_output). A daemon that fails is named (its place in the count, pid, what it
    said), and every daemon started so far is stopped."""
    workers: list[LocalWorker] = []
    waiting: dict = {}  # stdout -> (worker, its place, its deadline)
    window = _starting_at_once()
    bound = timeout * _load_slack()
    try:
        while len(workers) < count or waiting:
            while len(workers) < count and len(waiting) < window:
                # A Ctrl-C inside Popen would leave a daemon nobody can stop: held until
                # the daemon is in the list that the handler below stops.
                with ctrl_c_held():
                    worker = LocalWorker._spawn(key_file, env, bound)
                    workers.append(worker)
                waiting[worker.process.stdout] = (worker, len(workers) - 1,
                                                  time.monotonic() + bound)
            ready, _, _ = select.select(list(waiting), [], [], 0.1)
            for stream in ready:
                worker, place, _ = waiting.pop(stream)
                worker.address, worker.route = _address(worker, stream.readline(), place,
                                                        count, bound)
                forward_output(worker, f"node {first + place}")
                if started is not None:
                    started(1)
            for stream, (worker, place, deadline) in list(waiting.items()):
                exited = worker.process.poll() is not None
                if exited or time.monotonic() > deadline:
                    del waiting[stream]
                    _address(worker, "" if exited else "(no answer)", place, count, bound)
    except BaseException:  # a failure, or Ctrl-C while they start: stop every one
        stop_all(workers)
        raise
    return workers


def _starting_at_once() -> int:
    """How many daemons start at once: their imports are CPU work, and 128 of them at once
    on 2 cores would each take longer than a start's timeout; a few per core keep every
    core busy and each start short."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(4, 4 * (cores or 1))


def _load_slack() -> float:
    """How much longer than on an idle machine a start may take: runnable_per_core(), at
    most 6. A daemon's start is imports, CPU work that a busy machine slices thin (at load
    20 on 2 cores one took over 10 s); a fixed bound took such a machine's live daemons for
    hung ones."""
    return min(6.0, runnable_per_core())


def _address(worker: LocalWorker, line: str, place: int, count: int,
             timeout: float) -> tuple[str, str]:
    """The tcp address in a daemon's first line and the one to connect to (its Unix socket
    if it gave one, else the same), or a ConnectionError naming the daemon."""
    prefix = "mwrt-worker: listening on "
    if line.startswith(prefix):
        address, *ipc = line[len(prefix):].split()
        return address, ipc[0] if ipc else address
    which = f"local worker {place} of {count}" if count > 1 else "local worker"
    if line == "" or worker.process.poll() is not None:  # its output ended: it exited
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(5.0)
        raise ConnectionError(f"{which} (pid {worker.process.pid}): exited with code "
                              f"{worker.process.returncode} before listening; see its stderr "
                              "above")
    raise ConnectionError(f"{which} (pid {worker.process.pid}): did not start within "
                          f"{timeout:.3g} s (the timeout scaled by the machine's load; said "
                          f"{line.strip()!r}); see its stderr above, or "
                          "raise the timeout (init_master_worker(timeout=...), "
                          "MWRT_CONNECT_TIMEOUT)")


def start_local_workers(count: int, timeout: float):
    """Start `count` daemons on loopback with a fresh key: (them, the master's key, theirs)."""
    worker_keys, master_keys = auth.generate_cluster_keys()
    with _key_file(worker_keys) as path, Progress(
            count if count >= 8 else 0, "starting local workers", "workers") as progress:
        local = start_many(count, timeout, path, local_spin_env(count), progress.update)
    return local, master_keys, worker_keys


def start_one_local_worker(worker_keys, timeout: float, count: int,
                           node: int = 0) -> LocalWorker:
    """One more local daemon with the session's worker key (a lost node `node`'s
    replacement)."""
    with _key_file(worker_keys) as path:
        return LocalWorker.start(timeout, key_file=path, env=local_spin_env(count), node=node)


def forward_output(worker: LocalWorker, label: str) -> None:
    """Copy what `worker` prints from now on (a remote() function's print()) to this
    process's stdout, each line after `(label)`, as Ray shows its workers' prints: left
    unread, the pipe filled at 64 KiB and the daemon's next print stopped it for good. A
    thread per daemon, which closes the pipe when the daemon's end of it closes."""
    stream = worker.process.stdout
    if stream is None:
        return

    def run() -> None:
        try:
            for line in stream:
                _print_line(f"({label}) {line}")
        except (OSError, ValueError):  # not text, or closed: nothing more to show
            pass
        finally:
            with contextlib.suppress(OSError):
                stream.close()
    worker.forwarder = threading.Thread(target=run, name=f"mwrt-output-{label}", daemon=True)
    worker.forwarder.start()


def _print_line(text: str) -> None:
    """Write a line to sys.stdout as it is now (a notebook's, a redirected one)."""
    out = sys.stdout
    if out is None:
        return
    with contextlib.suppress(OSError, ValueError):  # closed, at the interpreter's exit
        out.write(text if text.endswith("\n") else text + "\n")
        out.flush()


@contextlib.contextmanager
def _key_file(worker_keys):
    """The workers' key in a file of a private folder, removed once they have read it."""
    with tempfile.TemporaryDirectory(prefix="mwrt-keys-") as directory:
        path = os.path.join(directory, "worker.key")
        worker_keys.save(path)
        yield path


def local_spin_env(count: int) -> dict:
    """Local daemons spin between messages (MWRT_WORKER_SPIN_US) only when each has a core
    of its own: on fewer cores the spins take turns with the very work they wait for (8
    daemons on 2 cores: a fan-out round 1.0 -> 1.3 ms). The master's wait shares a core
    with them, as its spin and theirs back off when they miss. A value the user set is
    kept."""
    name = config.SETTINGS["worker_spin_us"].env
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if name in os.environ or count <= (cores or 1):
        return {}
    return {name: "0"}

"""Local worker daemons forked by a zygote (`python -m mwrt.worker.zygote`): one process per
master that has imported the daemon's modules, so each daemon starts in a fork, ~0.03 CPU-s,
where a fresh interpreter's imports take ~0.3 (init_master_worker, replace_node, a test suite's
hundreds of daemons). A forked daemon is the zygote's child, not this process's: `Forked`
waits for it and signals it through a pidfd, and learns its exit status from the zygote."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

from .. import config
from ..procs import deaf_to_ctrl_c

UNKNOWN_EXIT = 255  # a daemon's exit status once its zygote is gone (as ssh gives one it lost)
_STATUS_WAIT = 5.0  # the zygote writes a daemon's status as soon as it has reaped it
_FIRST_ANSWER = 30.0  # s: a zygote's imports, on a loaded machine
# Settings a daemon reads after its fork (the zygote reads none), and pytest's per-test name:
# a zygote serves every environment that differs from its own only in these.
_PER_FORK = ("MWRT_", "PYTEST_CURRENT_TEST")


class Forked:
    """A daemon the zygote forked, with the part of subprocess.Popen's API that local workers
    use: pid, args, stdout, returncode, poll(), wait(), send_signal(), terminate(), kill()."""

    def __init__(self, pid: int, pidfd: int, status: int, stdout, args: list[str]):
        self.pid, self.args, self.stdout = pid, args, stdout
        self.returncode: int | None = None
        self._pidfd, self._status = pidfd, status

    def poll(self) -> int | None:
        if self.returncode is None and _readable(self._pidfd, 0.0):
            self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not _readable(self._pidfd, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._collect()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # the pidfd is this daemon's even after its pid is reused
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _collect(self) -> None:
        """The exited daemon's status, from the zygote that reaps it."""
        status = os.read(self._status, 32) if _readable(self._status, _STATUS_WAIT) else b""
        os.close(self._status)
        os.close(self._pidfd)
        self.returncode = int(status) if status else UNKNOWN_EXIT

    def __del__(self) -> None:
        if self.returncode is None:  # never waited for: its descriptors, not the daemon
            os.close(self._status)
            os.close(self._pidfd)


def _readable(fd: int, timeout: float | None) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


class Zygote:
    """The zygote process and this master's end of its socket."""

    def __init__(self, env: dict[str, str]):
        self.key = _key(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mwrt.worker.zygote", "--socket-fd", str(theirs.fileno()),
                 "--parent-pid", str(os.getpid())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                env={k: v for k, v in env.items() if not k.startswith("MWRT_")},
                start_new_session=True)  # a terminal's Ctrl-C is for the master
        self.socket = ours

    def fork(self, args: list[str], env: dict[str, str], timeout: float) -> Forked:
        """A daemon `mwrt-worker ARGS` with `env`, its stdout a pipe to us; OSError if the
        zygote did not answer within `timeout` seconds (the first waits for its imports)."""
        stdout, stdout_end = os.pipe()
        status, status_end = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            request = json.dumps({"args": args, "env": env, "cwd": os.getcwd()}).encode()
            self.socket.settimeout(timeout)
            socket.send_fds(self.socket, [request], [stdin, stdout_end, 2, status_end])
            reply, fds, _, _ = socket.recv_fds(self.socket, 64, 1)
            if not reply or len(fds) != 1:
                raise ConnectionError(f"local worker zygote (pid {self.process.pid}): exited "
                                      f"or answered without a process (got {reply!r})")
        except BaseException:
            os.close(stdout)
            os.close(status)
            raise
        finally:
            for fd in (stdin, stdout_end, status_end):
                os.close(fd)
        return Forked(int(reply), fds[0], status, os.fdopen(stdout, "r"),
                      [sys.executable, "-m", "mwrt.worker", *args])

    def close(self) -> None:
        """Close its socket, which ends it; its daemons go on."""
        self.socket.close()
        try:
            self.process.wait(_STATUS_WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(_STATUS_WAIT)


def _key(env: dict[str, str]) -> tuple:
    """What a zygote's imports may have read of `env`: all of it but _PER_FORK's."""
    return tuple(sorted((k, v) for k, v in env.items() if not k.startswith(_PER_FORK)))


_lock = threading.Lock()
_zygotes: dict[tuple, Zygote] = {}  # by the environment they serve, the newest last
_MAX_ZYGOTES = 4  # environments in use at once (a closed one's daemons live on, unwatched)
_failed = False  # a zygote failed here once: fresh processes from then on


def spawn(args: list[str], env: dict[str, str], timeout: float) -> Forked | None:
    """A daemon forked with `args` and `env`, or None where no zygote serves (off by
    MWRT_FORK_LOCAL_WORKERS=0, no pidfds, or one failed): the caller starts a fresh one."""
    global _failed
    if _failed or not config.get("fork_local_workers") or not hasattr(os, "pidfd_open"):
        return None
    key = _key(env)
    with _lock:
        try:
            if key not in _zygotes:
                if len(_zygotes) >= _MAX_ZYGOTES:
                    _drop(next(iter(_zygotes)))  # the oldest
                _zygotes[key] = Zygote(env)
            # Its first answer waits for its imports, which a daemon's start bound may not
            # allow for (a daemon that misses its own bound is named by the caller).
            return _zygotes[key].fork(args, env, max(timeout, _FIRST_ANSWER))
        except OSError:  # it died, timed out or cannot fork: not worth a second try
            _failed = True
            _drop(key)
            return None
        except BaseException:  # an interrupt (not held off this thread): its answer may
            _drop(key)  # be left unread, for the next daemon to take: that zygote is done
            raise


def _drop(key: tuple) -> None:
    """Close and forget the zygote for `key`, if there is one (under _lock)."""
    zygote = _zygotes.pop(key, None)
    if zygote is not None:
        zygote.close()


@atexit.register  # before cluster's shutdown at exit: run after it, the daemons stopped
def _close_zygotes() -> None:
    """At exit, end the zygotes (which would see this process gone anyway) and reap them,
    deaf to a second Ctrl-C as shutdown() is there."""
    with deaf_to_ctrl_c():
        while _zygotes:
            _zygotes.popitem()[1].close()


def _forget_in_child() -> None:
    """In a child of os.fork(): the zygotes are the parent's (a daemon the child asked of one
    raced the parent's requests on its socket), and so is the lock, which may have been held;
    the child starts a zygote of its own if it starts daemons."""
    global _lock, _zygotes
    _lock, _zygotes = threading.Lock(), {}  # the copies of the sockets close with the dict


os.register_at_fork(after_in_child=_forget_in_child)


def zygote_pids() -> set[int]:
    """The pids of this process's zygotes (its forked daemons are their children)."""
    return {zygote.process.pid for zygote in list(_zygotes.values())}

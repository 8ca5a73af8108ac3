"""`python -m mwrt.worker.zygote --socket-fd FD --parent-pid PID`: a process that has imported
the daemon's modules and forks each local worker daemon a master asks for (mwrt.master.forked),
so a daemon starts in a fork, not in a fresh interpreter's imports (~0.03 CPU-s against ~0.3).

A request on the socket FD (a SOCK_SEQPACKET pair's end) is one JSON message, the daemon's
arguments, environment and folder, with four descriptors: its stdin, stdout, stderr and a pipe
for its exit status. The reply is the daemon's pid with a pidfd of it, which lets the master
wait for and signal a process that is not its child. The zygote reaps each daemon and writes
its exit status into that pipe. It exits when the master's end closes; its daemons go on (each
watches the master by its own --parent-pid). Its command line, which its daemons show too,
names the master, and each sets its process name (`ps -o comm`) to mwrt-worker."""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys
import warnings

_MAX_REQUEST = 1 << 20  # arguments and an environment


def main(fd: int) -> None:
    """Serve fork requests on `fd` until the master's end closes."""
    master = socket.socket(fileno=fd)
    _name_process("mwrt-zygote")
    _preload()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *args: None)  # a handler, so the wake-up fd hears it
    status_pipes: dict[int, int] = {}  # daemon pid -> the write end of its status pipe
    while True:
        ready, _, _ = select.select([fd, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 512)
            _reap(status_pipes)
        if fd in ready:
            message, fds, _, _ = socket.recv_fds(master, _MAX_REQUEST, 4)
            if not message:
                return  # the master is gone or done
            inherited = (fd, wake_read, wake_write, *status_pipes.values())  # not a daemon's
            pid = _fork(json.loads(message), fds, master, inherited)
            status_pipes[pid] = fds[3]
            for each in fds[:3]:
                os.close(each)
            pidfd = os.pidfd_open(pid)  # before any reap: the pid is still this daemon's
            socket.send_fds(master, [str(pid).encode()], [pidfd])
            os.close(pidfd)


def _preload() -> None:
    """Import what every daemon imports at its start, and freeze it (its pages stay shared)."""
    # A fork with BLAS threads alive is safe (OpenBLAS stops them around fork); Python
    # 3.12+ warns of any threads.
    warnings.filterwarnings("ignore", message=".*multi-threaded.*fork", category=DeprecationWarning)
    from . import __main__ as entry  # noqa: F401
    from . import daemon  # noqa: F401  (its routes import every handler)

    gc.collect()
    gc.freeze()


def _reap(status_pipes: dict[int, int]) -> None:
    """Collect every exited daemon; write each one's exit status to its master."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        pipe = status_pipes.pop(pid, None)
        if pipe is not None:
            try:
                os.write(pipe, str(os.waitstatus_to_exitcode(status)).encode())
            except OSError:  # the master stopped waiting for it
                pass
            os.close(pipe)


def _fork(request: dict, fds: list[int], master: socket.socket, close: tuple[int, ...]) -> int:
    """Fork a daemon for `request`. In the child this raises SystemExit with the daemon's
    exit code, which ends it as a fresh process ends: its threads joined, atexit run."""
    pid = os.fork()
    if pid:
        return pid
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    master.detach()  # the zygote's socket: closed below, never again as the stack unwinds
    for each in close:
        os.close(each)
    raise SystemExit(_run_daemon(request, fds))


def _run_daemon(request: dict, fds: list[int]) -> int:
    """In the forked child: the master's session, descriptors, settings and folder, then
    mwrt-worker's main with the request's arguments."""
    os.setsid()  # as start_new_session: a terminal's Ctrl-C is the master's alone
    _name_process("mwrt-worker")
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])  # the MWRT_* settings are read from here on
    os.chdir(request["cwd"])
    import numpy

    numpy.random.seed()  # each daemon its own stream, not a copy of the zygote's
    from .__main__ import main as worker_main

    sys.argv = ["mwrt-worker", *request["args"]]
    return worker_main(request["args"])


def _name_process(name: str) -> None:
    """The name `ps -o comm` and top show (the command line stays the zygote's)."""
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name)
    except OSError:  # no /proc here: the name is only a courtesy
        pass


if __name__ == "__main__":
    main(int(sys.argv[sys.argv.index("--socket-fd") + 1]))

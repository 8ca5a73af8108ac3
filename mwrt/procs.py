"""Local processes: whether one still runs (to name dead ranks and reap what they left), and
stopping the ones we started."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time


def process_alive(pid: int) -> bool:
    """True if process `pid` runs on this host; a zombie (exited, not yet reaped) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc: assume alive rather than accuse


def runnable_per_core() -> float:
    """The processes that want a core, per core (the 1-minute load average), at least 1: 1 on
    an idle machine, 10 at load 20 on 2 cores; 1 where the platform has no load average."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def stop_processes(procs, grace: float = 3.0) -> None:
    """SIGTERM every process we started that still runs (subprocess.Popen, one like it, or
    multiprocessing.Process), then SIGKILL those not gone within `grace` seconds."""
    running = [p for p in procs if _running(p)]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in running:
        if not _wait(p, max(0.0, deadline - time.monotonic())):
            p.kill()
            _wait(p, grace)


def _running(p) -> bool:
    return p.poll() is None if hasattr(p, "poll") else p.is_alive()


def _wait(p, timeout: float) -> bool:
    """Wait up to `timeout` seconds for `p` to exit; True if it did."""
    if hasattr(p, "poll"):  # a Popen, or a forked daemon (mwrt.master.forked) like one
        deadline = time.monotonic() + timeout
        if isinstance(p, subprocess.Popen):  # a forked daemon's own wait is woken by a pidfd
            _until_exit(p.pid, timeout)
        try:
            p.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            return False
        return True
    p.join(timeout)
    return not p.is_alive()


def _until_exit(pid: int, timeout: float) -> None:
    """Return once child `pid` exits, or after `timeout` seconds: woken by its exit (a pidfd,
    Linux 5.3+), where Popen.wait(timeout) looks with sleeps of up to 50 ms in between (on
    average ~15 ms late to each daemon's stop)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds here, or it is reaped already
        return
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


@contextlib.contextmanager
def deaf_to_ctrl_c(heard: threading.Event | None = None):
    """Ignore SIGINT during the block (an exit handler's: a second Ctrl-C after the one that
    ended the script cut it short with a traceback), or only set `heard` on one; only the
    main thread sets handlers."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.SIG_IGN if heard is None else (lambda *args: heard.set())
    previous = signal.signal(signal.SIGINT, handler) if main else None
    try:
        yield
    finally:
        if main and previous is not None:  # None: a handler not set from Python
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def ctrl_c_held():
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


def interrupt_outside_finalizers() -> None:
    """Make Python's Ctrl-C handler (if it is this process's) deliver a KeyboardInterrupt
    that lands in a finalizer (a __del__, such as a handle's; a weakref callback, such as
    importlib's module locks) once it has returned: Python prints an exception raised
    there as 'Exception ignored' and drops it, and the program ran on as if no Ctrl-C had
    come. Main thread only, as only it gets signals; undone by restore_interrupt()."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, interrupt_handler)


def restore_interrupt() -> None:
    """Python's own Ctrl-C handler again, where interrupt_outside_finalizers() set one."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is interrupt_handler):
        signal.signal(signal.SIGINT, signal.default_int_handler)


_AGAIN: list = []  # a Ctrl-C held back, to be sent again (interrupt_handler)
_DEFERRED: set = set()  # code objects a Ctrl-C must not land in (defer_interrupts)


def defer_interrupts(*functions) -> None:
    """Hold back a Ctrl-C that lands in one of `functions` (not in what they call) as one
    that lands in a finalizer is: they keep a count a KeyboardInterrupt must not cut."""
    _DEFERRED.update(f.__code__ for f in functions)


def interrupt_handler(signum, frame) -> None:
    """Python's KeyboardInterrupt, sent again a moment later if it lands in a finalizer or
    in a function of defer_interrupts()."""
    if _AGAIN:  # one sent again is on its way (a second Ctrl-C came as the first's timer
        return  # started, where it would have landed in threading's code)
    if (frame is not None and frame.f_code in _DEFERRED) or _in_finalizer(frame):
        _AGAIN.append(True)  # sent again, to land once the finalizer (or function) returned
        try:
            threading.Timer(_AGAIN_AFTER, _again).start()
            return
        except RuntimeError:  # no thread may start (the interpreter is ending): now, then
            _AGAIN.clear()
    raise KeyboardInterrupt


os.register_at_fork(after_in_child=_AGAIN.clear)  # (the timer that would clear it is not there)


def _again() -> None:
    """Send the Ctrl-C held back (interrupt_handler) again."""
    _AGAIN.clear()
    os.kill(os.getpid(), signal.SIGINT)


def _in_finalizer(frame) -> bool:
    """Whether `frame` runs inside a finalizer, where Python drops exceptions: any __del__
    on the stack, or importlib's module-lock callback (a weakref's, run as an import ends).
    (Not weakref.finalize's: at exit they run the exit handlers, which hear a Ctrl-C.)"""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (
                code.co_name == "cb" and code.co_filename == "<frozen importlib._bootstrap>"):
            return True
        frame = frame.f_back
    return False


_AGAIN_AFTER = 0.005  # seconds: a finalizer of mwrt's returns in microseconds

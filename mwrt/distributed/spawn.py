"""dist.spawn(fn, args, nprocs): run fn(rank, *args) in N processes, like mp.spawn.

Each child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, so `init_process_group()` (env://) works inside fn, and the job's secret
(MWRT_JOB_SECRET, made here unless one is set), which its store and channels ask for.
The first rank to fail stops the others (by pid), and the parent raises RankFailedError
naming the rank, with its traceback.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import cloudpickle

from ..errors import MwrtError
from ..procs import stop_processes
from ..store.launchers import free_port, job_secret_env, launched, rank_env
from . import process_groups


class RankFailedError(MwrtError):
    """A rank started by spawn or mwrt-launch failed; names the rank, exit code and output."""

    def __init__(self, message, *, rank=None, exitcode=None):
        self.rank, self.exitcode = rank, exitcode
        super().__init__(message)


def _entry(fn, rank, args, env, errors):
    os.environ.update(env)
    try:
        if type(fn) is bytes:  # cloudpickle's (see spawn)
            fn = cloudpickle.loads(fn)
        fn(rank, *args)
        process_groups.leave_at_exit()  # a forked child skips atexit handlers
    except BaseException:  # noqa: BLE001 - sent to the parent, then this rank exits 1
        errors.put((rank, traceback.format_exc()))  # SimpleQueue writes through: no flush
        os._exit(1)


def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1, join: bool = True,
          daemon: bool = False, start_method: str = "spawn",
          timeout: float | None = None) -> SpawnContext | None:
    """Run fn(rank, *args) in `nprocs` processes; raise RankFailedError if any rank fails."""
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"spawn: nprocs must be a positive int (got {nprocs!r})")
    if not callable(fn) or not isinstance(args, (tuple, list)):
        raise TypeError(f"spawn: expected a function and a tuple of its arguments after the "
                        f"rank (got {type(fn).__name__} and {type(args).__name__})")
    shipped = fn if start_method == "fork" else _shipped(fn)
    ctx = mp.get_context(start_method)
    errors = ctx.SimpleQueue()
    addr, port = "127.0.0.1", free_port()
    procs, secret = [], job_secret_env()
    for rank in range(nprocs):
        env = dict(rank_env(rank, nprocs, rank, nprocs, addr, port), **secret)
        # Every context has Process; typeshed's BaseContext (what a str method gives) omits it.
        process = ctx.Process  # type: ignore[attr-defined]
        p = process(target=_entry, args=(shipped, rank, args, env, errors), daemon=daemon)
        p.start()
        procs.append(p)
    context = SpawnContext(procs, errors)
    if not join:
        return context
    context.join(timeout)
    return None


class SpawnContext:
    """The processes of a spawn(join=False); join() waits and raises like spawn does."""

    def __init__(self, processes, errors):
        self.processes, self._errors = processes, errors  # the queue must outlive the children

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def join(self, timeout: float | None = None) -> None:
        """Wait for every rank; at the first failure stop the rest and raise RankFailedError."""
        _join(self.processes, self._errors, timeout)


def _join(procs, errors, timeout) -> None:
    """Wait for every process; at the first failure stop the rest and raise."""
    deadline = None if timeout is None else time.monotonic() + timeout
    alive = {p.sentinel: (rank, p) for rank, p in enumerate(procs)}
    try:
        while alive:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = mp.connection.wait(list(alive), timeout=left)
            if not ready:
                raise RankFailedError(f"spawn: ranks {sorted(r for r, _ in alive.values())} "
                                      f"still running after {timeout} s; stopped them")
            failed = {}
            for s in ready:
                rank, p = alive.pop(s)
                p.join()
                if p.exitcode != 0:
                    failed[rank] = p.exitcode
            if failed:
                raise _failed(failed, errors)
    finally:
        stop_processes([p for _, p in alive.values()])


def _failed(failed: dict[int, int], errors) -> RankFailedError:
    """The error naming the first of the `failed` ranks (rank -> exit code) to fail."""
    reports: dict[int, str] = {}
    while not errors.empty():
        r, tb = errors.get()
        reports.setdefault(r, tb)
    # Ranks that died together (one, then those that saw it go) are told apart by the
    # order of their reports: the first failure is reported before the others notice it.
    rank = next((r for r in reports if r in failed), min(failed))
    exitcode, tb = failed[rank], reports.get(rank)
    if exitcode is not None and exitcode < 0:
        how = f"was killed by signal {signal.Signals(-exitcode).name}"
    else:
        how = f"exited with code {exitcode}"
    text = f"spawn: rank {rank} {how}"
    text += f"\n### rank {rank} traceback:\n{tb.rstrip()}" if tb else " (no Python traceback)"
    return RankFailedError(text, rank=rank, exitcode=exitcode)


def _shipped(fn) -> bytes:
    """fn as cloudpickle's bytes, for a start method that imports nothing of this process: a
    function of a notebook, of `python -c` or of a script's __main__, a lambda or a closure
    reach the ranks by value (pickle's by-name reference failed in the ranks with "Can't get
    attribute 'main' on <module '__main__'>"). Its arguments go as multiprocessing sends
    them (a queue only so)."""
    try:
        return cloudpickle.dumps(fn)
    except Exception as exc:  # whatever cloudpickle refuses: named for the user
        where = getattr(fn, "__qualname__", None) or type(fn).__name__
        raise TypeError(f"spawn: {where} cannot be sent to the ranks ({type(exc).__name__}: "
                        f"{exc}); make locks, files and connections inside the "
                        "function") from exc


def _call_main(rank: int, *, main) -> None:
    main()


def run(main: Callable[[], Any], nprocs: int | None = None) -> None:
    """Run a script's main() as a rank: right here when a launcher started this process
    (mwrt-launch, torchrun, srun, mpirun), else in `nprocs` ranks started here (default
    $NPROC, else 2), each calling main() with the rank in its environment."""
    if launched():
        main()
        return
    count = nprocs if nprocs is not None else int(os.environ.get("NPROC", "2"))
    spawn(functools.partial(_call_main, main=main), nprocs=count)  # main goes with it

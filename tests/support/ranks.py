"""Run a function on every rank of a group: threads over inproc, processes over real channels."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import threading
import traceback

from mwrt import channels
from mwrt.collective.group import ProcessGroup
from mwrt.store import FileStore, HashStore, rendezvous

from . import machine


def available(name: str) -> bool:
    """True if channel `name` can be imported: a missing optional dependency skips its
    tests, while any other error in the channel's module fails them."""
    try:
        channels.get(name)
        return True
    except ImportError:
        return False


def run_ranks(backend: str, n: int, fn, *args, timeout: float | None = None,
              join: float | None = None, errors: bool = False, **group_kw) -> list:
    """Call fn(group, rank, *args) on n ranks; return the results, raise the first error.

    With errors=True, return each rank's result or exception instead of raising. The channel
    and group timeout is 5 s, and the wait for every rank 60 s, on a quiet machine, more under
    load (a forked rank may not even have run by then); a test that waits a timeout out on
    purpose gives its own.
    """
    timeout = machine.seconds(5, 60) if timeout is None else timeout
    join = machine.seconds(60, 600) if join is None else join
    if backend == "inproc":
        results, errs = _threads(n, fn, args, timeout, join, group_kw)
    else:
        results, errs = _processes(backend, n, fn, args, timeout, join, group_kw)
    if errors:
        return [e if e is not None else v for v, e in zip(results, errs)]
    for r, e in enumerate(errs):
        if e is not None:
            raise RuntimeError(f"rank {r} failed: {e}") from e
    return results


def _threads(n, fn, args, timeout, join, group_kw):
    store = HashStore(timeout=timeout)
    chans = [channels.create("inproc", r, n, store=store, timeout=timeout) for r in range(n)]
    results, errors = [None] * n, [None] * n

    def body(r):
        try:
            results[r] = fn(ProcessGroup(chans[r], store=store, **group_kw), r, *args)
        except BaseException as e:  # noqa: BLE001 - reported to the test below
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join)
    for c in chans:
        c.close()
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"ranks still running after {join} s")
    return results, errors


def _child(backend, n, r, path, fn, args, timeout, group_kw, queue):
    try:
        store = FileStore(path, n, timeout=timeout)
        peers = rendezvous(store, r, n, prefix="t", timeout=timeout)
        chan = channels.create(backend, r, n, store=store, prefix="t", timeout=timeout)
        try:
            group = ProcessGroup(chan, store=store, prefix="t", peers=peers, **group_kw)
            queue.put((r, "ok", fn(group, r, *args)))
        finally:
            chan.close()
            store.close()
    except BaseException as e:  # noqa: BLE001 - sent to the parent
        queue.put((r, "err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


STARTED: list[int] = []  # the pids of the ranks run_ranks forked, for tests that check leaks


def _processes(backend, n, fn, args, timeout, join, group_kw):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_child, args=(backend, n, r, path, fn, args, timeout,
                                                    group_kw, queue)) for r in range(n)]
        for p in procs:
            p.start()
            STARTED.append(p.pid)
        results, errors = [None] * n, [None] * n
        try:
            for _ in range(n):
                r, status, value = queue.get(timeout=join)
                (results if status == "ok" else errors)[r] = value
        finally:
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
    return results, [RuntimeError(e) if e else None for e in errors]


def spawn_and_collect(fn, nprocs: int, reports: int, join: float) -> tuple[bool, dict]:
    """dist.spawn fn(rank, queue) on nprocs ranks, wait up to `join` s for each; return
    whether all exited and {rank: text} of up to `reports` reports they queued. Ranks
    still running at the end are killed. `join` is for a quiet machine, scaled by the load."""
    import mwrt.distributed as dist

    join = machine.seconds(join, 10 * join)

    queue = mp.get_context("spawn").SimpleQueue()
    context = dist.spawn(fn, args=(queue,), nprocs=nprocs, join=False)
    procs = context.processes  # the context holds a queue the children need: keep it
    try:
        for p in procs:
            p.join(join)
        exited = all(p.exitcode is not None for p in procs)
        got = {}
        while len(got) < reports and (exited or not queue.empty()):
            rank, text = queue.get()
            got[rank] = text
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return exited, got

"""Worker daemons for tests: one started by hand on a free loopback port, and a session of
local daemons whose deaths the master hears of quickly."""

from __future__ import annotations

import os
import subprocess
import sys

import mwrt

from . import machine
from .faultkit import reap


def quick_to_notice_losses(monkeypatch, workers: int):
    """A fresh session of `workers` local daemons whose deaths the master hears of in 1.5 s
    on a quiet machine (more under load: a live daemon must not be taken for dead): for a
    fixture to yield from."""
    mwrt.shutdown()
    monkeypatch.setenv("MWRT_HEARTBEAT_INTERVAL", "0.2")
    monkeypatch.setenv("MWRT_HEARTBEAT_TIMEOUT", str(machine.seconds(1.5, 10)))
    mwrt.init_master_worker(local_workers=workers, timeout=30)
    try:
        yield mwrt.master.cluster.current()
    finally:
        mwrt.shutdown()


# The session that module-scoped fixtures share (shared_session): the cluster, the MWRT_
# settings it started under, and whether the next test asks for it (set before a teardown).
_SHARED: dict = {}


def shared_session(workers: int):
    """mwrt with a session of `workers` local daemons, for a module-scoped fixture to yield
    from: the one the module before left, while it runs with every daemon and the same MWRT_
    settings, else a fresh one (starting daemons was much of what such a module cost). At the
    module's end it is shut down, as before it was shared, unless the next test asks for it."""
    from mwrt.master import cluster as clusters

    env = {k: v for k, v in os.environ.items() if k.startswith("MWRT_")}
    kept = _SHARED.get("session")
    usable = kept is not None and clusters.is_initialized() and clusters.current() is kept \
        and env == _SHARED["env"] and len(kept.local or ()) == workers \
        and all(node.lost is None for node in kept.nodes) \
        and all(worker.process.poll() is None for worker in kept.local)
    if not usable:
        mwrt.shutdown()
        mwrt.init_master_worker(local_workers=workers, timeout=30)
        _SHARED.update(session=clusters.current(), env=env)
    yield mwrt
    if not _SHARED.get("next_asks"):
        _SHARED.clear()
        mwrt.shutdown()


def waits_from_here() -> int:
    """mwrt.stats()'s count of the master's waits, after a backlog checkpoint at every node:
    a session that tests share has sent commands since its last one, and the checkpoint a
    test would otherwise reach midway (MWRT_MAX_BACKLOG_BYTES) is a wait of its own."""
    for node in mwrt.master.cluster.current().nodes:
        node.limits.checkpoint()
    return mwrt.stats()["waits"]


def next_test_asks(asks: bool) -> None:
    """Say, before a test's teardown, whether the test after it asks for a shared session."""
    _SHARED["next_asks"] = asks


def start_worker(*extra, env=None, prefix=(), launch=("-m", "mwrt.worker")):
    """A worker daemon process on a free loopback port: (process, address). `launch`: what
    follows the interpreter (another way to run mwrt.worker's main); `prefix`: a command
    that runs it (`unshare ...`)."""
    child_env = dict(os.environ, **(env or {}))
    root = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, child_env.get("PYTHONPATH")]))
    process = subprocess.Popen([*prefix, sys.executable, *launch, "--listen", "127.0.0.1:0",
                                *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=child_env)
    line = process.stdout.readline()
    if "listening on" not in line:
        process.kill()
        raise RuntimeError(f"worker did not start: {line!r} {process.stderr.read()}")
    return process, line.split()[-1]


def stop_worker(process) -> None:
    """Stop a daemon start_worker started (SIGTERM, then SIGKILL after 5 s); close its pipes."""
    if process.poll() is None:
        process.terminate()
    reap(process, 5)

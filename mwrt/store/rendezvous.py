"""Init methods (env://, tcp://host:port, file:///path) and the rank rendezvous that names
missing and duplicate ranks."""

from __future__ import annotations

import os
import socket
import time
from urllib.parse import parse_qs, urlparse

from ..errors import RendezvousError, RendezvousTimeoutError
from .launchers import launcher_env
from .stores import FileStore, Store
from .tcp_store import TCPStore

# -- init methods ------------------------------------------------------------------------


def _env_int(name: str, given: int | None, instead: str) -> int:
    """`given` if set, else the int in environment variable `name`; `instead`: what else
    would give it."""
    if given is not None and given >= 0:
        return given
    raw = os.environ.get(name)
    if raw is None or raw == "":
        raise RendezvousError(f"env://: {name} is not set; {instead}, or run under mwrt-launch, "
                              "dist.spawn, srun or mpirun, which set it")
    try:
        return int(raw)
    except ValueError:
        raise RendezvousError(f"env://: {name} is not an int (got {raw!r})") from None


def store_from_url(init_method: str | None, rank: int = -1, world_size: int = -1,
                   timeout=None, generation: int | None = None,
                   key: bytes | None = None) -> tuple[Store, int, int]:
    """Parse `env://`, `tcp://host:port` or `file:///path` into (store, rank, world_size).

    `key`, the job's secret, admits a rank to a TCPStore; a FileStore has its file's
    permissions (0600) instead."""
    url = urlparse(init_method or "env://")
    query = parse_qs(url.query)
    if rank is None or rank < 0:
        rank = int(query["rank"][0]) if "rank" in query else rank
    if world_size is None or world_size < 0:
        world_size = int(query["world_size"][0]) if "world_size" in query else world_size
    if url.scheme == "env":
        if rank is None or rank < 0:  # srun or mpirun started us: their variables, as torch's
            for name, value in launcher_env().items():
                os.environ.setdefault(name, value)
        rank = _env_int("RANK", rank, "pass rank=")
        world_size = _env_int("WORLD_SIZE", world_size, "pass world_size=")
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        port = _env_int("MASTER_PORT", None, "set it (and MASTER_ADDR), pass "
                        "init_method='tcp://host:port'")
    elif url.scheme == "tcp":
        if not url.hostname or url.port is None:
            raise RendezvousError(f"init_method: tcp:// needs host:port (got {init_method!r}); "
                                  "e.g. tcp://127.0.0.1:29500")
        host, port = url.hostname, url.port
    elif url.scheme == "file":
        if not url.path:
            raise RendezvousError(f"init_method: file:// needs a path (got {init_method!r})")
    else:
        raise RendezvousError(f"init_method: unknown scheme {url.scheme!r} in {init_method!r} "
                              "(known: env://, tcp://host:port, file:///path)")
    if rank < 0 or world_size < 1 or rank >= world_size:
        raise RendezvousError(f"init_method {init_method!r}: rank must be in [0, world_size) "
                              f"(got rank={rank}, world_size={world_size}); pass both")
    if url.scheme == "file":
        return FileStore(url.path, world_size, timeout=timeout), rank, world_size
    store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout,
                     generation=generation, key=key)
    return store, rank, world_size


def rendezvous(store: Store, rank: int, world_size: int, *, prefix: str = "mwrt",
               timeout: float | None = None) -> dict[int, tuple[str, int]]:
    """Register rank -> (hostname, pid) and wait for every rank; returns the table."""
    timeout = store.timeout if timeout is None else float(timeout)
    # The nonce tells two claimants apart even within one process; messages show host pid.
    me = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
    err_key = f"{prefix}/rdzv/error"
    got = store.compare_set(f"{prefix}/rdzv/{rank}", b"", me).decode()
    if got != me:
        msg = (f"rendezvous: rank {rank} was claimed twice (by {_who(got)} and by {_who(me)}); "
               "give each process its own RANK")
        store.compare_set(err_key, b"", msg)  # the first error stays: keys bind to writers
        raise RendezvousError(msg)
    keys = [f"{prefix}/rdzv/{r}" for r in range(world_size)]
    deadline = time.monotonic() + timeout
    while True:
        try:
            store.wait(keys, timeout=max(0.0, min(0.2, deadline - time.monotonic())))
            break
        except RendezvousTimeoutError:
            pass
        if store.check([err_key]):
            raise RendezvousError(store.get(err_key).decode())
        if time.monotonic() >= deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise RendezvousTimeoutError(
                f"rendezvous: ranks {missing} of world size {world_size} did not join within "
                f"{timeout} s (rank {rank} waited); start them, or check that they use the same "
                "init_method / MASTER_ADDR:MASTER_PORT and WORLD_SIZE")
    table = {}
    for r, k in enumerate(keys):
        host, pid, _ = store.get(k).decode().rsplit(":", 2)
        table[r] = (host, int(pid))
    return table


def _who(identity: str) -> str:
    host, pid, _ = identity.rsplit(":", 2)
    return f"host {host} pid {pid}"

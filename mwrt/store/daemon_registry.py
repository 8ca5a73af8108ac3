"""A directory where worker daemons announce themselves and a master finds them.

On a cluster the daemons start before anyone knows their addresses (`srun mwrt-worker
--register DIR`): each writes one file into DIR, a directory every node sees (a shared
home or scratch file system), and the master waits for as many as it was told to expect
(`init_master_worker(registry=DIR, num_workers=N)`). One file per daemon, written to a
temporary name and renamed, so no lock is needed and a reader never sees half a file,
on NFS too. Nodes are numbered by the daemons' order (SLURM's task id when there is one),
then by name.
"""

from __future__ import annotations

import os
import socket
import time

from .. import config
from ..errors import ConfigError, RendezvousTimeoutError

SUFFIX = ".worker"


def register(directory: str, address: str, order: int | None = None) -> str:
    """Announce a daemon listening on `address`; returns the file to remove at exit."""
    directory = config.expand_path(directory)
    os.makedirs(directory, exist_ok=True)
    if order is None and os.environ.get("SLURM_PROCID", "").isdigit():
        order = int(os.environ["SLURM_PROCID"])
    name = f"{order if order is not None else 999999:06d}-{socket.gethostname()}-{os.getpid()}"
    path = os.path.join(directory, name + SUFFIX)
    temporary = os.path.join(directory, f".{name}.tmp")
    with open(temporary, "w") as f:
        f.write(address + "\n")
    os.replace(temporary, path)
    return path


def wait_for(directory: str, count: int, timeout: float) -> list[str]:
    """The addresses of the first `count` daemons registered in `directory`, in order;
    waits up to `timeout` seconds for them."""
    if not isinstance(count, int) or count < 1:
        raise ConfigError(f"num_workers: must be an int >= 1 to wait for registered workers "
                          f"(got {count!r}); set it or MWRT_NUM_WORKERS")
    directory = config.expand_path(directory)
    deadline, found = time.monotonic() + timeout, []
    while True:
        found = registered(directory)
        if len(found) >= count:
            return found[:count]
        if time.monotonic() > deadline:
            raise RendezvousTimeoutError(
                f"registry {directory}: {len(found)} of {count} workers registered within "
                f"{timeout} s ({', '.join(found) or 'none'}); start them with `mwrt-worker "
                f"--register {directory}` on every node, on a file system the master sees")
        time.sleep(0.1)


def registered(directory: str) -> list[str]:
    """The addresses of the daemons registered in `directory` now, in order."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX))
    except FileNotFoundError:
        return []
    addresses = []
    for name in names:
        try:
            with open(os.path.join(directory, name)) as f:
                addresses.append(f.read().strip())
        except FileNotFoundError:  # a daemon that just stopped
            continue
    return [a for a in addresses if a]

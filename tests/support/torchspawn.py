"""Spawn the ranks of a torch.distributed program under env:// and collect what each saved."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from . import machine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = os.path.join(ROOT, "tests", "programs")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(program: str, args: list[str], out: str, n: int = 2, timeout: float = 90,
          codes=None, env=None) -> list:
    """Run programs/PROGRAM ARGS... OUT on n ranks; each rank's saved result, OUT.RANK (None
    for a rank expected to exit with a code other than 0). Checks the exit codes and that no
    shared memory is left behind. `timeout` is for a quiet machine, scaled by the load."""
    import torch

    codes = codes or [0] * n
    timeout = machine.seconds(timeout, 10 * timeout)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": str(n), "MWRT_RENDEZVOUS_TIMEOUT": str(machine.seconds(60, 600)),
           **(env or {}),
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, os.path.join(PROGRAMS, program), *args, out],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(n)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    what = f"{program} {' '.join(args)}"
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == codes[r], (f"rank {r} of {what} exited {p.returncode}, "
                                          f"expected {codes[r]}:\n{log}")
    left = [f for f in os.listdir("/dev/shm") for p in procs if f.startswith(f"mwrt-{p.pid}-")] \
        if os.path.isdir("/dev/shm") else []
    assert not left, f"{what} left shared memory behind: {left}"
    return [torch.load(f"{out}.{r}", weights_only=False) if codes[r] == 0 else None
            for r in range(n)]

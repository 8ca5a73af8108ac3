"""mwrt-launch: start N ranks of a script per node, like torchrun (and THD's pytorch_exec).

    mwrt-launch --nproc-per-node 2 train.py --epochs 3
    mwrt-launch --nnodes 2 --node-rank 0 --master-addr head --master-port 29500 \\
        --nproc-per-node 4 train.py
    srun -N 2 --ntasks-per-node 4 mwrt-launch train.py      # one rank per SLURM task

Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
and for a one-node job a fresh MWRT_JOB_SECRET; a job across nodes needs the same
MWRT_JOB_SECRET or MWRT_KEY_FILE on every node (or MWRT_INSECURE=1 on a private network).
Output lines are prefixed by "[rank r] ". When a rank fails, the others are stopped, and
the launcher reports its exit code and last lines, and exits with that code; with
`--max-restarts K` (torchrun's flag) it starts the whole group again instead, up to K
times, with MWRT_RESTART_COUNT (and torchrun's TORCHELASTIC_RESTART_COUNT) set to the
restart's number, so a program can resume from its last checkpoint. Ctrl-C
(SIGINT) is passed on to the ranks, which get 5 s to unwind before they are stopped (exit
code 130). On SIGUSR1, and when a rank has waited MWRT_HANG_WARNING seconds in one
collective or send/recv, it prints a table of every local rank's current call
(`kill -USR1 <launcher pid>`).
"""

from __future__ import annotations

import argparse
import collections
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

from .. import config
from ..collective import watchdog
from ..netaddr import is_loopback
from ..procs import stop_processes
from ..store.launchers import free_port, job_secret_env, rank_env, slurm_env
from ..unkeyed import FIX, insecure

_TAIL = 20
_INTERRUPT_GRACE = 5.0  # seconds the ranks get to unwind after Ctrl-C, before SIGTERM


def _parse(argv):
    p = argparse.ArgumentParser(prog="mwrt-launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"%(prog)s (mwrt {config.version()})")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", "--node_rank", type=int, default=0)
    p.add_argument("--master-addr", "--master_addr", default=None)
    p.add_argument("--master-port", "--master_port", type=int, default=None)
    p.add_argument("--max-restarts", "--max_restarts", type=int, default=0,
                   help="restart every rank up to this many times when one fails")
    p.add_argument("-m", dest="module", action="store_true", help="run the script as a module")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


def plan(opts, env=os.environ) -> list[dict[str, str]]:
    """The environment of each local rank, from the options or SLURM's variables."""
    if opts.nproc_per_node is None and "SLURM_PROCID" in env:  # srun: one rank per task
        env = dict(env, **{k: str(v) for k, v in (("MASTER_ADDR", opts.master_addr),
                                                   ("MASTER_PORT", opts.master_port)) if v})
        one = slurm_env(env)
        if one is None:
            raise SystemExit("mwrt-launch: SLURM_PROCID is set but SLURM_NTASKS is not; run "
                             "the job with srun, or pass --nproc-per-node")
        return [one]
    n = 1 if opts.nproc_per_node is None else opts.nproc_per_node
    if n < 1 or opts.nnodes < 1 or not 0 <= opts.node_rank < opts.nnodes:
        raise SystemExit(f"mwrt-launch: need --nproc-per-node >= 1 and 0 <= --node-rank < "
                         f"--nnodes (got {n}, {opts.node_rank}, {opts.nnodes})")
    addr = opts.master_addr or env.get("MASTER_ADDR") or "127.0.0.1"
    port = opts.master_port or (int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None)
    if port is None:
        if opts.nnodes > 1:
            raise SystemExit("mwrt-launch: with --nnodes > 1 pass --master-port (the same on "
                             "every node)")
        port = free_port()  # one node: any free port, so parallel jobs do not collide
    # One node: the launcher makes the job's secret; across nodes every launcher must be
    # given the same one (MWRT_JOB_SECRET or MWRT_KEY_FILE), which the ranks inherit.
    secret = {} if opts.nnodes > 1 else job_secret_env(env)
    return [dict(rank_env(opts.node_rank * n + i, opts.nnodes * n, i, n, addr, port), **secret)
            for i in range(n)]


def _need_secret(rank: dict[str, str], env=os.environ) -> None:
    """Refuse a job across hosts without a secret now, rather than at every rank's store
    (with SLURM each task has its own launcher: none can make a secret for all)."""
    addr, across = rank["MASTER_ADDR"], rank["WORLD_SIZE"] != rank["LOCAL_WORLD_SIZE"]
    if not across or rank.get("MWRT_JOB_SECRET") or env.get("MWRT_JOB_SECRET") or \
            env.get("MWRT_KEY_FILE") or insecure(env) or is_loopback(addr):
        return
    raise SystemExit(
        f"mwrt-launch: a job across hosts (its store at {addr}) needs a secret, or anyone "
        f"who reaches the store could join it; {FIX}")


def _pump(stream, out, prefix, tail):
    for line in iter(stream.readline, b""):
        text = line.decode(errors="replace")
        tail.append(text.rstrip("\n"))
        out.write(prefix + text)
        out.flush()
    stream.close()


def _start(cmd, env):
    full = dict(os.environ, **env, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL)  # the last lines, to show
    prefix = f"[rank {env['RANK']}] "
    pumps = [threading.Thread(target=_pump, args=(s, o, prefix, tail), daemon=True)
             for s, o in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
    for t in pumps:
        t.start()
    return proc, tail, pumps


def _exit_waiter(procs):
    """A wait(timeout) that returns as soon as another of `procs` exits, so the first rank to
    fail is seen before the ranks its death makes fail (pidfds; polling where there are none)."""
    try:
        fds = {os.pidfd_open(p.pid): p for p in procs}
    except (AttributeError, OSError):
        return lambda timeout: time.sleep(min(timeout, 0.05))

    def wait(timeout: float) -> None:
        for fd in [fd for fd, p in fds.items() if p.poll() is not None]:
            del fds[fd]  # an exited process's pidfd stays readable: stop watching it
            os.close(fd)
        select.select(list(fds), [], [], timeout)
    return wait


def _threads_per_rank(envs: list[dict]) -> dict[str, str]:
    """OMP_NUM_THREADS=1 for ranks sharing a node, unless set: each rank's math library
    otherwise starts a thread per core, and they fight (torch's loop: 5 ms/step, 13-20 ms)."""
    if "OMP_NUM_THREADS" in os.environ or len(envs) < 2:
        return {}
    sys.stderr.write("mwrt-launch: OMP_NUM_THREADS=1 for each rank (set it to change this)\n")
    return {"OMP_NUM_THREADS": "1"}


def run(opts) -> int:
    """Start the local ranks and wait; return 0 or the first failing rank's exit code."""
    with tempfile.TemporaryDirectory(prefix="mwrt-launch-") as status:
        return _run(opts, status)


class _Calls:
    """The table of the ranks' current calls: printed on SIGUSR1, and once per hang."""

    def __init__(self, status: str, ranks: list[int]):
        self.status, self.ranks, self.asked = status, ranks, False
        self.shown: set[tuple[int, str, float]] = set()  # (rank, call, since) warned of
        self.warning = config.get("hang_warning")
        if hasattr(signal, "SIGUSR1"):
            signal.signal(signal.SIGUSR1, self._ask)

    def _ask(self, *_) -> None:
        self.asked = True  # printed by the loop: a handler must not take the output's lock

    def look(self) -> None:
        records = watchdog.read_status(self.status)
        if self.asked:
            self.asked = False
            self._print("on SIGUSR1", records)
            return
        now, stuck = time.time(), []
        for rank, rec in records.items():
            for c in rec["calls"]:
                key = (rank, c["what"], c["since"])
                if c["busy"] and self.warning > 0 and now - c["since"] >= self.warning \
                        and key not in self.shown:
                    self.shown.add(key)
                    stuck.append(f"rank {rank} in {c['what']}")
        if stuck:
            self._print(f"{', '.join(stuck)} for {self.warning:g} s or more", records)

    def _print(self, why: str, records: dict) -> None:
        sys.stderr.write(f"mwrt-launch: every rank's current call ({why}):\n"
                         f"{watchdog.table(records, self.ranks)}\n")
        sys.stderr.flush()


def _run(opts, status: str) -> int:
    cmd = [sys.executable, "-u"] + (["-m", opts.script] if opts.module else [opts.script])
    if opts.max_restarts < 0:
        raise SystemExit(f"mwrt-launch: --max-restarts must be >= 0 (got {opts.max_restarts})")
    restart = 0
    while True:
        envs = plan(opts)  # one node: a fresh store port each time, never a stale store's
        _need_secret(envs[0])
        extra = dict(_threads_per_rank(envs) if restart == 0 else {}, MWRT_STATUS_DIR=status,
                     MWRT_RESTART_COUNT=str(restart), TORCHELASTIC_RESTART_COUNT=str(restart))
        calls = _Calls(status, [int(env["RANK"]) for env in envs])  # SIGUSR1 from now on
        code = _attempt(cmd + opts.args, [dict(env, **extra) for env in envs], calls)
        if code in (0, 130) or restart >= opts.max_restarts:
            if code not in (0, 130) and opts.max_restarts:
                sys.stderr.write(f"mwrt-launch: giving up after {restart} restart(s) "
                                 f"(--max-restarts {opts.max_restarts})\n")
            return code
        restart += 1
        sys.stderr.write(f"mwrt-launch: restarting every rank (restart {restart} of "
                         f"{opts.max_restarts}, MWRT_RESTART_COUNT={restart})\n")
        sys.stderr.flush()


def _attempt(cmd: list, envs: list, calls: _Calls) -> int:
    """Start the local ranks once and wait; 0, the first failing rank's code, or 130."""
    ranks = [(env["RANK"], *_start(cmd, env)) for env in envs]
    exits = _exit_waiter([proc for _, proc, _, _ in ranks])
    try:
        while True:
            exits(0.5)
            calls.look()
            running = False
            for rank, proc, tail, pumps in ranks:
                code = proc.poll()
                if code is None:
                    running = True
                elif code != 0:
                    stop_processes([p for _, p, _, _ in ranks])
                    for t in pumps:
                        t.join(2)
                    _report(rank, proc.pid, code, tail)
                    return code if code > 0 else 128 - code
            if not running:
                return 0
    except KeyboardInterrupt:
        _interrupt([p for _, p, _, _ in ranks])
        for _, _, _, pumps in ranks:  # their KeyboardInterrupt lines, before ours
            for t in pumps:
                t.join(2)
        sys.stderr.write("mwrt-launch: interrupted (SIGINT); the ranks are stopped\n")
        return 130
    finally:
        for _, _, _, pumps in ranks:
            for t in pumps:
                t.join(2)


def _interrupt(procs, grace: float = _INTERRUPT_GRACE) -> None:
    """Ctrl-C: each rank unwinds as from its own Ctrl-C (its KeyboardInterrupt, its exit
    handlers leaving the group), then what still runs is stopped. A terminal's Ctrl-C
    reaches the ranks too, so they get a moment first: a second SIGINT would cut their
    unwinding short; `kill -INT` of the launcher reaches only us, and is forwarded."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
    _wait_all(procs, 1.0)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    _wait_all(procs, grace)
    stop_processes(procs)


def _wait_all(procs, timeout: float) -> None:
    """Wait up to `timeout` seconds in all for every process of `procs` to exit."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            return


def _report(rank, pid, code, tail):
    how = (f"was killed by signal {signal.Signals(-code).name}" if code < 0
           else f"exited with code {code}")
    lines = "".join(f"\n[rank {rank}] {line}" for line in tail)
    said = f"Its last lines:{lines}" if tail else "It printed nothing."
    sys.stderr.write(f"mwrt-launch: rank {rank} (pid {pid}) {how}; stopped the other ranks. "
                     f"{said}\n")


def main(argv=None) -> None:
    """Console entry point: mwrt-launch [options] script.py args..."""
    sys.exit(run(_parse(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()

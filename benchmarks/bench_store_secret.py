"""The job secret's cost on rendezvous: init_process_group of 2 ranks over tcp://, with and
without MWRT_JOB_SECRET, in the same run (rounds interleaved so both see the same load).

    python benchmarks/bench_store_secret.py [--rounds 6] [--inits 8] [--baseline /path/to/main]

Each round starts two rank processes per configuration; each rank times `--inits`
init_process_group + destroy_process_group cycles, and the figure is the median over every
cycle of the slower rank's init time. `--baseline` adds the same measurement of another
checkout (e.g. main, before the store proved the secret), imported through PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RANK = """
import json, sys, time
import mwrt.distributed as dist
rank, port, inits = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(inits):
    t0 = time.perf_counter()
    dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=60)
    times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
print(json.dumps(times))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(env: dict, inits: int) -> list[float]:
    """Per init cycle, the slower rank's init_process_group time."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(port), str(inits)],
                              env=env, stdout=subprocess.PIPE, text=True) for r in range(2)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise SystemExit(f"bench_store_secret: a rank exited with {p.returncode}")
        outs.append(json.loads(out))
    return [max(a, b) for a, b in zip(*outs)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--inits", type=int, default=8)
    ap.add_argument("--baseline", default=None, help="another checkout to measure beside")
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("MWRT_JOB_SECRET", "MWRT_KEY_FILE")}
    configs = {"no secret (public key)": dict(base, PYTHONPATH=ROOT),
               "MWRT_JOB_SECRET": dict(base, PYTHONPATH=ROOT, MWRT_JOB_SECRET="bench-secret")}
    if args.baseline:
        configs["baseline checkout"] = dict(base, PYTHONPATH=os.path.abspath(args.baseline))
    times = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, env in configs.items():
            times[name].extend(one_round(env, args.inits))
    ref = statistics.median(times["no secret (public key)"])
    print("| configuration | init_process_group median (ms) | p90 (ms) | vs no secret |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        ts = sorted(ts)
        med, p90 = statistics.median(ts), ts[int(0.9 * (len(ts) - 1))]
        print(f"| {name} | {med * 1e3:.2f} | {p90 * 1e3:.2f} | {med / ref:.3f} |")


if __name__ == "__main__":
    main()

"""Steps/s of data-parallel training on 2 workers: mwrt beside Monarch's tensor engine.

The MLP of examples/torch_training.py (20-64-64-4, AdamW, a batch of 64 rows, 32 per worker)
trains on a mesh of 2 local workers from one master with mwrt (eager and captured, as
benchmarks/bench_torch_mesh.py does), and, in a fresh process of the interpreter given by
--monarch-python, under Monarch's tensor engine (torchmonarch) on a local proc mesh of 2
processes on CPU: the model made inside mesh.activate(), each gradient reduce_("gpus", "avg"),
then AdamW's step. steps/s = steps / seconds after warm-up; the ratio is mwrt's over Monarch's.
Where Monarch cannot run (not installed, an error, no answer within --timeout), its row gives
the reason in one line and the script still exits 0.

torchmonarch wants its own torch, so it lives in a separate virtual environment:

    python3 -m venv /work/venv-monarch
    /work/venv-monarch/bin/pip install torchmonarch==0.7.0 torch
    python benchmarks/bench_monarch.py [--steps N] [--monarch-python PATH] [--timeout S]
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

BATCH, WARMUP, WORKERS = 64, 3, 2
VENV = "/work/venv-monarch/bin/python"


def monarch_child(steps: int, reduce: bool) -> None:
    """Train under Monarch's tensor engine and print steps/s (run by the Monarch venv); each
    stage is printed first, so a failure names the stage it happened in."""
    print("STAGE importing monarch", flush=True)
    import monarch
    import torch
    import torch.nn.functional as F
    from monarch.actor import this_host

    print("STAGE spawning the proc mesh", flush=True)
    procs = this_host().spawn_procs(per_host={"gpus": WORKERS})
    with procs.activate():
        torch.manual_seed(0)  # the example's layers: it imports mwrt, which this venv lacks
        model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        x = torch.randn(BATCH // WORKERS, 20)
        y = (x @ torch.randn(20, 4)).argmax(1)

    print("STAGE the first steps" + (" (the gradients' reduce_)" if reduce else ""), flush=True)

    def step():
        with procs.activate():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            for p in model.parameters() if reduce else ():
                p.grad.reduce_("gpus", "avg")
            opt.step()
        return loss

    for _ in range(WARMUP):
        loss = step()
    monarch.inspect(loss)
    print("STAGE the timed steps", flush=True)
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    monarch.inspect(loss)  # the one wait: the last step's loss back on the controller
    print(f"MONARCH {steps / (time.perf_counter() - start)}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # the proc mesh's shutdown can hang; monarch_rate kills what is left


def monarch_rate(python: str, steps: int, timeout: float, reduce: bool = True) -> float | str:
    """Monarch's steps/s, or the one-line reason it has none."""
    if not os.path.exists(python):
        return f"no interpreter at {python} (install torchmonarch in a venv, see the docstring)"
    command = [python, os.path.abspath(__file__), "--monarch-child", str(steps)]
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: its workers may hold it
        proc = subprocess.Popen(command + ([] if reduce else ["--no-reduce"]), stdout=log,
                                stderr=subprocess.STDOUT, text=True)
        try:
            proc.wait(timeout=timeout)
            reason = f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            reason = f"no answer within {timeout:.0f} s"
        finally:
            _kill_tree(proc)
        log.seek(0)
        out = log.read()
    for line in out.splitlines():
        if line.startswith("MONARCH "):
            return float(line.split()[1])
    stages = [ln[6:] for ln in out.splitlines() if ln.startswith("STAGE ")]
    where = f"at {stages[-1]}" if stages else "before its first stage"
    if "have failed:" in out:  # a worker's failure, as Monarch's supervision reports it
        after = out.split("have failed:", 1)[1].splitlines()[1:]
        indented = list(itertools.takewhile(lambda ln: ln[:1] == " ", after))
        cause = " ".join(" ".join(indented).split())
    else:
        raised = re.findall(r"^[\w.]+(?:Error|Exception|Interrupt)\b.*$", out, re.MULTILINE)
        cause = raised[-1] if raised else "no error printed"
    return f"{reason} {where}: {cause[:240]}"


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the child and every process under it, by pid (Monarch's workers may outlive it)."""
    parents: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parents.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    tree, i = [proc.pid], 0
    while i < len(tree):
        tree += parents.get(tree[i], [])
        i += 1
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row")
    parser.add_argument("--monarch-python", default=VENV, help="an interpreter with torchmonarch")
    parser.add_argument("--timeout", type=float, default=240, help="seconds Monarch may take")
    parser.add_argument("--monarch-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--no-reduce", action="store_true",
                        help="Monarch's workers train alone, no reduce_ (to see past it)")
    args = parser.parse_args()
    if args.monarch_child:  # the process monarch_rate starts, in Monarch's interpreter
        return monarch_child(args.monarch_child, not args.no_reduce)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_torch_mesh import mesh_rates

    eager, captured = mesh_rates(WORKERS, args.steps)
    monarch = monarch_rate(args.monarch_python, args.steps, args.timeout, not args.no_reduce)
    print(f"training steps/s, MLP 20-64-64-4, AdamW, batch {BATCH} on {WORKERS} workers "
          f"({args.steps} steps over their time, after {WARMUP}; load "
          f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, shared)")
    print(f"{'mwrt eager':>11} {'mwrt captured':>14} {'Monarch':>9} {'eager/M':>8} "
          f"{'captured/M':>11}")
    if isinstance(monarch, str):
        print(f"{eager:11.1f} {captured:14.1f} {'-':>9} {'-':>8} {'-':>11}\n"
              f"Monarch did not run: {monarch}")
    else:
        print(f"{eager:11.1f} {captured:14.1f} {monarch:9.1f} {eager / monarch:8.2f} "
              f"{captured / monarch:11.2f}")


if __name__ == "__main__":
    main()

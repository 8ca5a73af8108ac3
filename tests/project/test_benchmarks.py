"""The benchmarks still run and print their tables (figures are read by people, not asserted)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import machine
from tests.support.hosts import unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")


@pytest.mark.parametrize("script, args", [
    ("bench_ops.py", ["--quick"]),
    ("bench_hops.py", ["--reps", "100"]),
    ("bench_hops.py", ["--bytecodes", "--reps", "50"]),
    ("bench_streams.py", ["--quick"]),
    ("bench_channels.py", ["--quick"]),
    ("bench_collectives.py", ["--quick", "--sizes", "4K", "--world", "2"]),
    ("bench_hosts.py", ["--quick"]),
    ("bench_scale.py", ["--quick"]),
    ("bench_mesh.py", ["--quick"]),  # skips its hosts table itself where hosts cannot be made
    ("bench_reduce_scatter.py", ["--nodes", "2", "--mib", "1", "--reps", "1"]),
    ("bench_mesh_sort.py", ["--quick"]),
    ("bench_gpu.py", ["--quick", "--fake"]),
    ("bench_checkpoint.py", ["--quick"]),
    ("bench_wire.py", ["--quick"]),  # its table on the fake GPU; on a GPU: real
    ("bench_torch_workers.py", ["--quick"]),
    ("bench_torch_mesh.py", ["--quick"]),
])
def test_benchmark_runs_and_prints_its_table(script, args):
    if script == "bench_hosts.py" and unavailable():
        pytest.skip(unavailable())
    res = subprocess.run([sys.executable, os.path.join(BENCH, script), *args],
                         capture_output=True, text=True,
                         timeout=machine.seconds(240, 900), check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(res.stdout.strip().splitlines()) >= 3, res.stdout[-2000:]  # a table

"""worker/slurm_workers.sh, run as SLURM would run it on three simulated hosts: the batch
script on the first, and `srun` (a stand-in that starts the command once per host with
SLURM's task variables) launching a daemon on each. The master finds them in the registry
directory, with no address typed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.support.hosts import hosts3  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(180)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRUN = """#!/usr/bin/env bash
# srun, one task per node: each node is a simulated host (tests/support/hosts.py).
while [[ $1 == -* ]]; do shift; done
pids=()
i=0
for holder in {holders}; do
  SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_NTASKS={n} \\
    nsenter -t "$holder" -n -u -i -m --wd=. -- "$@" &
  pids+=($!)
  i=$((i + 1))
done
trap 'kill "${{pids[@]}}" 2>/dev/null; wait' TERM INT
wait
"""


def test_the_slurm_script_runs_a_master_and_a_daemon_per_node(hosts3, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(SRUN.format(holders=" ".join(str(h.holder_pid) for h in hosts3),
                                n=len(hosts3)))
    srun.chmod(0o755)
    env = {"HOME": str(tmp_path), "SLURM_JOB_ID": "4242", "SLURM_NNODES": str(len(hosts3)),
           "PYTHON": sys.executable,
           "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    res = hosts3[0].run(["bash", os.path.join(ROOT, "worker", "slurm_workers.sh"),
                         os.path.join(ROOT, "tests", "programs", "mw_calls.py")],
                        env=env, timeout=150)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "ok: nodes on ['hosta', 'hostb', 'hostc']" in res.stdout, res.stdout
    assert not (tmp_path / ".mwrt" / "job-4242").exists()  # the job cleaned up after itself
    leftover = subprocess.run(["pgrep", "-f", f"--key-file {tmp_path}"], capture_output=True)
    assert leftover.stdout == b"", "worker daemons outlived the job"

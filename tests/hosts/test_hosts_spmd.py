"""Process groups across simulated hosts (tests/support/hosts.py): every SPMD call, one and two ranks
per host, by tcp://, env:// (mwrt-launch) and a shared file://."""

from __future__ import annotations

import os
import sys

import pytest
from tests.support.hosts import hosts2  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(240)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAM = os.path.join(ROOT, "tests", "programs", "spmd_calls.py")
SECRET = {"MWRT_JOB_SECRET": "a secret both hosts were given"}
PORT = 29511


def finish(procs, timeout: float = 180.0) -> list[str]:
    """Every rank's stdout; an error with the stderr of any rank that failed."""
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"{proc.args}: exit {proc.returncode}\n{err[-3000:]}"
        outs.append(out)
    return outs


def run_ranks(hosts, argv_of, env_of) -> list[str]:
    """Start one process per host (`argv_of(i)`, `env_of(i)`) and collect their outputs."""
    import subprocess

    procs = [h.popen(argv_of(i), env=env_of(i), stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True) for i, h in enumerate(hosts)]
    return finish(procs)


@pytest.mark.parametrize("backend", ["", "tcp"])
def test_one_rank_per_host_by_tcp_init(hosts2, backend):
    outs = run_ranks(hosts2, lambda i: [sys.executable, PROGRAM, f"tcp://{hosts2[0].addr}:{PORT}"],
                     lambda i: dict(SECRET, RANK=str(i), WORLD_SIZE="2", BACKEND=backend))
    names = ",".join(h.name for h in hosts2)
    for rank, out in enumerate(outs):
        assert f"rank {rank} of 2: ok" in out and f"hosts {names}" in out, out
    if not backend:  # the auto channel went tcp between the hosts
        assert "paths 1:tcp" in outs[0] and "paths 0:tcp" in outs[1]


def test_two_ranks_per_host_under_mwrt_launch(hosts2):
    """env://: shm between the two ranks of a host, tcp between hosts."""
    def argv(i):
        return [sys.executable, "-m", "mwrt.distributed.launch", "--nnodes", "2", "--node-rank",
                str(i), "--nproc-per-node", "2", "--master-addr", hosts2[0].addr,
                "--master-port", str(PORT + 1), PROGRAM]

    outs = run_ranks(hosts2, argv, lambda i: dict(SECRET, ITERATIONS="40"))
    text = "".join(outs)
    for rank in range(4):
        assert f"rank {rank} of 4: ok" in text, text
    # Collectives go two-level: inside each host over shm, across over tcp.
    assert "[rank 0] rank 0 of 4: ok (auto, hosts hosta,hostb, paths 1:shm,2:tcp,3:tcp, " \
           "two-level)" in text
    assert "paths 0:tcp,1:tcp,2:shm, two-level)" in text  # rank 3, on the second host


def test_one_rank_per_host_by_a_shared_file_store(hosts2, tmp_path):
    """A file store has no host to route toward: MWRT_IFNAME names the interface."""
    url = f"file://{tmp_path / 'store'}"
    outs = run_ranks(hosts2, lambda i: [sys.executable, PROGRAM, url],
                     lambda i: dict(SECRET, RANK=str(i), WORLD_SIZE="2",
                                    MWRT_IFNAME=hosts2[i].ifname))
    assert all("of 2: ok" in out for out in outs), outs


def test_ranks_without_a_secret_are_told_the_fix(hosts2):
    outs = []
    import subprocess

    procs = [h.popen([sys.executable, PROGRAM, f"tcp://{hosts2[0].addr}:{PORT + 2}"],
                     env={"RANK": str(i), "WORLD_SIZE": "2", "MWRT_JOB_SECRET": "",
                          "MWRT_KEY_FILE": ""},
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, h in enumerate(hosts2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        outs.append(err)
        assert proc.returncode != 0
    assert any("MWRT_JOB_SECRET" in err for err in outs), outs


SPMD_EXAMPLES = ["all_gather.py", "all_reduce_subgroup.py", "broadcast.py",
                 "data_parallel_training.py", "p2p_isend_irecv.py", "p2p_send_recv.py",
                 "scatter_gather.py"]


@pytest.mark.parametrize("example", SPMD_EXAMPLES)
def test_the_tutorials_run_across_hosts(hosts2, example):
    """Each seed tutorial, unchanged: mwrt-launch on both hosts, two ranks each."""
    path = os.path.join(ROOT, "examples", example)

    def argv(i):
        return [sys.executable, "-m", "mwrt.distributed.launch", "--nnodes", "2", "--node-rank",
                str(i), "--nproc-per-node", "2", "--master-addr", hosts2[0].addr,
                "--master-port", str(PORT + 3), path]

    outs = run_ranks(hosts2, argv, lambda i: SECRET)  # every rank exited 0
    assert "[rank 0]" in outs[0], outs


def test_a_mismatch_across_hosts_is_named_on_every_rank_under_two_level(hosts2):
    """Rank 3 (second host) disagrees: the check on the whole group, before the two levels
    move anything, tells all four ranks, naming rank 3's shape."""
    program = os.path.join(ROOT, "tests", "programs", "spmd_mismatch.py")

    def argv(i):
        return [sys.executable, "-m", "mwrt.distributed.launch", "--nnodes", "2", "--node-rank",
                str(i), "--nproc-per-node", "2", "--master-addr", hosts2[0].addr,
                "--master-port", str(PORT + 4), program]

    text = "".join(run_ranks(hosts2, argv, lambda i: SECRET))
    for rank in range(4):
        line = next(ln for ln in text.splitlines() if f"] rank {rank}: " in ln)
        assert "CollectiveMismatchError" in line and "rank 3: " in line and "1001" in line, line


def test_ranks_interleaved_across_hosts_run_two_level_correctly(hosts2):
    """Ranks 0 and 2 on one host, 1 and 3 on the other: leaders and roots are mapped, not
    assumed contiguous."""
    import subprocess

    procs = [hosts2[r % 2].popen([sys.executable, PROGRAM, f"tcp://{hosts2[0].addr}:{PORT + 5}"],
                                 env=dict(SECRET, RANK=str(r), WORLD_SIZE="4", ITERATIONS="40"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(4)]
    outs = finish(procs)
    for rank, out in enumerate(outs):
        assert f"rank {rank} of 4: ok" in out and "two-level" in out, out

"""mwrt as a torch.distributed backend: DDP on "mwrt" matches gloo; the usual calls work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install mwrt[torch])")

from tests.support import machine  # noqa: E402 - after the importorskip
from tests.support.torchspawn import spawn  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_ranks(modes: str, backend: str, folder, n: int = 2, timeout: float = 90,
              codes=None) -> list:
    """Run torch_ranks.py MODES (comma-separated, in one process group) on n ranks under
    env://; each rank's saved {mode: result} (None for a rank expected to exit with a code
    other than 0)."""
    return spawn("torch_ranks.py", [modes, backend], str(folder / f"{modes}-{backend}"), n=n,
                 timeout=timeout, codes=codes)


@pytest.fixture(scope="module")
def on_mwrt(tmp_path_factory):
    """What ddp, calls and mismatch gave on the "mwrt" backend: one run of two ranks for the
    three (each rank's start, torch's import, is most of a run's CPU), mismatch last, as it
    breaks the group."""
    return run_ranks("ddp,calls,mismatch", "mwrt", tmp_path_factory.mktemp("torch_ranks"))


def test_ddp_on_mwrt_matches_gloo(on_mwrt, tmp_path):
    gloo = run_ranks("ddp", "gloo", tmp_path)
    assert on_mwrt[0]["backend"] == "mwrt" and gloo[0]["backend"] == "gloo"
    ours, theirs = [got["ddp"] for got in on_mwrt], gloo[0]["ddp"]
    for key in theirs:
        torch.testing.assert_close(ours[0][key], ours[1][key], rtol=0, atol=0)
        torch.testing.assert_close(ours[0][key], theirs[key])


def test_collectives_through_torch_distributed(on_mwrt):
    for rank, got in enumerate(got["calls"] for got in on_mwrt):
        assert got["all_reduce"].tolist() == [1.0, 3.0, 5.0, 7.0]
        assert got["broadcast"].tolist() == [1.0, 1.0, 1.0]
        assert got["all_gather"].tolist() == [[0, 0], [1, 10]]
        assert got["max"].tolist() == [1.0]
        assert got["into_tensor"].tolist() == [0.0, 0.5, 1.0, 1.5]
        assert got["recv"].tolist() == ([0.0, 0.0] if rank == 0 else [7.0, 8.0])
        if rank == 1:
            assert got["reduce"].tolist() == [3.0, 4.0]
        if rank == 0:
            assert got["gather"].tolist() == [[0.0, 0.0], [1.0, -1.0]]
        assert got["scatter"].tolist() == [5.0 + rank]
        assert got["reduce_scatter_tensor"].tolist() == [3.0 * (2 * rank), 3.0 * (2 * rank + 1)]
        assert got["reduce_scatter"].tolist() == [20 * rank + 1]
        assert got["all_to_all"].tolist() == [rank, 10.0 + rank]
        assert got["subgroup_avg"].tolist() == [0.5]


def test_an_mwrt_error_surfaces_with_its_text(on_mwrt):
    errors = [got["mismatch"]["error"] for got in on_mwrt]
    assert all(e.startswith("CollectiveMismatchError: all_reduce on torch group 0 (global "
                            "ranks [0, 1])") and "float32[3]" in e
               and "float32[4]" in e for e in errors), errors


@pytest.mark.parametrize("dead", [1, 0])
def test_a_dead_peer_is_named(tmp_path, monkeypatch, dead):
    """A rank that dies is named on the survivor, even rank 0, which serves torch's store."""
    monkeypatch.setenv("DEAD_RANK", str(dead))
    codes = [3 if r == dead else 0 for r in range(2)]
    error = run_ranks("peer_dies", "mwrt", tmp_path, codes=codes)[1 - dead]["peer_dies"]["error"]
    assert error.startswith("ChannelClosedError: all_reduce") and f"rank {dead}" in error, error


def test_the_ddp_example_runs_as_a_user_runs_it():
    example = os.path.join(ROOT, "examples", "torch_ddp.py")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, example], env=env, capture_output=True, text=True,
                          check=False, timeout=machine.seconds(60, 600))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 ranks on mwrt: weight error" in done.stdout, done.stdout

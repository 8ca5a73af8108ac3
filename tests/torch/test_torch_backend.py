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


def run_ranks(mode: str, backend: str, tmp_path, n: int = 2, timeout: float = 90,
              codes=None) -> list:
    """Run torch_ranks.py MODE on n ranks under env://; each rank's saved result (None for
    a rank expected to exit with a code other than 0)."""
    return spawn("torch_ranks.py", [mode, backend], str(tmp_path / f"{mode}-{backend}"), n=n,
                 timeout=timeout, codes=codes)


def test_ddp_on_mwrt_matches_gloo(tmp_path):
    ours, gloo = run_ranks("ddp", "mwrt", tmp_path), run_ranks("ddp", "gloo", tmp_path)
    assert ours[0]["backend"] == "mwrt" and gloo[0]["backend"] == "gloo"
    for key in gloo[0]:
        if key != "backend":
            torch.testing.assert_close(ours[0][key], ours[1][key], rtol=0, atol=0)
            torch.testing.assert_close(ours[0][key], gloo[0][key])


def test_collectives_through_torch_distributed(tmp_path):
    for rank, got in enumerate(run_ranks("calls", "mwrt", tmp_path)):
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


def test_an_mwrt_error_surfaces_with_its_text(tmp_path):
    errors = [got["error"] for got in run_ranks("mismatch", "mwrt", tmp_path)]
    assert all(e.startswith("CollectiveMismatchError: all_reduce on torch group 0 (global "
                            "ranks [0, 1])") and "float32[3]" in e
               and "float32[4]" in e for e in errors), errors


@pytest.mark.parametrize("dead", [1, 0])
def test_a_dead_peer_is_named(tmp_path, monkeypatch, dead):
    """A rank that dies is named on the survivor, even rank 0, which serves torch's store."""
    monkeypatch.setenv("DEAD_RANK", str(dead))
    codes = [3 if r == dead else 0 for r in range(2)]
    error = run_ranks("peer_dies", "mwrt", tmp_path, codes=codes)[1 - dead]["error"]
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

"""mwrt-launch --max-restarts: a failed rank restarts the whole group, which resumes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import mwrt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))

# Each rank counts steps in a file of its own (its "checkpoint"); rank 1 fails at step 2 of
# the first run only; a restart resumes from the file, and the job ends at step 4.
JOB = textwrap.dedent("""
    import os, sys, numpy as np
    import mwrt.distributed as dist
    dist.init_process_group("tcp", timeout=20)
    rank, restart = dist.get_rank(), int(os.environ["MWRT_RESTART_COUNT"])
    mark = os.path.join(sys.argv[1], f"rank{rank}")
    step = int(open(mark).read()) if os.path.exists(mark) else 0
    print("restart", restart, "from step", step, flush=True)
    while step < 4:
        a = np.ones(1)
        dist.all_reduce(a)
        step += 1
        open(mark, "w").write(str(step))
        if rank == 1 and step == 2 and restart == int(sys.argv[2]):
            sys.exit(3)
    dist.destroy_process_group()
    print("done", step, flush=True)
""")


def _launch(tmp_path, max_restarts: int, fail_on: int):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT,
                                                                   os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "mwrt.distributed.launch", "--nproc-per-node",
                           "2", "--max-restarts", str(max_restarts), str(script), str(tmp_path),
                           str(fail_on)], capture_output=True, text=True, env=env, timeout=100)


def test_a_failed_rank_restarts_the_group_which_resumes(tmp_path):
    res = _launch(tmp_path, max_restarts=2, fail_on=0)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "rank 1" in res.stderr and "exited with code 3" in res.stderr
    assert "restarting every rank (restart 1 of 2, MWRT_RESTART_COUNT=1)" in res.stderr
    assert "[rank 1] restart 1 from step 2" in res.stdout
    assert "[rank 0] done 4" in res.stdout and "[rank 1] done 4" in res.stdout


def test_restarts_run_out(tmp_path):
    res = _launch(tmp_path, max_restarts=1, fail_on=-1)  # never fails: a clean run
    assert res.returncode == 0, res.stderr
    for mark in tmp_path.glob("rank*"):
        mark.unlink()
    script_fails_always = _launch(tmp_path, max_restarts=0, fail_on=0)
    assert script_fails_always.returncode == 3
    assert "restarting" not in script_fails_always.stderr


def test_a_failed_rank_that_printed_nothing_is_said_so(tmp_path):
    """The report named 'Its last lines:' and then none."""
    script = tmp_path / "quiet.py"
    script.write_text("import os, sys, time\n"
                      "sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT,
                                                                   os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-m", "mwrt.distributed.launch", "--nproc-per-node",
                          "2", str(script)], capture_output=True, text=True, env=env, timeout=100)
    assert res.returncode == 3, res.stderr
    assert "rank 1 (pid" in res.stderr and "exited with code 3; stopped the other ranks. It " \
        "printed nothing." in res.stderr, res.stderr

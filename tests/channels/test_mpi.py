"""The mpi channel and ranks started by cluster launchers: run under `mpiexec -n N` (MPICH
from the test extra), and with the variables `srun` sets, without mwrt-launch."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

import mwrt.distributed as dist
from mwrt.store.launchers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = os.path.join(ROOT, "tests", "programs")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep +
                       os.environ.get("PATH", ""))
needs_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
    reason="needs mpi4py and mpiexec (pip install 'mwrt[mpi]')")
pytestmark = pytest.mark.timeout(240)


def mpiexec(n: int, program: str, *args, **env) -> str:
    """Run `program` on n MPI ranks; their output, whose lines may interleave (an error with
    the output if any rank failed)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    res = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, program, *args],
                         env=dict(environ, **env), capture_output=True, text=True, timeout=200)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-2000:]}{res.stderr[-3000:]}"
    return res.stdout


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_the_channel_contract_holds_over_mpi(n):
    out = mpiexec(n, os.path.join(PROGRAMS, "mpi_channel.py"))
    assert all(f"rank {r} of {n}: mpi channel ok" in out for r in range(n)), out


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_collectives_are_mpis_own_and_still_checked(n):
    out = mpiexec(n, os.path.join(PROGRAMS, "mpi_collectives.py"))
    assert out.count("mpi collectives ok") == n, out


@needs_mpi
@pytest.mark.parametrize("n", [2, 4])
def test_every_spmd_call_over_mpi_under_mpirun(n):
    """init_process_group("mpi") with no MASTER_ADDR: rank 0 tells the others over MPI."""
    out = mpiexec(n, os.path.join(PROGRAMS, "spmd_calls.py"), BACKEND="mpi", ITERATIONS="30")
    assert all(f"rank {r} of {n}: ok (mpi," in out for r in range(n)), out


@needs_mpi
def test_mpirun_starts_ranks_of_another_backend():
    out = mpiexec(2, os.path.join(PROGRAMS, "spmd_calls.py"), BACKEND="tcp", ITERATIONS="10")
    assert out.count("of 2: ok (tcp,") == 2, out


def test_srun_variables_start_ranks_without_a_launcher():
    """What `srun -n 2 python train.py` gives each task: SLURM's variables, no RANK."""
    port = free_port()
    job = port - 29500 if 29500 <= port < 30500 else None
    procs = []
    for task in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "MASTER_"))}
        env.update(SLURM_PROCID=str(task), SLURM_NTASKS="2", SLURM_LOCALID=str(task),
                   SLURM_NTASKS_PER_NODE="2", SLURM_NODELIST="localhost",
                   SLURM_JOB_ID=str(job if job is not None else 1), ITERATIONS="5",
                   **({} if job is not None else {"MASTER_PORT": str(port)}))
        env.pop("WORLD_SIZE", None)
        procs.append(subprocess.Popen([sys.executable, os.path.join(PROGRAMS, "spmd_calls.py")],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    for task, proc in enumerate(procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert f"rank {task} of 2: ok" in out, out


def test_a_slurm_node_list_names_its_first_host():
    from mwrt.store.launchers import first_host, slurm_env

    assert first_host("gpu[03-05,07],cpu1") == "gpu03" and first_host("a1,b2") == "a1"
    env = slurm_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NODELIST": "n[7-8]",
                     "SLURM_JOB_ID": "1042", "SLURM_LOCALID": "1"})
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == \
        ("3", "4", "n7", "29542")
    assert slurm_env({}) is None


def test_mpi_availability_is_told_without_starting_mpi():
    started = "mpi4py.MPI" in sys.modules
    assert dist.is_mpi_available() == (importlib.util.find_spec("mpi4py") is not None)
    assert ("mpi4py.MPI" in sys.modules) == started  # asking did not initialize MPI

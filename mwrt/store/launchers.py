"""Where a rank learns its place: the variables torchrun and mwrt-launch set, or, for ranks
that a cluster's launcher started directly (`srun python train.py`, `mpirun -n 4 python
train.py`), the launcher's own.

SLURM names every task (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) and the nodes
(SLURM_NODELIST): the store runs on the first node, on a port derived from the job id, as
torch and Lightning do. mpirun (Open MPI's OMPI_COMM_WORLD_*, MPICH's PMI_*) names the
ranks but no host: rank 0 picks an address its peers can reach and a free port and tells
them over MPI itself (mpi4py), once, at init.
"""

from __future__ import annotations

import os
import re
import secrets
import socket

from ..errors import RendezvousError
from ..netaddr import LOOPBACK, resolve, route_source

_SLURM_PORT_BASE = 29500


def rank_env(rank: int, world_size: int, local_rank: int, local_world_size: int,
             master_addr: str, master_port: int) -> dict[str, str]:
    """The variables init_process_group(init_method='env://') reads, torchrun's names."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world_size), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port)}


def job_secret_env(env=os.environ) -> dict[str, str]:
    """A fresh MWRT_JOB_SECRET for the ranks of one host, unless the job has a secret."""
    if env.get("MWRT_JOB_SECRET") or env.get("MWRT_KEY_FILE"):
        return {}
    return {"MWRT_JOB_SECRET": secrets.token_hex(16)}


def free_port(host: str = LOOPBACK) -> int:
    """An ephemeral port that was free a moment ago (rank 0's store binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'gpu[03-05,07],cpu1' -> 'gpu03'."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise RendezvousError(f"SLURM_NODELIST: cannot parse {nodelist!r} (expected a SLURM "
                              "node list such as 'gpu[03-05,07],cpu1')")
    prefix, ranges = m.group(1), m.group(2)
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def slurm_env(env=os.environ) -> dict[str, str] | None:
    """This task's variables under `srun`, or None outside SLURM."""
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return None
    port = int(env.get("MASTER_PORT") or
               _SLURM_PORT_BASE + int(env.get("SLURM_JOB_ID", "0")) % 1000)
    addr = env.get("MASTER_ADDR") or first_host(
        env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST", LOOPBACK))
    local_size = int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0])
    return rank_env(_int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"),
                    int(env.get("SLURM_LOCALID", "0")), local_size, addr, port)


# (rank, size, local rank, local size) as each MPI names them.
_MPI_VARIABLES = [
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),  # Open MPI
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # MPICH (hydra)
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),  # PMIx launchers
]


def mpi_env(env=os.environ) -> dict[str, str] | None:
    """This rank's variables under `mpirun`/`mpiexec`, or None outside MPI."""
    for rank_var, size_var, local_var, local_size_var in _MPI_VARIABLES:
        if rank_var in env and size_var in env:
            rank, size = _int(env, rank_var), _int(env, size_var)
            local, local_size = int(env.get(local_var, "0")), int(env.get(local_size_var, "0"))
            addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
            if not (addr and port):
                addr, port = _agree_on_store(rank, local_size == size)
            return rank_env(rank, size, local, local_size or 1, addr, int(port))
    return None


def launched(env=os.environ) -> bool:
    """True when a launcher started this process as a rank: torchrun, mwrt-launch,
    dist.spawn (RANK), srun or mpirun (their rank variables)."""
    names = ["RANK", "SLURM_PROCID"] + [rank for rank, _, _, _ in _MPI_VARIABLES]
    return any(name in env for name in names)


def launcher_env(env=os.environ) -> dict[str, str]:
    """What env:// needs that the launcher did not set as torchrun does: {} when RANK is set
    (torchrun, mwrt-launch, dist.spawn), else SLURM's or MPI's, else {}."""
    if "RANK" in env:
        return {}
    return slurm_env(env) or mpi_env(env) or {}


def _agree_on_store(rank: int, one_host: bool) -> tuple[str, int]:
    """Rank 0's store address, sent to every rank over MPI: loopback when all share a host,
    else rank 0's address on the route to another rank's host."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise RendezvousError(
            "env://: started by mpirun without MASTER_ADDR/MASTER_PORT; rank 0 tells the "
            "others its store address over MPI, which needs mpi4py (pip install 'mwrt[mpi]'), "
            f"or set MASTER_ADDR and MASTER_PORT for every rank ({exc})") from exc
    comm = MPI.COMM_WORLD
    hosts = comm.allgather(socket.gethostname())
    found = None
    if rank == 0:
        others = [h for h in hosts if h != hosts[0]]
        addr = LOOPBACK if one_host or not others else route_source(resolve(others[0], "host"))
        found = (addr, free_port(addr))
    return comm.bcast(found, root=0)


def _int(env, name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise RendezvousError(f"{name}: not an int (got {env[name]!r})") from None

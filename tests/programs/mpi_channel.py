"""The channel contract over the mpi channel, run by tests under `mpiexec -n N`.

    mpiexec -n 2 python mpi_channel.py

Prints 'rank R of N: mpi channel ok' when every check passed.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.channels.test_channels import contract_body  # noqa: E402  (the contract every channel passes)

from mwrt import channels  # noqa: E402
from mwrt.errors import ChannelError, ChannelTimeoutError, ConfigError  # noqa: E402
from mwrt.store import HashStore  # noqa: E402


def mismatch_and_timeout(ch) -> None:
    """A wrong size is a named error (and the next message still arrives); a timeout names
    the peer and tag."""
    if ch.rank == 0:
        ch.send(np.zeros(10, np.float32), 1, tag=3)
        ch.send(np.arange(4, dtype=np.int64), 1, tag=3)
    elif ch.rank == 1:
        try:
            ch.recv(np.zeros(12, np.float32), 0, tag=3)
            raise AssertionError("a 40-byte message filled a 48-byte buffer")
        except ChannelError as exc:
            assert "got 40 bytes, expected 48 bytes (float32[12])" in str(exc), exc
        box = np.zeros(4, np.int64)
        ch.recv(box, 0, tag=3)
        assert box.tolist() == [0, 1, 2, 3]
        try:
            ch.recv(np.zeros(1), 0, tag=9, timeout=0.2)
            raise AssertionError("a receive of nothing returned")
        except ChannelTimeoutError as exc:
            assert "rank 1<-0 tag 9" in str(exc) and "0.2 s" in str(exc), exc


def main() -> None:
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    try:
        channels.create("mpi", (rank + 1) % size, size, store=HashStore())
        raise AssertionError("a channel rank other than the MPI rank was accepted")
    except ConfigError as exc:
        assert f"is MPI rank {rank} of {size}" in str(exc), exc
    ch = channels.create("mpi", rank, size, store=HashStore(), timeout=30)
    try:
        contract_body(ch)
        MPI.COMM_WORLD.Barrier()
        if size >= 2:
            mismatch_and_timeout(ch)
        assert ch.mpi_tag((2 << 56) | (3 << 32) | 5) != ch.mpi_tag(5)  # spaces stay apart
    finally:
        MPI.COMM_WORLD.Barrier()
        ch.close()
    print(f"rank {rank} of {size}: mpi channel ok", flush=True)


if __name__ == "__main__":
    main()

"""The mpi channel: point-to-point over MPI (mpi4py), for jobs that `mpirun` or `srun` starts.

Channel rank r is MPI rank r of MPI_COMM_WORLD (checked at construction); the channel
talks on its own duplicate of the world communicator, so it never matches the program's
own MPI messages. MPI brings the transport a cluster already tuned (shared memory inside
a node, InfiniBand or TCP between nodes); this file adds only what the contract asks of
every channel: timeouts that name the peer, sizes checked before the bytes land, and a
receive of any size.

Receives match with a probe first (MPI_Improbe), so the message's size is known before a
byte moves: a mismatch is a named error, not MPI's truncation abort, and a receive that
times out leaves nothing posted. Sends are MPI_Isend polled to completion; MPI may hold a
large send until the peer receives it, so sends are not buffered (`buffered_sends` False).

MPI tags are short (at least 2**15; MPICH 2**29, Open MPI 2**31): a 64-bit mwrt tag is
folded into them as (top bits, group bits, low bits). Two tags that fold alike only
meet if both are in flight between the same two ranks at once and are received out of
their send order; collectives of one group never are.
"""

from __future__ import annotations

import os
import time

from ..errors import ChannelClosedError, ChannelTimeoutError, ConfigError
from .base import DataChannel, size_mismatch

try:  # imported when the channel is first asked for: this initializes MPI
    from mpi4py import MPI
except ImportError as exc:
    raise ImportError("mpi channel: needs mpi4py and an MPI library; pip install 'mwrt[mpi]' "
                      "(MPICH from PyPI), or mpi4py built against your cluster's MPI "
                      f"({exc})") from exc

_SPIN_SECONDS = 20e-6  # a waiting rank tests flat out this long (peers answer in µs), then
_YIELD_SECONDS = 1.0  # tests, yielding the CPU between tests, this long, as MPI_Wait would
_MAX_SLEEP = 1e-3


class MpiChannel(DataChannel):
    """Point-to-point bytes between the ranks of MPI_COMM_WORLD."""

    name = "mpi"
    native_collectives = "mpi"  # MPI's own collectives (mwrt.collective.mpi_ops)
    any_size_recv = True  # a probe tells the size before the receive
    eager_bytes = 0  # MPI_Send may wait for the matching receive: never send-then-receive

    def __init__(self, rank, world_size, *, store, prefix="mwrt", key=None, timeout=None):
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)
        world = MPI.COMM_WORLD
        if (world.Get_rank(), world.Get_size()) != (rank, world_size):
            raise ConfigError(
                f"mpi channel: rank {rank} of {world_size} is MPI rank {world.Get_rank()} of "
                f"{world.Get_size()}; start every rank with mpirun/srun, and let RANK and "
                "WORLD_SIZE come from MPI (unset them)")
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise ConfigError("mpi channel: the MPI library was initialized without "
                              "MPI_THREAD_MULTIPLE (asynchronous sends and receives run on "
                              "threads); leave mpi4py.rc.thread_level at 'multiple'")
        self.comm = world.Dup()
        bits = int(world.Get_attr(MPI.TAG_UB)).bit_length()
        self._low_bits = bits - 2 - min(8, bits - 14)
        self._group_bits = bits - 2 - self._low_bits

    def mpi_tag(self, tag: int) -> int:
        """The MPI tag that carries 64-bit mwrt tag `tag`: top 2 bits, group, low bits."""
        low = tag & ((1 << self._low_bits) - 1)
        group = (tag >> 32) & ((1 << self._group_bits) - 1)
        return (((tag >> 56) & 3) << (self._group_bits + self._low_bits)) | \
               (group << self._low_bits) | low

    # -- the contract ----------------------------------------------------------------

    def _send(self, view, peer, tag, timeout, desc):
        request = self.comm.Isend([view, MPI.BYTE], dest=peer, tag=self.mpi_tag(tag))
        self._wait_sent(request, peer, tag, timeout, desc)

    def _recv(self, view, peer, tag, timeout, desc):
        message, nbytes = self._probe(peer, tag, timeout)
        if nbytes != view.nbytes:
            message.Recv(bytearray(nbytes))  # take it, so the next receive is not stuck behind
            raise size_mismatch(self, peer, tag, f"{nbytes} bytes", desc)
        message.Recv([view, MPI.BYTE])

    def _recv_message(self, peer, tag, timeout):
        message, nbytes = self._probe(peer, tag, timeout)
        buf = bytearray(nbytes)
        message.Recv([buf, MPI.BYTE])
        return memoryview(buf)

    def _exchange_message(self, view, peer, tag, timeout, desc):
        # Start the send before receiving: MPI may hold it until the peer receives, and the
        # peer is sending to us first too.
        request = self.comm.Isend([view, MPI.BYTE], dest=peer, tag=self.mpi_tag(tag))
        got = self._recv_message(peer, tag, timeout)
        self._wait_sent(request, peer, tag, timeout, desc)
        return got

    def arrived(self, peer: int, tag: int = 0) -> bool:
        self._check(peer, tag)
        return bool(self.comm.Iprobe(source=peer, tag=self.mpi_tag(tag)))

    def _close(self) -> None:
        if not MPI.Is_finalized():
            self.comm.Free()

    # -- waiting ---------------------------------------------------------------------

    def _wait_sent(self, request, peer: int, tag: int, timeout: float, desc: str) -> None:
        what = f"mpi send rank {self.rank}->{peer} tag {tag} ({desc})"
        self._poll(request.Test, time.monotonic() + timeout, what, timeout, peer)

    def _probe(self, peer: int, tag: int, timeout: float):
        """The matched next message from `peer` on `tag`, and its size in bytes."""
        status, found = MPI.Status(), []

        def matched() -> bool:
            message = self.comm.Improbe(source=peer, tag=self.mpi_tag(tag), status=status)
            if message is not None:
                found.append(message)
            return message is not None

        what = f"mpi recv rank {self.rank}<-{peer} tag {tag}"
        self._poll(matched, time.monotonic() + timeout, what, timeout, peer)
        return found[0], status.Get_count(MPI.BYTE)

    def _poll(self, done, deadline: float, what: str, timeout: float, peer: int) -> None:
        poll(done, deadline, what, timeout, lambda: self.closed,
             f"is rank {peer} alive and in the same call?", peer)


def poll(done, deadline: float, what: str, timeout: float, closed=lambda: False,
         hint: str = "", peer: int | None = None) -> None:
    """Call `done()` until it is true, a named error at the deadline (MPI itself never times
    out). Test without sleeping, as MPI's blocking calls do: MPI moves a nonblocking
    operation's bytes only inside its calls, so sleeping between tests would stall the
    transfer itself; but yield the CPU between tests after a few microseconds, or ranks
    that outnumber the cores starve the ones they wait for. A wait that outlasts a second
    is a late peer: then sleep, with a growing backoff."""
    start = time.monotonic()
    spin_until, yield_until, sleep = start + _SPIN_SECONDS, start + _YIELD_SECONDS, 1e-5
    while not done():
        if closed():
            raise ChannelClosedError(f"{what}: the channel was closed", peer=peer)
        now = time.monotonic()
        if now > deadline:
            raise ChannelTimeoutError(f"{what}: not done after {timeout} s; {hint}")
        if now > yield_until:
            time.sleep(sleep)
            sleep = min(sleep * 2, _MAX_SLEEP)
        elif now > spin_until:
            os.sched_yield()

"""Large shm transfers in chunks, through slots (two copies) or read in place (one): a peer
killed part-way through a message, a kernel that refuses the in-place read, odd sizes."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import multiprocessing
import os
import signal

import numpy as np
import pytest
from tests.channels.test_channels import DirStore
from tests.support import machine

from mwrt import channels
from mwrt.channels.memorypaths import CmaPath
from mwrt.errors import ChannelClosedError

SLOT = 64 << 10  # small slots: a 1 MiB message is 16 chunks through 2 of them
MESSAGE = (1 << 20) + 13


def _bound(quiet: float) -> float:
    """A wait that a quiet machine meets in `quiet` s, scaled by the load: a spawned rank
    imports NumPy and mwrt first, which took past 20 s at load 20 on 2 cores."""
    return machine.seconds(quiet, 10 * quiet)


def _die_at(method: str, calls: int) -> None:
    """SIGKILL this process when CmaPath.`method` (the shm channel's path) is called the
    (calls+1)-th time."""
    seen, original = [0], getattr(CmaPath, method)

    def counting(self, *args):
        if seen[0] == calls:
            os.kill(os.getpid(), signal.SIGKILL)
        seen[0] += 1
        return original(self, *args)

    setattr(CmaPath, method, counting)


@contextlib.contextmanager
def _spawned(tmp_path, target, *arglists):
    """One spawned process per tuple of `arglists`, each running target(path, *args)."""
    procs = [multiprocessing.get_context("spawn").Process(
        target=target, args=(str(tmp_path), *args), daemon=True) for args in arglists]
    for proc in procs:
        proc.start()
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.join()
            proc.close()


@contextlib.contextmanager
def _beside(tmp_path, target, *args):
    """Rank 1 as a spawned process running target(path, *args); yields (it, rank 0)."""
    with _spawned(tmp_path, target, args) as (child,):
        ch = channels.create("shm", 0, 2, store=DirStore(tmp_path), timeout=_bound(20))
        try:
            yield child, ch
        finally:
            ch.close()


def _send_and_die(path: str, chunks: int, in_place: str) -> None:
    """Rank 1: send MESSAGE bytes to rank 0, and SIGKILL ourselves before chunk `chunks`."""
    os.environ["MWRT_SHM_SLOT_BYTES"], os.environ["MWRT_SHM_SLOTS"] = str(SLOT), "2"
    os.environ["MWRT_SHM_CMA"] = in_place
    _die_at("send_segment", chunks)
    ch = channels.create("shm", 1, 2, store=DirStore(path), timeout=_bound(20))
    ch.send(np.ones(1), 0)  # connected: the parent posts its large receive after this
    DirStore(path).get("posted")
    ch.send(np.arange(MESSAGE, dtype=np.uint64).astype(np.uint8), 0, tag=9)


@pytest.mark.parametrize("in_place", ["1", "0"])
@pytest.mark.parametrize("chunks", [1, 7, 16])  # after the first, mid-message, before the last
def test_a_sender_killed_mid_message_is_a_named_error_within_the_timeout(tmp_path, chunks,
                                                                         in_place):
    with _beside(tmp_path, _send_and_die, chunks, in_place) as (child, ch):
        ch.recv(np.zeros(1), 1)
        work = ch.irecv(np.zeros(MESSAGE, np.uint8), 1, tag=9)
        DirStore(tmp_path).set("posted", b"1")
        with pytest.raises(ChannelClosedError, match="rank 1") as info:
            work.wait(_bound(15))
        assert info.value.peer == 1
        child.join(_bound(10))
        assert child.exitcode == -signal.SIGKILL
        assert glob.glob(f"/dev/shm/mwrt-{child.pid}-*") == []  # mapped, then unlinked


def _echo(path: str, in_place: str) -> None:
    """Rank 1: send back every message rank 0 sends, until an empty one."""
    os.environ["MWRT_SHM_SLOT_BYTES"], os.environ["MWRT_SHM_SLOTS"] = str(SLOT), "3"
    os.environ["MWRT_SHM_CMA"], os.environ["MWRT_SHM_CMA_BYTES"] = in_place, str(SLOT)
    ch = channels.create("shm", 1, 2, store=DirStore(path), timeout=_bound(20))
    try:
        while True:
            size = np.zeros(1, np.int64)
            ch.recv(size, 0, tag=1)
            if size[0] < 0:
                return
            buf = np.empty(int(size[0]), np.uint8)
            ch.recv(buf, 0, tag=2)
            ch.send(buf, 0, tag=3)
    finally:
        ch.close()


@pytest.mark.parametrize("in_place", ["1", "0"])
def test_odd_sizes_around_chunk_boundaries_go_and_come_back_intact(tmp_path, monkeypatch,
                                                                   in_place):
    monkeypatch.setenv("MWRT_SHM_SLOT_BYTES", str(SLOT))
    monkeypatch.setenv("MWRT_SHM_SLOTS", "3")
    monkeypatch.setenv("MWRT_SHM_CMA", in_place)
    monkeypatch.setenv("MWRT_SHM_CMA_BYTES", str(SLOT))  # from one slot: in place
    with _beside(tmp_path, _echo, in_place) as (child, ch):
        pids = (child.pid, os.getpid())
        rng = np.random.default_rng(5)
        for n in (SLOT - 1, SLOT, SLOT + 1, 2 * SLOT - 1, 3 * SLOT, 3 * SLOT + 1,
                  4 * SLOT + 17, 3 << 20, 10 * SLOT + 4093):
            data = rng.integers(0, 256, n, dtype=np.uint8)
            back = np.zeros(n, np.uint8)
            ch.send(np.array([n], np.int64), 1, tag=1)
            work = ch.irecv(back, 1, tag=3)
            ch.send(data, 1, tag=2)
            work.wait(_bound(20))
            np.testing.assert_array_equal(back, data, err_msg=f"{n} bytes")
        ch.send(np.array([-1], np.int64), 1, tag=1)
        child.join(_bound(20))
        assert child.exitcode == 0
    for pid in pids:
        assert glob.glob(f"/dev/shm/mwrt-{pid}-*") == []


def _receive_and_die(path: str, frames: int) -> None:
    """Rank 1: receive a message read in place, and SIGKILL ourselves at frame `frames`."""
    _die_at("_read_in_place", frames)
    ch = channels.create("shm", 1, 2, store=DirStore(path), timeout=_bound(20))
    ch.recv(np.zeros(MESSAGE, np.uint8), 0, tag=9)


@pytest.mark.parametrize("frames", [0, 3])  # the first (the peer's probe), a later one
def test_a_receiver_killed_while_reading_in_place_fails_the_send_naming_it(
        tmp_path, monkeypatch, frames):
    monkeypatch.setenv("MWRT_SHM_SLOT_BYTES", str(SLOT))  # 1 MiB: 17 segments in place
    with _beside(tmp_path, _receive_and_die, frames) as (_, ch):
        with pytest.raises(ChannelClosedError, match="rank 1") as info:
            ch.send(np.ones(MESSAGE, np.uint8), 1, tag=9, timeout=_bound(15))
        assert info.value.peer == 1


_CAP_SYS_PTRACE = 19


def _drop_ptrace_capability() -> None:
    """Leave this process unable to read a non-dumpable process's memory, even as root."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this pid
    data = (ctypes.c_uint32 * 6)()  # two of (effective, permitted, inheritable)
    if libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0] &= ~(1 << _CAP_SYS_PTRACE)
    data[1] &= ~(1 << _CAP_SYS_PTRACE)
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _refusal_rank(path: str, rank: int) -> None:
    """Rank 1 sends two messages from a non-dumpable process; rank 0 may not read it."""
    os.environ["MWRT_SHM_SLOT_BYTES"] = str(SLOT)
    libc = ctypes.CDLL(None, use_errno=True)
    if rank == 1:
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the kernel refuses others' reads
    else:
        _drop_ptrace_capability()
    ch = channels.create("shm", rank, 2, store=DirStore(path), timeout=_bound(20))
    try:
        data = np.arange(MESSAGE, dtype=np.uint64).astype(np.uint8)
        for tag in (1, 2):
            if rank == 1:
                ch.send(data, 0, tag=tag)
            else:
                out = np.zeros(MESSAGE, np.uint8)
                ch.recv(out, 1, tag=tag)
                np.testing.assert_array_equal(out, data)
        if rank == 1:
            assert ch._outbound[0].cma is False  # refused once: slots from then on
        ch.recv(np.zeros(1), 1 - rank, tag=3) if rank else ch.send(np.ones(1), 1, tag=3)
    finally:
        ch.close()


def test_a_receiver_the_kernel_refuses_gets_the_message_through_slots(tmp_path):
    with _spawned(tmp_path, _refusal_rank, (0,), (1,)) as procs:
        for proc in procs:
            proc.join(_bound(60))
        assert [proc.exitcode for proc in procs] == [0, 0]

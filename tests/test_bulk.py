"""Large shm transfers in chunks: a sender killed part-way through a message, odd sizes."""

from __future__ import annotations

import glob
import multiprocessing
import os
import signal

import numpy as np
import pytest
from test_channels import DirStore

from mwrt import channels
from mwrt.channels.shm import ShmChannel
from mwrt.errors import ChannelClosedError

SLOT = 64 << 10  # small slots: a 1 MiB message is 16 chunks through 2 of them
MESSAGE = (1 << 20) + 13


def _send_and_die(path: str, chunks: int) -> None:
    """Rank 1: send MESSAGE bytes to rank 0, and SIGKILL ourselves before chunk `chunks`."""
    os.environ["MWRT_SHM_SLOT_BYTES"], os.environ["MWRT_SHM_SLOTS"] = str(SLOT), "2"
    sent = [0]
    send_segment = ShmChannel._send_segment

    def counting(self, *args):
        if sent[0] == chunks:
            os.kill(os.getpid(), signal.SIGKILL)
        sent[0] += 1
        return send_segment(self, *args)

    ShmChannel._send_segment = counting
    ch = channels.create("shm", 1, 2, store=DirStore(path), timeout=20)
    ch.send(np.ones(1), 0)  # connected: the parent posts its large receive after this
    DirStore(path).get("posted")
    ch.send(np.arange(MESSAGE, dtype=np.uint64).astype(np.uint8), 0, tag=9)


@pytest.mark.parametrize("chunks", [1, 7, 16])  # after the first, mid-message, before the last
def test_a_sender_killed_mid_message_is_a_named_error_within_the_timeout(tmp_path, chunks):
    child = multiprocessing.get_context("spawn").Process(
        target=_send_and_die, args=(str(tmp_path), chunks), daemon=True)
    child.start()
    ch = channels.create("shm", 0, 2, store=DirStore(tmp_path), timeout=20)
    try:
        ch.recv(np.zeros(1), 1)
        out = np.zeros(MESSAGE, np.uint8)
        work = ch.irecv(out, 1, tag=9)
        DirStore(tmp_path).set("posted", b"1")
        with pytest.raises(ChannelClosedError, match="rank 1") as info:
            work.wait(15)
        assert info.value.peer == 1
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
        assert glob.glob(f"/dev/shm/mwrt-{child.pid}-*") == []  # mapped, then unlinked
    finally:
        child.kill()
        child.join()
        child.close()
        ch.close()


def _echo(path: str) -> None:
    """Rank 1: send back every message rank 0 sends, until an empty one."""
    os.environ["MWRT_SHM_SLOT_BYTES"], os.environ["MWRT_SHM_SLOTS"] = str(SLOT), "3"
    ch = channels.create("shm", 1, 2, store=DirStore(path), timeout=20)
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


def test_odd_sizes_around_chunk_boundaries_go_and_come_back_intact(tmp_path, monkeypatch):
    monkeypatch.setenv("MWRT_SHM_SLOT_BYTES", str(SLOT))
    monkeypatch.setenv("MWRT_SHM_SLOTS", "3")
    child = multiprocessing.get_context("spawn").Process(target=_echo, args=(str(tmp_path),),
                                                         daemon=True)
    child.start()
    pids = (child.pid, os.getpid())
    ch = channels.create("shm", 0, 2, store=DirStore(tmp_path), timeout=20)
    try:
        rng = np.random.default_rng(5)
        for n in (SLOT - 1, SLOT, SLOT + 1, 2 * SLOT - 1, 3 * SLOT, 3 * SLOT + 1,
                  4 * SLOT + 17, 3 << 20, 10 * SLOT + 4093):
            data = rng.integers(0, 256, n, dtype=np.uint8)
            back = np.zeros(n, np.uint8)
            ch.send(np.array([n], np.int64), 1, tag=1)
            work = ch.irecv(back, 1, tag=3)
            ch.send(data, 1, tag=2)
            work.wait(20)
            np.testing.assert_array_equal(back, data, err_msg=f"{n} bytes")
        ch.send(np.array([-1], np.int64), 1, tag=1)
        child.join(20)
        assert child.exitcode == 0
    finally:
        child.kill()
        child.join()
        child.close()
        ch.close()
    for pid in pids:
        assert glob.glob(f"/dev/shm/mwrt-{pid}-*") == []

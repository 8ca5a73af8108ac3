"""The channel contract, one body run over every registered channel at world size 1, 2 and 3.

Ranks are threads sharing a HashStore for speed; a few tests run ranks as real
processes (spawn) that meet through `DirStore`, a directory of files, so this file
does not depend on the rendezvous branch. A tiny segment size reaches the
multi-segment and shared-memory slot paths with small arrays.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from multiprocessing import resource_tracker

import numpy as np
import pytest

from mwrt import channels
from mwrt.channels.shm import reap_orphan_segments
from mwrt.errors import AuthError, ChannelClosedError, ChannelError, ChannelTimeoutError
from mwrt.protocol.auth import generate_hmac_key
from mwrt.store import HashStore
from tests.support import machine

NAMES = ["inproc", "tcp", "shm", "auto"]
SOCKET_NAMES = ["tcp", "shm", "auto"]
SEGMENT = 4096
SIZES = [0, 1, 7, 1000, 3 * SEGMENT + 5]  # the last: several segments, and shm slots
DTYPES = [np.uint8, np.int32, np.float32, np.float64, np.complex64]
JOIN = 60.0


@pytest.fixture(scope="module", autouse=True)
def no_leaks():
    """After the module: no /dev/shm/mwrt* file, no extra fd, no stray thread."""
    resource_tracker.ensure_running()  # spawn starts it once and keeps its pipe for good
    fds, threads = set(os.listdir("/proc/self/fd")), threading.active_count()
    os.environ["MWRT_SEGMENT_BYTES"] = str(SEGMENT)
    try:
        yield
    finally:
        del os.environ["MWRT_SEGMENT_BYTES"]
    deadline = time.monotonic() + 5
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert machine.segments([os.getpid(), *_SPAWNED]) == []
    leaked = set(os.listdir("/proc/self/fd")) - fds
    assert not leaked, {fd: _readlink(f"/proc/self/fd/{fd}") for fd in leaked}
    assert threading.active_count() <= threads, threading.enumerate()


def _readlink(path):
    try:
        return os.readlink(path)
    except OSError:
        return "?"


class DirStore:
    """A store that is a directory of files, for ranks in separate processes."""

    def __init__(self, path, timeout=None):
        # A peer is a spawned process that imports NumPy and mwrt first: 10 s on a quiet
        # machine is room to spare, and under load it takes longer.
        self.path, self.timeout = path, machine.seconds(10, 120) if timeout is None else timeout

    def set(self, key, value):
        target = os.path.join(self.path, key.replace("/", "%"))
        with open(target + ".tmp", "wb") as f:
            f.write(value.encode() if isinstance(value, str) else value)
        os.replace(target + ".tmp", target)

    def get(self, key, timeout=None):
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        target = os.path.join(self.path, key.replace("/", "%"))
        while not os.path.exists(target):
            if time.monotonic() > deadline:
                raise TimeoutError(f"DirStore: key {key!r} not set")
            time.sleep(0.005)
        with open(target, "rb") as f:
            return f.read()


def run_ranks(name, world, body, *, keys=None, timeout=10.0, **kwargs):
    """Run body(channel) on `world` rank threads; close every channel; raise the first error."""
    store, chans, errors = HashStore(timeout=timeout), [None] * world, []

    def rank_main(rank):
        try:
            key = None if keys is None else keys[rank]
            chans[rank] = channels.create(name, rank, world, store=store, key=key,
                                          timeout=timeout, **kwargs)
            body(chans[rank])
        except BaseException as exc:
            errors.append((rank, exc))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN)
    for ch in chans:
        if ch is not None:
            ch.close()
    if errors:
        raise errors[0][1]
    if any(t.is_alive() for t in threads):
        raise RuntimeError(f"{name}: rank threads still running after {JOIN} s")


def payload(dtype, n, src, salt=0):
    return (np.arange(n) * (src + 2) + salt).astype(dtype)


def contract_body(ch):
    """Everything a channel must do, from one rank's point of view."""
    rank, world = ch.rank, ch.world_size
    right, left = (rank + 1) % world, (rank - 1) % world
    for dtype in DTYPES:  # ring: every rank sends and receives at once
        for size in SIZES:
            n = size // np.dtype(dtype).itemsize
            out, got = payload(dtype, n, rank), np.empty(n, dtype)
            work = ch.isend(out, right, tag=7)
            ch.recv(got, left, tag=7)
            work.wait(10)
            np.testing.assert_array_equal(got, payload(dtype, n, left))
    big = 5 * SEGMENT + 3  # sends to everyone first: buffering receivers must stash
    # A channel whose sends are not buffered (MPI's may wait for the receive) starts them.
    send = ch.send if ch.buffered_sends else ch.isend
    sends = [send(payload(np.uint8, big, rank, peer), peer, tag=11)
             for peer in range(world) if peer != rank]
    for peer in range(world):
        if peer != rank:
            got = np.empty(big, np.uint8)
            ch.recv(got, peer, tag=11)
            np.testing.assert_array_equal(got, payload(np.uint8, big, peer, rank))
    for work in sends if not ch.buffered_sends else ():
        work.wait(10)
    if rank == 0:  # recv_message: any size, stashed first or awaited, several segments
        for size in SIZES:
            ch.send(payload(np.uint8, size, rank), 1, tag=21)
        ch.recv(np.empty(1, np.uint8), 1, tag=22)
        for size in SIZES:
            ch.send(payload(np.uint8, size, rank, 1), 1, tag=23)
    elif rank == 1:
        for size in SIZES:
            got = ch.recv_message(0, tag=21)
            np.testing.assert_array_equal(np.frombuffer(got, np.uint8), payload(np.uint8, size, 0))
        ch.send(np.zeros(1, np.uint8), 0, tag=22)
        for size in SIZES:
            got = ch.recv_message(0, tag=23)
            np.testing.assert_array_equal(np.frombuffer(got, np.uint8),
                                          payload(np.uint8, size, 0, 1))
    if world == 2:  # exchange_message: each sends, then takes the other's, any size
        for size in SIZES:
            got = ch.exchange_message(payload(np.uint8, size + rank, rank), right, tag=24)
            np.testing.assert_array_equal(np.frombuffer(got, np.uint8),
                                          payload(np.uint8, size + right, right))
    if rank == 0:  # out-of-order tags, and many messages in order on one tag
        for tag in (1, 2, 3):
            ch.send(np.full(3, tag, np.int64), 1, tag=tag)
        for i in range(200):
            ch.send(np.array([i], np.int64), 1, tag=4)
    elif rank == 1:
        got = np.empty(3, np.int64)
        for tag in (3, 2, 1):
            ch.recv(got, 0, tag=tag)
            assert (got == tag).all()
        works, bufs = [], [np.empty(1, np.int64) for _ in range(200)]
        for buf in bufs[:100]:
            works.append(ch.irecv(buf, 0, tag=4))
        for w in works:  # the base irecv (a helper thread) matches after a later recv may
            w.wait(10)
        for buf in bufs[100:]:
            ch.recv(buf, 0, tag=4)
        assert [int(b[0]) for b in bufs] == list(range(200))


@pytest.mark.parametrize("name", NAMES)
def test_world_size_one(name):
    def body(ch):
        with pytest.raises(ValueError, match="peer must be another rank"):
            ch.send(np.zeros(1), 0)

    run_ranks(name, 1, body)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", NAMES)
def test_contract(name, world):
    run_ranks(name, world, contract_body)


@pytest.mark.parametrize("name", NAMES)
def test_size_mismatch_names_both_sizes(name):
    def body(ch):
        if ch.rank == 0:
            ch.send(np.zeros(10, np.float32), 1)
            ch.send(np.zeros(5000, np.uint8), 1, tag=1)
        else:
            with pytest.raises(ChannelError, match=r"got 40 bytes \(float32\[10\]\), "
                                                   r"expected 48 bytes \(float32\[12\]\)"):
                ch.recv(np.zeros(12, np.float32), 0)
            time.sleep(0.2)  # let tag 1 arrive first, so the stashed path is checked too
            with pytest.raises(ChannelError, match="got 5000 bytes.*expected 4999 bytes"):
                ch.recv(np.zeros(4999, np.uint8), 0, tag=1)

    run_ranks(name, 2, body)


@pytest.mark.parametrize("name", NAMES)
def test_an_irecv_posted_after_a_message_of_another_size_fails_at_its_wait(name):
    """The receive takes the message (an empty one: its sender's op failed) and says so at
    wait(), as one that was posted first does; posting it raised before, and a worker that
    then received again on the tag waited out the channel's timeout."""
    def body(ch):
        if ch.rank == 0:
            ch.send(b"", 1, tag=2)
            ch.send(np.arange(3.0), 1, tag=2)
        else:
            deadline = time.monotonic() + JOIN
            while not ch.arrived(0, tag=2):
                assert time.monotonic() < deadline, "the empty message never arrived"
                time.sleep(0.01)
            work = ch.irecv(np.zeros(4, np.float32), 0, tag=2)
            with pytest.raises(ChannelError, match=r"got 0 bytes.*expected 16 bytes"):
                work.wait(JOIN)
            after = np.zeros(3)
            ch.recv(after, 0, tag=2)  # the next message on the tag is the next one sent
            np.testing.assert_array_equal(after, np.arange(3.0))

    run_ranks(name, 2, body)


@pytest.mark.parametrize("name", NAMES)
def test_recv_timeout_says_what_from_whom(name):
    def body(ch):
        if ch.rank == 1:
            start = time.monotonic()
            with pytest.raises(ChannelTimeoutError, match=r"rank 1.*0 tag 5.*0.2 s"):
                ch.recv(np.zeros(4), 0, tag=5, timeout=0.2)
            assert time.monotonic() - start < 2
            with pytest.raises(ChannelTimeoutError):
                ch.irecv(np.zeros(4), 0, tag=6).wait(0.1)
            with pytest.raises(ChannelTimeoutError, match=r"rank 1.*0 tag 7.*0.1 s"):
                ch.recv_message(0, tag=7, timeout=0.1)

    run_ranks(name, 2, body)


@pytest.mark.parametrize("name", NAMES)
def test_peer_close_fails_waiting_recv(name):
    ready = threading.Barrier(2, timeout=10)

    def body(ch):
        if ch.rank == 0:
            ch.send(np.ones(4), 1)
            ready.wait()
            time.sleep(0.1)
            ch.close()
        else:
            ch.recv(np.zeros(4), 0)
            work = ch.irecv(np.zeros(4), 0, tag=1)
            ready.wait()
            with pytest.raises(ChannelClosedError, match="rank 0") as info:
                work.wait(5)
            assert info.value.peer == 0

    run_ranks(name, 2, body)


@pytest.mark.parametrize("name", SOCKET_NAMES)
def test_fail_peer_ends_a_waiting_exchange(name):
    """A thread that reads the connection itself still hears fail_peer (a heartbeat's word)."""
    ready = threading.Barrier(2, timeout=10)

    def body(ch):
        if ch.rank == 0:
            ch.send(np.ones(1), 1)  # connect, so rank 1 can read from us directly
            ready.wait()
            ready.wait()
            return
        ch.recv(np.zeros(1), 0)
        ready.wait()
        threading.Timer(0.2, ch.fail_peer, (0, "missed its heartbeats")).start()
        with pytest.raises(ChannelClosedError, match="rank 0 missed its heartbeats") as info:
            ch.exchange_message(np.ones(4), 0, tag=3)
        assert info.value.peer == 0
        ready.wait()

    run_ranks(name, 2, body, timeout=30.0)


@pytest.mark.parametrize("name", SOCKET_NAMES)
def test_close_mid_transfer(name):
    big = 8 << 20

    def body(ch):
        if ch.rank == 0:
            ch.send(np.ones(1), 1)
            ch.isend(np.ones(big, np.uint8), 1, tag=1)
            ch.close()
        else:
            ch.recv(np.zeros(1), 0)
            try:
                ch.recv(np.zeros(big, np.uint8), 0, tag=1, timeout=5)
            except ChannelClosedError as exc:
                assert exc.peer == 0 and "rank 0" in str(exc)

    run_ranks(name, 2, body)


@pytest.mark.parametrize("name", SOCKET_NAMES)
def test_wrong_key_refused_logged_others_served(name, caplog):
    good, bad = generate_hmac_key(), generate_hmac_key()
    caplog.set_level(logging.WARNING, logger="mwrt.channels")

    def body(ch):
        if ch.rank == 2:
            with pytest.raises(AuthError, match=f"{name} channel rank 0 at"):
                ch.send(np.ones(4), 0)
        elif ch.rank == 1:
            ch.send(np.full(4, 7.0), 0)
        else:
            got = np.zeros(4)
            ch.recv(got, 1)
            assert (got == 7.0).all()

    run_ranks(name, 3, body, keys=[good, good, bad])
    assert any("refused a connection" in r.getMessage() for r in caplog.records)


def test_stray_connection_refused_then_served(caplog):
    caplog.set_level(logging.WARNING, logger="mwrt.channels")

    def body(ch):
        if ch.rank == 0:
            host, port = ch.store.get("mwrt/tcp/0").decode().split(":")
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.recv(64)
                s.sendall(b"x" * 200)  # garbage where the HMAC answer should be
                try:
                    assert s.recv(1) in (b"\x00", b"")
                except ConnectionResetError:
                    pass  # refused with our garbage unread: the kernel resets
            ch.recv(np.zeros(2), 1)
        else:
            time.sleep(0.1)
            ch.send(np.ones(2), 0)

    run_ranks("tcp", 2, body)
    assert any("refused a connection" in r.getMessage() for r in caplog.records)


def test_tcp_refuses_open_bind_without_key():
    with pytest.raises(ValueError, match="no secret"):
        channels.create("tcp", 0, 2, store=HashStore(), host="0.0.0.0")


def test_unknown_channel_lists_known():
    with pytest.raises(ValueError, match="known: auto, inproc, mpi, nccl, shm, tcp"):
        channels.get("carrier-pigeon")


# -- real processes ----------------------------------------------------------------------


def _proc_main(name, rank, world, path, mode):
    os.environ["MWRT_SEGMENT_BYTES"] = str(SEGMENT)
    ch = channels.create(name, rank, world, store=DirStore(path), timeout=20)
    try:
        if mode == "contract":
            contract_body(ch)
        elif mode == "send-big":
            ch.send(np.ones(1), 0)
            DirStore(path).set("ready", b"1")
            time.sleep(60)  # the parent stops, then kills us
        elif mode == "idle":
            DirStore(path).set("ready", b"1")
            time.sleep(60)
    finally:
        ch.close()


_SPAWNED: list[int] = []  # the ranks' pids, whose segments the module's check looks for


def _spawn(name, rank, world, path, mode):
    proc = multiprocessing.get_context("spawn").Process(
        target=_proc_main, args=(name, rank, world, str(path), mode), daemon=True)
    proc.start()
    _SPAWNED.append(proc.pid)
    return proc


def _stop(proc):
    """Kill a spawned rank, and unlink the segments it made and no receiver mapped (a
    daemon reaps a killed master's; here no daemon runs)."""
    proc.kill()
    proc.join()
    proc.close()
    reap_orphan_segments()


@pytest.mark.slow  # each rank a spawned process
@pytest.mark.parametrize("name", SOCKET_NAMES)
def test_contract_processes(name, tmp_path):
    procs = [_spawn(name, r, 2, tmp_path, "contract") for r in range(2)]
    try:
        for p in procs:
            p.join(JOIN)
        assert [p.exitcode for p in procs] == [0, 0]
    finally:
        for p in procs:
            _stop(p)


@pytest.mark.slow  # spawns a receiver to kill
@pytest.mark.parametrize("connected", [True, False])
@pytest.mark.parametrize("name", SOCKET_NAMES)
def test_killed_receiver_fails_blocked_send(name, connected, tmp_path):
    child = _spawn(name, 1, 2, tmp_path, "idle")
    ch = channels.create(name, 0, 2, store=DirStore(tmp_path), timeout=20)
    try:
        DirStore(tmp_path).get("ready")
        if connected:
            ch.send(np.ones(1), 1)
        os.kill(child.pid, signal.SIGSTOP)  # its kernel buffers (or shm slots) fill, then we block
        work = ch.isend(np.ones(64 << 20, np.uint8), 1)
        # Time for the send to fill the buffers before the next one queues behind it (under
        # load its thread may not run for a while, and the next send then fits instead).
        time.sleep(machine.seconds(0.3, 3))
        assert not work.is_completed()
        with pytest.raises(ChannelTimeoutError, match=r"rank 0->1.*tag 2, timeout 0.3 s"):
            ch.send(np.ones(1 << 20, np.uint8), 1, tag=2, timeout=0.3)
        child.kill()
        with pytest.raises(ChannelClosedError, match="rank 1") as info:
            work.wait(10)
        assert info.value.peer == 1
    finally:
        _stop(child)
        ch.close()


@pytest.mark.parametrize("name", SOCKET_NAMES)
def test_killed_sender_fails_waiting_recv(name, tmp_path):
    child = _spawn(name, 1, 2, tmp_path, "send-big")
    ch = channels.create(name, 0, 2, store=DirStore(tmp_path), timeout=20)
    try:
        ch.recv(np.zeros(1), 1)
        work = ch.irecv(np.zeros(1 << 20, np.uint8), 1)
        child.kill()
        with pytest.raises(ChannelClosedError, match="rank 1") as info:
            work.wait(10)
        assert info.value.peer == 1
    finally:
        _stop(child)
        ch.close()


@pytest.mark.parametrize("name", NAMES)
def test_a_work_polls_times_out_reports_and_cancels(name):
    """The channel layer's one Work. A receive posted to a receiver thread ends when its
    wait times out or it is cancelled (a later message goes to the next receive); one run
    by a helper thread keeps running and completes."""
    cancelled, sent = threading.Event(), threading.Event()

    def body(ch):
        if ch.rank == 1:
            assert cancelled.wait(JOIN)
            ch.isend(np.full(4, 5.0), 0, tag=5).wait()
            ch.send(np.full(4, 6.0), 0, tag=6)
            sent.set()
            return
        first, late = np.zeros(4), np.zeros(4)
        try:
            withdrawn, waiting = ch.irecv(first, 1, tag=5), ch.irecv(late, 1, tag=6)
            assert not withdrawn.is_completed() and not waiting.is_completed()
            with pytest.raises(ChannelTimeoutError, match=r"0\.1 s"):
                waiting.wait(0.1)
            if ch.posted_receives:
                withdrawn.cancel()
                assert isinstance(withdrawn.exception(), ChannelError)
                assert isinstance(waiting.exception(), ChannelTimeoutError)
        finally:
            cancelled.set()  # rank 1 must not wait out JOIN when this rank failed
        assert sent.wait(JOIN)
        if ch.posted_receives:
            again = np.zeros((2, 4))
            ch.recv(again[0], 1, tag=5)
            ch.recv(again[1], 1, tag=6)
            assert (again == [[5.0], [6.0]]).all()
            assert (first == 0).all() and (late == 0).all()  # ended receives wrote nothing
        else:
            for work in (withdrawn, waiting):
                work.wait()
                assert work.is_completed() and work.exception() is None
            assert (first == 5.0).all() and (late == 6.0).all()

    run_ranks(name, 2, body)

"""A worker killed during a master-worker collective: every survivor names it, nothing hangs."""

from __future__ import annotations

import re
import signal
import threading
import time

import numpy as np
import pytest
from tests.support.daemons import quick_to_notice_losses
from tests.channels.test_channels import run_ranks

import mwrt
from mwrt.collective import api as C
from mwrt.collective.group import ProcessGroup


@pytest.fixture
def three(monkeypatch):
    yield from quick_to_notice_losses(monkeypatch, 3)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_worker_killed_during_a_collective(three, sig):
    big = [mwrt.ones(1 << 20, node=n) for n in range(3)]
    late = mwrt.remote(lambda a: (time.sleep(1.0), a)[1], spec=((1 << 20,), np.float32))
    slow = late(big[2])  # node 2 joins late; spec= keeps the master from waiting for it
    mwrt.all_reduce([big[0], big[1], slow])
    time.sleep(0.3)  # nodes 0 and 1 are waiting inside the collective
    three.local[2].process.send_signal(sig)
    start = time.monotonic()
    for node in (0, 1):
        with pytest.raises(mwrt.MwrtError, match="rank 2|node 2"):
            big[node].numpy()
    with pytest.raises(mwrt.WorkerLostError, match="node 2"):
        slow.numpy()
    assert time.monotonic() - start < 30
    fresh = [mwrt.ones(2, node=n) for n in (0, 1)]
    mwrt.all_reduce(fresh)  # the survivors still work together
    np.testing.assert_array_equal(fresh[0].numpy(), [2, 2])


def test_a_loop_with_no_sync_point_hears_of_a_killed_worker(three):
    x = mwrt.zeros(4, node=1)
    x.numpy()
    three.local[1].process.send_signal(signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        while time.monotonic() - start < 60:  # queues nothing forever for a dead worker
            x += 1
    assert time.monotonic() - start < 30
    np.testing.assert_array_equal((mwrt.ones(2, node=0) + 1).numpy(), [2, 2])


# -- each node killed in turn during master-issued collectives, over every channel -----------

KINDS = ["all_reduce", "broadcast", "all_gather"]
CHANNELS = ["tcp", "shm", "auto"]
ANSWER_WITHIN = 30.0  # a hang guard, well below the channel timeout


def _issue(kind, ts, src):
    """Issue a collective of `kind` over `ts`; the tensors that hold its result."""
    if kind == "all_reduce":
        return mwrt.all_reduce(ts)
    if kind == "broadcast":
        return mwrt.broadcast(ts, src=src)
    return mwrt.all_gather(ts)


def _answer(read):
    """Run `read` on a thread: its exception, None when it returned, or "hang"."""
    box = {"error": "hang"}

    def run():
        try:
            read()
            box["error"] = None
        except BaseException as exc:  # noqa: BLE001 - judged by the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(ANSWER_WITHIN)
    return box["error"]


def _stalled_collective(ch, kind, groups, entered, aborted, errors):
    """Rank 1 agrees to the collective and then sends no data, as a rank killed mid-call;
    ranks 0 and 2 run it until the abort, which their master sends on a loss."""
    group = groups[ch.rank] = ProcessGroup(ch, [0, 1, 2], group_id=7)
    if ch.rank == 1:
        send = ch._send
        ch._send = lambda view, peer, tag, *a: (tag >> 56 == 0 and aborted.wait(30),
                                                send(view, peer, tag, *a))
    buf = np.ones(1 << 16, np.float32)
    entered.wait()
    try:
        if kind == "all_gather":
            C.all_gather(group, np.empty((3, *buf.shape), buf.dtype), buf)
        else:
            getattr(C, kind)(group, buf, **({"root": 1} if kind == "broadcast" else {}))
    except Exception as exc:  # noqa: BLE001 - judged by the test
        errors[ch.rank] = exc


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["all_reduce", "broadcast", "all_gather"])
def test_an_abort_fails_a_collective_waiting_on_a_survivor(kind):
    # What a worker does when its master says a node is lost: fail the receives from it
    # (fail_peer) and every call of its groups, whichever member a survivor waits on.
    entered, aborted, errors, groups = threading.Barrier(4), threading.Event(), {}, {}

    def body(ch):
        _stalled_collective(ch, kind, groups, entered, aborted, errors)

    runner = threading.Thread(target=run_ranks, args=("tcp", 3, body), kwargs={"timeout": 30})
    runner.start()
    entered.wait()
    time.sleep(0.5)  # ranks 0 and 2 are inside the call, past the agreement
    for rank in (0, 2):
        groups[rank].channel.fail_peer(1, "node 1 is lost (killed)")
        groups[rank].abort(1, "node 1 is lost (killed)")
    aborted.set()
    runner.join(40)
    assert not runner.is_alive()
    for rank in (0, 2):  # each names the lost rank, whichever it waited for
        assert "rank 1 closed its connection or died" in str(errors[rank]), errors
        assert "node 1 is lost" in str(errors[rank]), errors


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("channel", CHANNELS)
def test_each_node_killed_mid_collective_is_named_at_once(channel, kind, monkeypatch):
    # Each channel sees each node killed (one per kind), and each kind each node, in a loop
    # of collectives on 64 MiB tensors: the kill lands inside one, mostly past its agreement.
    # A survivor whose call waits on the other survivor must fail too, naming the dead node,
    # rather than wait for the group's timeout (60 s here) and then name the survivor.
    victim = (CHANNELS.index(channel) + KINDS.index(kind)) % 3
    survivors = [n for n in range(3) if n != victim]
    mwrt.shutdown()
    for name, value in {"MWRT_CHANNEL": channel, "MWRT_HEARTBEAT_TIMEOUT": "2",
                        "MWRT_CHANNEL_TIMEOUT": "60", "MWRT_SYNC_TIMEOUT": "60"}.items():
        monkeypatch.setenv(name, value)
    mwrt.init_master_worker(local_workers=3, timeout=30)
    try:
        ts = [mwrt.ones(1 << 24, node=node) for node in range(3)]
        outs = _issue(kind, ts, survivors[0])
        float(outs[survivors[0]].reshape(-1)[0])
        threading.Timer(0.5, mwrt.master.cluster.current().local[victim].process.kill).start()

        def loop():
            for _ in range(10_000):
                outs[:] = _issue(kind, ts, survivors[0])
                float(outs[survivors[0]].reshape(-1)[0])

        for node, read in [("the loop", loop)] + [
                (node, lambda node=node: float(outs[node].reshape(-1)[0])) for node in survivors]:
            error = _answer(read)  # every survivor's answer: the same named failure, or a value
            assert error != "hang", f"{node}: still waiting {ANSWER_WITHIN} s after the kill"
            if error is None and node != "the loop":
                continue
            text = str(error)
            assert isinstance(error, mwrt.MwrtError), f"{node}: {error!r}"
            assert "timed out" not in text, text  # failed by the loss, not by a timeout
            assert re.search(rf"\b(rank|node) {victim}\b", text), text
            assert not re.search(rf"\brank ({survivors[0]}|{survivors[1]}) closed", text), text
        fresh = [mwrt.ones(2, node=node) for node in survivors]
        mwrt.all_reduce(fresh)  # the survivors still work together
        np.testing.assert_array_equal(fresh[0].numpy(), [2, 2])
    finally:
        mwrt.shutdown()

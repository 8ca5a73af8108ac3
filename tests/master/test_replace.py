"""Going on after a lost worker: replace_node, then load what it held from a checkpoint."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
from tests.support.daemons import quick_to_notice_losses
from tests.support.standins import HangsUp

import mwrt
from mwrt.errors import AuthError


@pytest.fixture
def three(monkeypatch):
    yield from quick_to_notice_losses(monkeypatch, 3)


def _kill(cluster, index: int) -> None:
    """SIGKILL node `index`'s daemon and wait (20 s at most) until the master knows."""
    cluster.local[index].process.kill()
    _wait_lost(cluster, index)


def _wait_lost(cluster, index: int) -> None:
    """Wait (20 s at most) until the master knows node `index` is lost."""
    deadline = time.monotonic() + 20
    while cluster.nodes[index].lost is None:
        assert time.monotonic() < deadline, f"node {index}'s loss not noticed in 20 s"
        time.sleep(0.05)


def _on(node: int, value) -> mwrt.DistributedTensor:
    with mwrt.node(node):
        return mwrt.dist_send(np.asarray(value))


@pytest.mark.timeout(120)
def test_a_replaced_node_works_and_old_handles_say_what_happened(three, tmp_path):
    held = _on(1, np.arange(4.0))
    mwrt.save(tmp_path, {"held": held})
    mesh = mwrt.mesh()
    survivor = _on(2, np.ones(3))
    _kill(three, 1)
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        held.numpy()
    mwrt.replace_node(1)
    with pytest.raises(mwrt.WorkerLostError, match=r"lost \(at .*replaced by tcp://127\.0\.0\.1"):
        (held + 1).numpy()
    np.testing.assert_array_equal((survivor * 2).numpy(), np.full(3, 2.0))
    parts = [_on(i, np.full(2, float(i + 1))) for i in range(3)]
    mwrt.all_reduce(parts)  # the new node joined the data channel with the others
    for part in parts:
        np.testing.assert_array_equal(part.numpy(), np.full(2, 6.0))
    # the mesh made before the loss reaches the new node
    np.testing.assert_array_equal(mwrt.ones(3, mesh=mesh, shard=0).numpy(), np.ones(3))
    back = mwrt.load(tmp_path)["held"]
    assert back.get_node() == 1
    np.testing.assert_array_equal(back.numpy(), np.arange(4.0))
    moved = survivor.to(node=1)  # transfers between nodes, too
    np.testing.assert_array_equal(moved.numpy(), np.ones(3))


def test_only_a_lost_node_is_replaced(three):
    with pytest.raises(mwrt.MwrtError, match="node 1 .* is not lost"):
        mwrt.replace_node(1)


def _train(steps: int, tmp_path=None, kill_after: int | None = None) -> np.ndarray:
    """Data-parallel least squares on nodes 0 and 1, checkpointed each step; returns w."""
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((32, 4)) for _ in range(2)]
    ys = [x @ np.array([1.0, -2.0, 0.5, 3.0]) for x in xs]
    data = [(_on(i, xs[i]), _on(i, ys[i])) for i in range(2)]
    w = [_on(i, np.zeros(4)) for i in range(2)]
    step = 0
    while step < steps:
        grads = [x.T @ (x @ wi - y) for (x, y), wi in zip(data, w)]
        mwrt.all_reduce(grads)
        for wi, g in zip(w, grads):
            wi -= 0.005 * g
        step += 1
        if tmp_path is not None:
            mwrt.save(tmp_path, {"w0": w[0], "w1": w[1], "step": _on(0, step)})
        if step == kill_after:
            _kill(mwrt.master.cluster.current(), 1)
            mwrt.replace_node(1)
            state = mwrt.load(tmp_path)
            w, step = [state["w0"], state["w1"]], int(state["step"].numpy())
            data = [(_on(i, xs[i]), _on(i, ys[i])) for i in range(2)]
    return w[0].numpy()


@pytest.mark.timeout(120)
def test_training_resumes_after_a_lost_worker_to_the_same_weights(three, tmp_path):
    uninterrupted = _train(10)
    resumed = _train(10, tmp_path, kill_after=4)
    np.testing.assert_array_equal(resumed, uninterrupted)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("after", [0.0, 0.03, 0.08])
def test_a_replacement_that_dies_mid_replace_leaves_the_others_going(three, after):
    from mwrt.master.local import start_one_local_worker

    survivors = {i: _on(i, np.arange(3.0) + i) for i in (0, 2)}
    _kill(three, 1)
    doomed = start_one_local_worker(three.worker_keys, 30, 3)
    killer = threading.Timer(after, doomed.process.kill)
    killer.start()
    try:
        mwrt.replace_node(1, doomed.address)
    except mwrt.WorkerLostError as exc:
        assert re.search(rf"node 1 not replaced by the worker at {re.escape(doomed.address)}: "
                         r".*(died|lost).*nodes 0, 2 go on", str(exc)), exc
    else:
        # The kill came after the new worker's last answer (on a loaded machine the timer
        # fires late, and a kill just before replace_node returned can fall after its last
        # wait): the new node is then lost the ordinary way.
        killer.join()
        _wait_lost(three, 1)
    finally:
        killer.join()
        doomed.stop()
    mwrt.replace_node(1)
    parts = [_on(i, np.full(2, float(i + 1))) for i in range(3)]
    mwrt.all_reduce(parts)
    np.testing.assert_array_equal(parts[1].numpy(), np.full(2, 6.0))
    for i, tensor in survivors.items():
        np.testing.assert_array_equal(tensor.numpy(), np.arange(3.0) + i)


@pytest.mark.timeout(120)
def test_a_replacement_dying_as_it_hangs_up_is_lost_not_a_key_refusal(three):
    # Its connections closed while its port still took connections that nothing answered:
    # the probes found no refusal, and the error was that the worker refused this master's key.
    survivor = _on(2, np.arange(3.0))
    _kill(three, 1)
    dying = HangsUp()
    try:
        with pytest.raises(mwrt.WorkerLostError) as lost:
            mwrt.replace_node(1, dying.address)
    finally:
        dying.close()
    assert not isinstance(lost.value, AuthError)
    assert re.search(rf"node 1 not replaced by the worker at {re.escape(dying.address)}: "
                     r"worker .*: hung up during the handshake, .*nodes 0, 2 go on",
                     str(lost.value)), lost.value
    assert "refused this master's key" not in str(lost.value)
    mwrt.replace_node(1)
    np.testing.assert_array_equal(survivor.numpy(), np.arange(3.0))

"""Re-attaching to a named session: sharded tensors come back whole and by name, a sharded
checkpoint loads whole onto one node, and local workers (which die with their master) are
refused for a named session."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tests.support.daemons import start_worker, stop_worker

import mwrt
from mwrt.errors import ConfigError

pytestmark = pytest.mark.timeout(120)

FIRST_MASTER = textwrap.dedent("""
    import sys, numpy as np, mwrt
    mwrt.init_master_worker(sys.argv[1].split(","), key=sys.argv[2], session="job")
    X = mwrt.dist_send(np.arange(14.0).reshape(7, 2), mesh=mwrt.mesh(), shard=0)
    X += 1
    print(float(X.sum()), flush=True)
    X.name = "X"  # after the last sync point: leaving delivers what was issued
    w = mwrt.dist_send(np.arange(3.0), node=1)
    w.name = "w"
""")  # ends without mwrt.shutdown(): the workers keep the session for the grace


@pytest.fixture
def two_keyed(tmp_path):
    """Two keyed workers: (addresses, master key)."""
    from mwrt.protocol.auth import keygen

    worker_key, master_key = keygen(str(tmp_path / "keys"))
    mwrt.shutdown()
    started = [start_worker("--key-file", worker_key) for _ in range(2)]
    yield [address for _, address in started], master_key
    mwrt.shutdown()
    for process, _ in started:
        stop_worker(process)


def _attach(addresses: list, key: str) -> None:
    """Connect as the named session, retrying while the workers still count its master live."""
    deadline = time.monotonic() + 20
    while True:
        try:
            mwrt.init_master_worker(addresses, key=key, session="job")
            return
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_sharded_tensor_has_a_name(cluster):
    X = mwrt.dist_send(np.arange(6.0), mesh=mwrt.mesh(), shard=0)
    assert X.name is None
    X.name = "weights"
    assert X.name == "weights"
    with pytest.raises(TypeError, match="non-empty str"):
        X.name = ""


def test_load_onto_one_node_gives_a_sharded_tensor_whole(cluster, tmp_path):
    X = mwrt.dist_send(np.arange(10.0).reshape(5, 2), mesh=mwrt.mesh(), shard=0)
    mwrt.save(tmp_path / "ck", {"X": X})
    back = mwrt.load(tmp_path / "ck", node=1)["X"]
    assert len(back.shards()) == 1, back
    assert (back.get_node(), back.shape) == (1, (5, 2))
    np.testing.assert_array_equal(back.numpy(), np.arange(10.0).reshape(5, 2))
    again = mwrt.load(tmp_path / "ck")["X"]  # without node=: onto its mesh, as saved
    assert [s.get_node() for s in again.shards()] == [0, 1]


@pytest.mark.slow  # keyed daemons, two masters one after the other
def test_a_sharded_tensor_is_re_attached_whole_and_by_name(two_keyed, monkeypatch):
    addresses, key = two_keyed
    env = dict(os.environ, MWRT_SESSION_GRACE="60")
    done = subprocess.run([sys.executable, "-c", FIRST_MASTER, ",".join(addresses), key],
                          env=env, capture_output=True, text=True, timeout=90, check=False)
    assert done.stdout.strip() == "105.0", done.stdout + done.stderr
    monkeypatch.setenv("MWRT_SESSION_GRACE", "60")
    _attach(addresses, key)
    found = mwrt.attached()
    assert sorted(found) == ["X", "w"], sorted(found)
    X = found["X"]
    assert X.name == "X" and X.placements == (mwrt.Shard(0),), (X.name, X.placements)
    assert [s.get_node() for s in X.shards()] == [0, 1]
    np.testing.assert_array_equal(X.numpy(), np.arange(1.0, 15.0).reshape(7, 2))
    X *= 2  # a whole tensor again: ops run at every place
    assert float(X.sum()) == 210.0
    np.testing.assert_array_equal(found["w"].numpy(), np.arange(3.0))


def test_a_named_session_on_local_workers_is_refused():
    mwrt.shutdown()
    with pytest.raises(ConfigError, match="local workers stop with it"):
        mwrt.init_master_worker(local_workers=1, session="job")

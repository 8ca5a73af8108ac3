"""Stores (Hash, TCP, File) under one contract, init methods, and rendezvous errors."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from mwrt.errors import AuthError, ConfigError, RendezvousError, RendezvousTimeoutError
from mwrt.store import (
    FileStore,
    HashStore,
    PrefixStore,
    TCPStore,
    rendezvous,
    store_from_url,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(params=["hash", "tcp", "file", "prefix"])
def store(request, tmp_path):
    if request.param == "hash":
        s = HashStore(timeout=2)
    elif request.param == "prefix":
        s = PrefixStore("job", HashStore(timeout=2))
    elif request.param == "tcp":
        s = TCPStore("127.0.0.1", 0, is_master=True, timeout=2)
    else:
        s = FileStore(str(tmp_path / "store"), timeout=2)
    yield s
    s.close()


def test_store_contract(store):
    store.set("a", b"1")
    assert store.get("a") == b"1"
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.compare_set("c", b"", b"x") == b"x"
    assert store.compare_set("c", b"y", b"z") == b"x"  # wrong expectation: unchanged
    assert store.compare_set("c", b"x", b"z") == b"z"
    assert store.check(["a", "c"]) and not store.check(["a", "missing"])
    assert store.delete_key("a") and not store.check(["a"])
    with pytest.raises(RendezvousTimeoutError, match="missing"):
        store.wait(["never"], timeout=0.2)


def test_prefix_stores_keep_their_keys_apart():
    shared = HashStore(timeout=1)
    a, b = PrefixStore("a", shared), PrefixStore("b", shared)
    a.set("k", "1")
    b.set("k", "2")
    assert (a.get("k"), b.get("k"), shared.get("a/k")) == (b"1", b"2", b"1")
    assert a.add("n", 1) == 1 and b.add("n", 5) == 5


def test_get_waits_for_a_key_set_later(store):
    threading.Timer(0.2, store.set, ("late", "v")).start()
    assert store.get("late", timeout=2) == b"v"


def test_tcp_store_across_clients_and_port_in_use():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=2)
    try:
        client = TCPStore("127.0.0.1", master.port, timeout=2)
        client.set("k", "v")
        assert master.get("k") == b"v"
        client.close()
        with pytest.raises(RendezvousError, match=f"port {master.port}"):
            TCPStore("127.0.0.1", master.port, is_master=True, timeout=2)
    finally:
        master.close()


def test_tcp_store_unreachable_names_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RendezvousTimeoutError, match=f"127.0.0.1:{port}"):
        TCPStore("127.0.0.1", port, timeout=0.3)


def test_file_store_removes_its_file_when_the_last_user_closes(tmp_path):
    path = str(tmp_path / "f")
    a, b = FileStore(path, 2), FileStore(path, 2)
    a.set("x", "1")
    assert b.get("x") == b"1"
    a.close()
    assert os.path.exists(path)
    b.close()
    assert not os.path.exists(path)


def test_init_methods(tmp_path, monkeypatch):
    store, rank, size = store_from_url(f"file://{tmp_path}/s", 0, 1)
    assert (rank, size) == (0, 1)
    store.close()
    store, rank, size = store_from_url("tcp://127.0.0.1:0", 0, 1, timeout=2)
    store.close()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    store, rank, size = store_from_url("env://", timeout=2)
    assert (rank, size) == (0, 1)
    store.close()
    with pytest.raises(RendezvousError, match="unknown scheme"):
        store_from_url("udp://x:1", 0, 1)
    monkeypatch.delenv("RANK")
    with pytest.raises(RendezvousError, match="RANK is not set; pass rank="):
        store_from_url("env://")
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(RendezvousError, match="MASTER_PORT is not set; set it .*tcp://"):
        store_from_url("env://", 0, 1)
    import mwrt.distributed as dist

    with pytest.raises(TypeError, match="timeout: expected seconds or a datetime.timedelta"):
        dist.init_process_group("tcp", timeout="soon")


def _rank(store, rank, size, out, timeout=1.0):
    try:
        out[rank] = rendezvous(store, rank, size, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - checked by the test
        out[rank] = e


def test_rendezvous_lists_missing_ranks():
    store, out = HashStore(), {}
    threads = [threading.Thread(target=_rank, args=(store, r, 4, out)) for r in (0, 2)]
    t0 = time.monotonic()
    [t.start() for t in threads]
    [t.join(5) for t in threads]
    assert time.monotonic() - t0 < 3
    for r in (0, 2):
        assert isinstance(out[r], RendezvousTimeoutError)
        assert "ranks [1, 3] of world size 4" in str(out[r])


def test_rendezvous_rejects_a_duplicate_rank_naming_both_hosts():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=2)
    other = TCPStore("127.0.0.1", master.port, timeout=2)
    try:
        out = {}
        waiting = threading.Thread(target=_rank, args=(master, 0, 2, out, 5.0))
        waiting.start()
        with pytest.raises(RendezvousError, match="claimed twice") as info:
            rendezvous(other, 0, 2, timeout=2)
        host = socket.gethostname()
        assert str(info.value).count(host) == 2
        waiting.join(5)
        assert isinstance(out[0], RendezvousError)  # rejected at once, not after 5 s
    finally:
        other.close()
        master.close()


def test_rendezvous_returns_hosts_and_pids():
    store, out = HashStore(), {}
    threads = [threading.Thread(target=_rank, args=(store, r, 2, out)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(5) for t in threads]
    assert out[0] == out[1] == {r: (socket.gethostname(), os.getpid()) for r in range(2)}


def test_rendezvous_over_a_keyed_store_admits_only_the_job():
    key = b"s" * 32
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, key=key)
    other = TCPStore("127.0.0.1", master.port, timeout=5, key=key)
    try:
        with pytest.raises(AuthError, match="refused the HMAC handshake"):
            TCPStore("127.0.0.1", master.port, timeout=5, key=b"x" * 32)
        out = {}
        threads = [threading.Thread(target=_rank, args=(s, r, 2, out, 5.0))
                   for r, s in enumerate((master, other))]
        [t.start() for t in threads]
        [t.join(10) for t in threads]
        assert out[0] == out[1] and set(out[0]) == {0, 1}
    finally:
        other.close()
        master.close()


def test_a_rendezvous_beyond_loopback_needs_a_secret(monkeypatch):
    monkeypatch.delenv("MWRT_INSECURE", raising=False)
    with pytest.raises(ConfigError, match="no secret.*MWRT_JOB_SECRET.*MWRT_INSECURE=1"):
        store_from_url("tcp://192.0.2.1:29500", 1, 2, timeout=1)
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(ConfigError, match="will not use 192.0.2.1"):
        store_from_url("env://", 1, 2, timeout=1)


def test_spawn_and_the_launcher_give_a_job_its_secret():
    from mwrt.distributed.launch import _need_secret, _parse, plan
    from mwrt.distributed.spawn import job_secret_env

    assert len(job_secret_env({})["MWRT_JOB_SECRET"]) == 32
    assert job_secret_env({"MWRT_KEY_FILE": "k"}) == job_secret_env({"MWRT_JOB_SECRET": "s"}) == {}
    envs = plan(_parse(["--nproc-per-node", "2", "x.py"]), {})
    assert envs[0]["MWRT_JOB_SECRET"] == envs[1]["MWRT_JOB_SECRET"]  # one job, one secret
    across = plan(_parse(["--nnodes", "2", "--master-addr", "192.0.2.1", "--master-port", "29500",
                          "x.py"]), {})
    assert "MWRT_JOB_SECRET" not in across[0]  # each node's launcher would make another
    with pytest.raises(SystemExit, match="needs a secret.*MWRT_JOB_SECRET.*MWRT_INSECURE=1"):
        _need_secret(across[0], {})
    _need_secret(across[0], {"MWRT_JOB_SECRET": "given"})
    _need_secret(across[0], {"MWRT_INSECURE": "1"})
    _need_secret(envs[0], {})

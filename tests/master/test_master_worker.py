"""The master-worker foundation: placement, creation, transfers, remote(), errors, memory."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import mwrt


def test_quickstart_semantics(cluster):
    x = mwrt.FloatTensor(20, 20).fill_(4)
    y = mwrt.dist_send(np.random.randn(20, 20).astype(np.float32))
    z = x + y
    assert (z.get_node(), z.get_device()) == (0, -1)
    assert z.shape == (20, 20) and z.dtype == np.float32
    with mwrt.node(1):
        a = mwrt.FloatTensor(10)
        assert (a.get_node(), a.get_device()) == (1, -1)
        q = x + y  # runs where its operands live
        assert q.get_node() == 0
    np.testing.assert_allclose(z.numpy(), 4 + y.numpy())
    assert mwrt.num_nodes() == 2


@pytest.mark.parametrize("name, dtype", [("FloatTensor", np.float32), ("DoubleTensor", np.float64),
                                         ("HalfTensor", np.float16), ("IntTensor", np.int32),
                                         ("LongTensor", np.int64), ("ShortTensor", np.int16),
                                         ("ByteTensor", np.uint8), ("BoolTensor", np.bool_)])
def test_typed_constructors(cluster, name, dtype):
    t = getattr(mwrt, name)(2, 3, node=1)
    assert (t.shape, t.dtype, t.get_node()) == ((2, 3), np.dtype(dtype), 1)
    assert t.numpy().dtype == dtype


def test_empty_is_zero_filled_as_its_docstring_says(cluster):
    """A worker never hands out freed memory (it may hold another master's bytes): empty(),
    the typed constructors and the Array API's empty and empty_like are zeros, and their
    docstrings say so."""
    import mwrt.array_api as xp

    freed = mwrt.full(4096, 7.0)
    freed.numpy()
    del freed
    makers = (mwrt.empty, mwrt.FloatTensor, mwrt.LongTensor, xp.empty, xp.empty_like)
    for make in makers:
        made = make(mwrt.ones(4096)) if make is xp.empty_like else make(4096)
        assert not made.numpy().any(), make.__name__
        doc = " ".join(make.__doc__.split())
        assert "zero-filled" in doc and "uninitiali" not in doc, doc

def test_creation_functions(cluster):
    np.testing.assert_array_equal(mwrt.zeros(2, 3).numpy(), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(mwrt.ones((4,), dtype=np.int64).numpy(), np.ones(4, np.int64))
    np.testing.assert_array_equal(mwrt.full((2, 2), 7).numpy(), np.full((2, 2), 7))
    np.testing.assert_array_equal(mwrt.arange(5).numpy(), np.arange(5))
    np.testing.assert_array_equal(mwrt.arange(1, 2, 0.25).numpy(), np.arange(1, 2, 0.25))
    for args in [(4.0,), (0, 4.0), (5,), (1, 2, 0.25), (10, 0, -3), (0, 1, 1)]:
        got, want = mwrt.arange(*args).numpy(), np.arange(*args)
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), args
    assert mwrt.empty(0, 3).numpy().shape == (0, 3)
    mwrt.manual_seed(3)
    r1, n1 = mwrt.rand(100).numpy(), mwrt.randn(100, node=1).numpy()
    mwrt.manual_seed(3)
    r2, n2 = mwrt.rand(100).numpy(), mwrt.randn(100, node=1).numpy()
    np.testing.assert_array_equal(r1, r2)
    np.testing.assert_array_equal(n1, n2)
    assert 0 <= r1.min() and r1.max() < 1 and r1.dtype == np.float32
    with pytest.raises(ValueError, match="dimensions must be >= 0"):
        mwrt.zeros(-1)
    with pytest.raises(TypeError, match="dtype"):
        mwrt.zeros(2, dtype="nonsense")


def test_dist_send_places_and_round_trips(cluster):
    for dtype in (np.float32, np.int8, np.bool_, np.complex64, np.float16):
        array = (np.arange(24) % 3).astype(dtype).reshape(2, 3, 4)
        t = mwrt.dist_send(array, node=1)
        assert t.get_node() == 1
        np.testing.assert_array_equal(t.numpy(), array)
    big = np.random.rand(1 << 20)  # 8 MiB: not inline
    np.testing.assert_array_equal(mwrt.dist_send(big).numpy(), big)
    scalar = mwrt.dist_send(np.float64(2.5))
    assert scalar.shape == () and float(scalar) == 2.5
    non_contiguous = np.arange(20.0).reshape(4, 5)[:, ::2]
    np.testing.assert_array_equal(mwrt.dist_send(non_contiguous).numpy(), non_contiguous)


def test_dist_send_rejects_non_arrays(cluster):
    with pytest.raises(TypeError, match="dist_send: expected a NumPy array"):
        mwrt.dist_send([1, 2, 3])
    with pytest.raises(ValueError, match="no node 5"):
        mwrt.dist_send(np.ones(2), node=5)


def test_moves_between_nodes(cluster):
    x = mwrt.dist_send(np.arange(6.0))
    y = x.to(node=1)
    assert (y.get_node(), y.get_device()) == (1, -1)
    np.testing.assert_array_equal(y.numpy(), np.arange(6.0))
    z = x.dist_send(node=1)
    assert z.get_node() == 1
    assert x.to(node=0) is x and x.cpu() is x


def test_operands_on_different_nodes_name_both_places(cluster):
    a = mwrt.ones(3)
    b = mwrt.ones(3, node=1)
    with pytest.raises(ValueError, match=r"node 0 device -1 and node 1 device -1"):
        a + b


def test_a_gpu_the_node_lacks_is_refused_at_once_and_the_session_goes_on(cluster):
    missing = mwrt.device_count(0)  # one past the last GPU: 0 on a machine without any
    x = mwrt.ones(3)
    for make in (lambda: mwrt.FloatTensor(3, device=missing), lambda: x.cuda(missing),
                 lambda: mwrt.Stream(device=missing), lambda: x.to(node=1, device=missing)):
        with pytest.raises(ValueError, match=rf"device: node \d has no GPU {missing} "):
            make()
    gc.collect()
    mwrt.synchronize()  # nothing half-made is left to fail a later sync point
    np.testing.assert_array_equal((x + 1).numpy(), [2, 2, 2])


def test_remote_function_runs_where_its_tensor_lives(cluster):
    import os

    x = mwrt.dist_send(np.arange(4.0), node=1)
    doubled = mwrt.remote(lambda a: a * 2)(x)
    assert doubled.get_node() == 1
    np.testing.assert_array_equal(doubled.numpy(), np.arange(4.0) * 2)
    assert doubled.shape == (4,)  # resolved on first use
    pid = mwrt.remote(lambda a: np.array(os.getpid()))(x)
    assert int(pid) != os.getpid()

    @mwrt.remote(outputs=2)
    def split(a):
        return a[:2], a[2:]
    first, second = split(x)
    np.testing.assert_array_equal(second.numpy(), [2.0, 3.0])
    assert first.get_node() == 1


def test_a_remote_function_gets_the_lists_it_was_given(cluster):
    a = np.arange(20.0).reshape(4, 5)
    x = mwrt.dist_send(a)
    rows = mwrt.remote(lambda t, index: t[index])(x, [2, 0])  # the wire delivers a tuple
    np.testing.assert_array_equal(rows.numpy(), a[[2, 0]])
    kinds = mwrt.remote(lambda t, pair, named: np.array(
        [type(pair) is tuple, type(pair[1]) is list, type(named["ids"]) is list]))
    assert kinds(x, (1, [2]), named={"ids": [3]}).numpy().all()


def test_remote_error_names_place_op_and_line_and_is_sticky(cluster):
    x = mwrt.dist_send(np.ones(3))

    def broken(a):
        raise ValueError("bad input " + str(a.shape))
    y = mwrt.remote(broken)(x)
    skipped = x + 1  # issued after the failure on the same stream: skipped
    with pytest.raises(mwrt.RemoteError) as info:
        y.numpy()
    err = info.value
    assert (err.node, err.device, err.op) == (0, -1, "remote")
    assert "bad input (3,)" in str(err) and "ValueError" in str(err)
    assert "test_master_worker.py" in err.issued_at
    assert "raise ValueError" in err.remote_traceback
    with pytest.raises(mwrt.RemoteError, match="bad input"):
        skipped.numpy()  # made by a skipped op: names the root cause
    np.testing.assert_array_equal((x * 2).numpy(), [2.0, 2.0, 2.0])  # the stream recovered


def test_a_shipped_functions_file_and_line_are_put_back_in_a_workers_traceback():
    """cloudpickle >= 3.1.3 ships code as "<dynamic-code>"; the master names the place."""
    from mwrt.master import remote, sites

    def shipped(a):
        return a + 1
    remote._pickle(shipped)
    line = shipped.__code__.co_firstlineno + 1
    worker_text = (f'Traceback (most recent call last):\n  File "<dynamic-code>", line {line}, '
                   'in shipped\nTypeError: no\n')
    assert sites.restore_places(worker_text) == (
        f'Traceback (most recent call last):\n  File "{__file__}", line {line}, in shipped\n'
        '    return a + 1\nTypeError: no\n')


def test_remote_results_and_captures_that_cannot_be_tensors_are_named(cluster):
    x = mwrt.ones(3)
    with pytest.raises(mwrt.RemoteError, match="the result is a dict, which is not an array"):
        mwrt.remote(lambda a: {"sum": float(a.sum())})(x).numpy()
    assert float(mwrt.remote(lambda a: a.sum())(x)) == 3.0  # a number is a 0-d tensor
    y = mwrt.ones(3)
    with pytest.raises(TypeError, match="pass the tensor as an argument"):
        mwrt.remote(lambda a: a + np.asarray(y))(x)  # a handle inside the shipped closure


def test_a_functions_sys_exit_is_its_error_and_its_stream_goes_on(cluster):
    """sys.exit() in a function ended its stream's thread: the master waited for ever."""
    import sys

    x = mwrt.dist_send(np.arange(3.0))
    with pytest.raises(mwrt.RemoteError, match=r"sys.exit\(3\), which ends no worker"):
        mwrt.remote(lambda a: sys.exit(3))(x).numpy()
    with pytest.raises(mwrt.RemoteError, match="KeyboardInterrupt"):
        mwrt.remote(lambda a: (_ for _ in ()).throw(KeyboardInterrupt))(x).numpy()
    np.testing.assert_array_equal((x * 2).numpy(), [0.0, 2.0, 4.0])  # on the same stream


def test_a_workers_error_is_also_of_its_own_class(cluster):
    """`except ZeroDivisionError:` (or LinAlgError, as libraries write it) around the read
    catches the worker's error, as around the same call on NumPy; it is a RemoteError too."""
    import pickle

    x = mwrt.dist_send(np.zeros((2, 2)))
    with pytest.raises(ZeroDivisionError) as info:
        mwrt.remote(lambda a: 1 / 0)(x).numpy()
    err = info.value
    assert isinstance(err, mwrt.RemoteError) and (err.node, err.op) == (0, "remote")
    assert str(err).startswith("node 0, device -1, stream ")  # its text, not the class's
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and again.node == 0 and str(again) == str(err)
    with pytest.raises(np.linalg.LinAlgError, match="Singular matrix"):
        np.linalg.inv(x).numpy()
    with pytest.raises(KeyError) as info:
        mwrt.remote(lambda a: {}["k"])(x).numpy()
    assert str(info.value).startswith("node 0")  # (KeyError's own str() would quote it)
    with pytest.raises(mwrt.RemoteError) as info:  # a class that cannot also be one: plain
        mwrt.remote(lambda a: b"\xff".decode())(x).numpy()
    assert type(info.value) is mwrt.RemoteError and "UnicodeDecodeError" in str(info.value)


def test_a_function_that_cannot_be_shipped_is_named():
    import threading

    lock = threading.Lock()

    def holds_a_lock(a):
        with lock:
            return a
    with pytest.raises(TypeError, match="remote: .*holds_a_lock cannot be shipped to a worker "
                                        r"\(TypeError: cannot pickle '_thread.lock'"):
        mwrt.remote(holds_a_lock)(mwrt.ones(1))


def test_what_a_function_prints_shows_on_the_masters_stdout_by_node(cluster, capsys):
    """A local daemon's stdout was a pipe that no one read: prints were lost, and 64 KiB
    of them stopped the daemon for good."""
    x = mwrt.dist_send(np.arange(3.0), node=1)

    def chatty(a):
        for i in range(20_000):  # ~1 MB, far past a pipe's buffer
            print(f"line {i} of the function's output")
        print("the last line")
        return a + 1
    np.testing.assert_array_equal(mwrt.remote(chatty)(x).numpy(), [1.0, 2.0, 3.0])
    shown, deadline = "", time.monotonic() + 30
    while "(node 1) the last line\n" not in shown and time.monotonic() < deadline:
        time.sleep(0.05)  # forwarded by a thread of the master's, soon after
        shown += capsys.readouterr().out
    assert "(node 1) line 0 of the function's output\n" in shown
    assert "(node 1) the last line\n" in shown


def test_dropping_handles_frees_worker_memory(cluster):
    mwrt.synchronize()
    gc.collect()
    before = mwrt.memory_stats(1)
    tensors = [mwrt.zeros(1000, node=1) for _ in range(20)]
    during = mwrt.memory_stats(1)
    assert during["tensors"] == before["tensors"] + 20
    assert during["bytes"] >= before["bytes"] + 20 * 4000
    del tensors
    gc.collect()
    mwrt.synchronize()
    after = mwrt.memory_stats(1)
    assert after["tensors"] == before["tensors"]


def test_async_issue_then_synchronize(cluster):
    x = mwrt.zeros(4)
    for _ in range(500):
        x += 1
    mwrt.synchronize()
    np.testing.assert_array_equal(x.numpy(), np.full(4, 500.0, np.float32))


def test_the_proposals_spellings_on_the_master(cluster):
    """full() of a float is float32 like ones(), so they meet in a collective; t.matmul;
    dist_send of a torch CPU tensor (where torch is installed) keeps it torch on the worker."""
    assert mwrt.full(4, 3.0).dtype == np.float32 and mwrt.full(4, 3).dtype == np.int64
    parts = [mwrt.ones(4, node=0), mwrt.full(4, 3.0, node=1)]
    mwrt.all_reduce(parts)
    assert parts[0].numpy().tolist() == [4.0] * 4
    a = mwrt.dist_send(np.arange(4.0).reshape(2, 2))
    np.testing.assert_array_equal(a.matmul(a).numpy(), np.arange(4.0).reshape(2, 2) @
                                  np.arange(4.0).reshape(2, 2))
    with pytest.raises(TypeError, match="expected a NumPy array or a CPU tensor"):
        mwrt.dist_send([1, 2])
    torch = pytest.importorskip("torch", reason="torch is only an optional extra")
    t = mwrt.dist_send(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert t.kind == "torch" and t.dtype == torch.float32
    assert t.numpy().tolist() == [[0, 1, 2], [3, 4, 5]]


def test_not_initialized_error():
    mwrt.shutdown()
    with pytest.raises(mwrt.MwrtError, match="init_master_worker"):
        mwrt.ones(3)


def test_tensors_of_a_session_that_ended_say_so():
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=1, timeout=30)
    x = mwrt.ones(3)
    mwrt.shutdown()
    for use in (lambda: (x + 1).numpy(), lambda: x.numpy()):
        with pytest.raises(mwrt.MwrtError, match="session with the node has ended"):
            use()


def test_what_an_ended_session_made_is_refused_in_the_next_which_runs_on(monkeypatch):
    # A move or collective with such a tensor left the new session's node waiting for bytes
    # or a peer that never came; an event of it was waited for forever; an op with a mesh
    # tensor of it named its ids, which are others' now; x + y said 'node 0 and node 0'.
    monkeypatch.setenv("MWRT_SYNC_TIMEOUT", "30")  # a node left waiting fails, not hangs
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=2, timeout=30)
    x, old_mesh = mwrt.arange(4.0), mwrt.zeros(6, mesh=mwrt.mesh())
    stream = mwrt.Stream(node=1)
    event = stream.record_event()
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=2, timeout=30)
    try:
        y0, y1 = mwrt.arange(4.0), mwrt.arange(4.0, node=1)
        new_mesh = mwrt.ones(6, mesh=mwrt.mesh())

        def in_stream():
            with mwrt.stream(stream):
                return mwrt.ones(3, node=1)

        for use in (lambda: x + y0, lambda: y0 + x, lambda: x.to(node=1),
                    lambda: mwrt.all_reduce([x, y1]), lambda: new_mesh + old_mesh,
                    lambda: mwrt.Stream(node=1).wait_event(event), in_stream):
            with pytest.raises(mwrt.MwrtError, match="session with the node has ended"):
                use()
        assert (y0 + 1).numpy().tolist() == (y1 + 1).numpy().tolist() == [1, 2, 3, 4]
        assert (new_mesh * 2).numpy().tolist() == [2.0] * 6
    finally:
        mwrt.shutdown()


def test_unreachable_worker_is_a_connection_error_naming_it():
    mwrt.shutdown()
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="127.0.0.1:9"):
        mwrt.init_master_worker(["127.0.0.1:9"], timeout=1.0)
    assert time.monotonic() - start < 10
    with pytest.raises(ValueError, match="host:port"):
        mwrt.init_master_worker(["nonsense"])


def test_registered_workers_are_found_and_missing_ones_named(tmp_path, monkeypatch):
    from tests.support.daemons import start_worker

    mwrt.shutdown()
    registry = tmp_path / "workers"
    monkeypatch.setenv("MWRT_RENDEZVOUS_TIMEOUT", "0.5")
    with pytest.raises(mwrt.MwrtError, match=r"registry .*: 0 of 1 workers registered within"):
        mwrt.init_master_worker(registry=str(registry), num_workers=1)
    proc, address = start_worker("--register", str(registry))
    try:
        mwrt.init_master_worker(registry=str(registry), num_workers=1, backend="tcp")
        assert float(mwrt.ones(4).sum()) == 4.0
        assert mwrt.master.cluster.current().channel_name == "tcp"
        mwrt.shutdown()
    finally:
        proc.terminate()
        proc.wait(10)
    assert not list(registry.iterdir())  # a stopped daemon takes its entry back


def test_the_mpi_channel_is_refused_for_a_session_by_name():
    mwrt.shutdown()
    with pytest.raises(mwrt.MwrtError, match="mpi channel's ranks are the processes of one MPI"):
        mwrt.init_master_worker(local_workers=1, backend="mpi")


@pytest.mark.slow  # twelve local daemons
def test_a_master_makes_room_for_its_nodes(tmp_path):
    """A soft limit of 128 open files (ten per node would not fit) and a store capped at 4
    connections: the master raises the one and the store sizes the other from the nodes."""
    import subprocess
    import sys

    code = ("import resource, mwrt\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit("
            "resource.RLIMIT_NOFILE)[1]))\n"
            "mwrt.init_master_worker(local_workers=12)\n"
            "print(sum(float(mwrt.ones(2, node=i).sum()) for i in range(12)))\n"
            "mwrt.shutdown()\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ,
                                           "MWRT_STORE_MAX_CONNECTIONS": "4"})
    assert res.stdout.strip() == "24.0", res.stderr[-3000:]

"""Reads in place (mwrt.master.inplace): a large .numpy() from a worker on this host copied
straight from its memory, with NumPy's value; and the channel instead for a worker the
master may not read (another host, a kernel that refuses; another pid namespace:
test_mw_data) or a tensor not in C order; a worker that dies during the read, named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tests.support.daemons import quick_to_notice_losses, start_worker, stop_worker
from tests.support.hosts import hosts2  # noqa: F401  (a fixture)

import mwrt
from mwrt.channels import cma
from mwrt.master import inplace
from mwrt.procs import process_alive

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(not cma.available(), reason="no process_vm_readv here")


@pytest.fixture
def copies(monkeypatch):
    """The byte counts of the reads in place made while the test runs."""
    seen: list[int] = []
    real = inplace._copy

    def counted(node, pid, address, out, what):
        done = real(node, pid, address, out, what)
        seen.append(out.nbytes if done else 0)
        return done

    monkeypatch.setattr(inplace, "_copy", counted)
    return seen


# Sizes on both sides of the two-thread bound (8 MiB) and of the 4 MiB chunks, odd tails
# among them; sizes up to the inline bound ride beside the reply as before.
CASES = [(((1 << 20) + 3,), np.float64), ((1000, 1001), np.int16),
         ((2, 3, 350_001), np.complex64), (((9 << 20) + 7,), np.uint8), ((3000, 701), np.bool_),
         ((1 << 21,), np.float16), ((5, 1 << 17), np.int64), ((0, 1 << 20), np.float32),
         ((7,), np.float32)]


@pytest.mark.parametrize("shape, dtype", CASES)
def test_a_read_in_place_is_numpys_value(cluster, copies, shape, dtype):
    want = (np.arange(int(np.prod(shape))) % 253).astype(dtype).reshape(shape)
    for node in (0, 1):
        t = mwrt.dist_send(want, node=node)
        got = t.numpy()
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        np.testing.assert_array_equal(got, want)
        assert got.flags.writeable and got.flags.c_contiguous and got.flags.owndata
        assert np.array_equal(t.numpy(), want)  # again: the pin was given back, nothing stuck
    inline = want.nbytes <= mwrt.master.cluster.current().nodes[0].inline_bytes
    assert copies == ([] if inline else [want.nbytes] * 4)


def test_a_result_is_read_in_place_after_its_op_on_another_stream(cluster, copies):
    x = mwrt.arange(3 << 20, dtype=np.float32)
    with mwrt.stream(mwrt.Stream()):
        y = x * 2.0  # the read must wait for it
    np.testing.assert_array_equal(y.numpy(), 2.0 * np.arange(3 << 20, dtype=np.float32))
    assert copies == [12 << 20]
    singular = np.linalg.inv(mwrt.zeros((512, 512)))  # fails on the worker only
    with pytest.raises(mwrt.RemoteError, match="Singular"):
        singular.numpy()


def test_views_not_in_c_order_come_through_the_channel(cluster, copies):
    base = np.arange(2000 * 1500, dtype=np.float64).reshape(2000, 1500)
    t = mwrt.dist_send(base)
    for view, want in ((t.T, base.T), (t[::3], base[::3]), (t[:, 1::2], base[:, 1::2]),
                       (t[10:1900], base[10:1900])):
        got = view.numpy()
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        np.testing.assert_array_equal(got, want)
    assert copies == [base[10:1900].nbytes]  # the one C-order view; the strided ones: channel


# A master that may not read a non-dumpable worker's memory, even as root.
REFUSED = textwrap.dedent("""
    import ctypes, logging, sys, numpy as np, mwrt
    from mwrt.master import inplace
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this pid
    caps = (ctypes.c_uint32 * 6)()
    assert libc.capget(header, caps) == 0
    caps[0] &= ~(1 << 19); caps[1] &= ~(1 << 19)  # CAP_SYS_PTRACE
    assert libc.capset(header, caps) == 0
    mwrt.init_master_worker(sys.argv[1], timeout=30)
    want = np.arange(5 << 20, dtype=np.float32)
    t = mwrt.dist_send(want)
    ok = all(np.array_equal(t.numpy(), want) for _ in range(3))
    print("values", ok, "reads in place", len(inplace._BY_CHANNEL), flush=True)
    mwrt.shutdown()
""")
NOT_DUMPABLE = ("-c", "import ctypes, runpy; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "
                "runpy.run_module('mwrt.worker', run_name='__main__')")  # PR_SET_DUMPABLE 0


@pytest.mark.timeout(180)
def test_a_read_the_kernel_refuses_goes_through_the_channel(tmp_path):
    worker, address = start_worker(launch=NOT_DUMPABLE)
    try:
        script = tmp_path / "refused.py"
        script.write_text(REFUSED)
        done = subprocess.run([sys.executable, str(script), address], capture_output=True,
                              text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
        out = done.stdout
        assert "values True reads in place 1" in out, out + done.stderr[-3000:]
        assert out.count("does not let this master read its memory") == 1, out  # then cached
    finally:
        stop_worker(worker)


@pytest.mark.timeout(300)
def test_a_worker_on_another_host_is_read_through_the_channel(hosts2, tmp_path):  # noqa: F811
    from tests.hosts.test_hosts_mw import keyed_workers, master_env

    workers = keyed_workers(hosts2, tmp_path)
    script = textwrap.dedent("""
        import numpy as np, mwrt
        from mwrt.master import inplace
        calls = []
        real = inplace._copy
        inplace._copy = lambda *args: calls.append(1) or real(*args)
        mwrt.init_master_worker()
        for dtype in (np.float64, np.int8, np.complex64):
            want = (np.arange(3 << 20) % 101).astype(dtype)
            got = mwrt.dist_send(want).numpy()
            assert got.dtype == want.dtype and np.array_equal(got, want), dtype
        print("ok, reads in place:", len(calls))
        mwrt.shutdown()
    """)
    try:
        res = hosts2[0].run([sys.executable, "-c", script], env=master_env(hosts2, tmp_path),
                            timeout=240)
        assert "ok, reads in place: 0" in res.stdout, res.stderr[-3000:]
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()


@pytest.fixture
def watched(monkeypatch):
    """A fresh session of one local daemon whose death the master hears of quickly."""
    yield from quick_to_notice_losses(monkeypatch, 1)


@pytest.mark.timeout(120)
def test_a_worker_killed_during_a_read_in_place_is_named(watched, monkeypatch):
    big = mwrt.arange(6 << 20, dtype=np.float64)  # 48 MiB: a probe, then 12 chunks
    float(big[0])
    pid = mwrt.status()[0]["worker"]["pid"]
    real, calls = cma.read_remote, [0]

    def killing(*args):  # at the third chunk, the worker dies (and is gone) first
        calls[0] += 1
        if calls[0] == 3:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        return real(*args)

    monkeypatch.setattr(cma, "read_remote", killing)
    with pytest.raises(mwrt.WorkerLostError, match="node 0") as info:
        big.numpy()
    assert info.value.node == 0

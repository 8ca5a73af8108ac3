"""The nccl channel: NCCL collectives and point-to-point over 2 GPU ranks, through
mwrt.distributed. Every test body runs twice: on the fake GPU with the fake NCCL
(mwrt.testing.fakegpu, mwrt.testing.fakenccl, MWRT_FAKE_GPUS: always) and on CuPy's NCCL (where this
machine has two CUDA devices, else skipped with the reason). The ranks are real
processes (dist.spawn); each drives GPU `rank` and reports what it saw, which the test
compares with NumPy's answer.
"""

from __future__ import annotations

import os
import signal
import time
import traceback

import numpy as np
import pytest

from tests.support import machine
from tests.support.ranks import spawn_and_collect
from tests.master.test_gpu import _real_gpus

import mwrt.distributed as dist
from mwrt import arrays
from mwrt.errors import CollectiveMismatchError

N = 2  # ranks, one GPU each
DTYPES = ["int8", "uint8", "int32", "int64", "float16", "float32", "float64"]
SIZES = [5, 40_000]  # a small call, and one past NCCL's and the fake's small paths
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]


def _input(rank: int, dtype: str, n: int) -> np.ndarray:
    """Rank `rank`'s values: small enough that no dtype overflows a product of two."""
    values = (np.arange(n) * 7 + rank * 3) % 5 + 1
    return values.astype(dtype) if dtype[0] != "f" else (values / 2).astype(dtype)


def _run(program, reports: int = N, join: float = 90.0) -> dict:
    exited, got = spawn_and_collect(program, N, reports, join)
    assert exited, f"ranks still running after {join} s; reports: {got}"
    for rank, out in got.items():
        assert not isinstance(out, str), f"rank {rank} failed:\n{out}"
    return got


def _ranks_environment(kind: str, gpus: int):
    """The environment ranks inherit, for the test's life: `gpus` fake GPUs and the fake
    NCCL, or CuPy's on real GPUs (skipped with the reason where there are too few)."""
    env = {"MWRT_FAKE_GPUS": str(gpus), "MWRT_CHANNEL_TIMEOUT": "20"}
    if kind == "cupy":
        if _real_gpus() < gpus:
            pytest.skip(f"needs {gpus} CUDA device(s) with CuPy and NCCL (found "
                        f"{_real_gpus()}); the fake GPU and fake NCCL run these bodies")
        env["MWRT_FAKE_GPUS"] = "0"
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    yield kind
    for name, value in saved.items():
        os.environ.pop(name) if value is None else os.environ.update({name: value})


@pytest.fixture(scope="module", params=["fake", "cupy"])
def gpus(request):
    """N ranks' environment, one GPU each."""
    yield from _ranks_environment(request.param, N)


def _start(rank: int):
    xp = arrays.gpu_module()
    xp.cuda.Device(rank).use()
    dist.init_process_group("nccl", timeout=30)
    return xp


def _report(rank: int, queue, body) -> None:
    """Run a rank's body; report its result, or the traceback, to the test."""
    try:
        queue.put((rank, body(rank)))
    except BaseException:  # noqa: BLE001 - the test shows it
        queue.put((rank, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# -- every collective, every dtype class ---------------------------------------------------

def _reduced(op: str, dtype: str, n: int) -> np.ndarray:
    a, b = (_input(r, dtype, n) for r in range(N))
    if op == "AVG":
        return ((a + b) / N).astype(dtype)
    ufunc = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum}[op]
    return ufunc(a, b)


def _compare(wrong: list, what: str, got, expected) -> None:
    """Note `what` in `wrong` unless device array `got` holds `expected` (ranks report only
    what went wrong: their queue to the test is small)."""
    got = arrays.to_host(got)
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-3):
        wrong.append(f"{what}: got {got[:8]}..., expected {expected[:8]}...")


def _collectives(rank: int) -> list:
    xp = _start(rank)
    assert dist.is_nccl_available() and dist.get_backend() == "nccl"
    wrong: list = []
    for dtype in DTYPES:
        for n in SIZES:
            for op in OPS if dtype[0] == "f" else ["SUM", "PRODUCT", "MIN", "MAX"]:
                a = xp.asarray(_input(rank, dtype, n))
                dist.all_reduce(a, op=getattr(dist.ReduceOp, op))
                _compare(wrong, f"all_reduce {dtype}[{n}] {op}", a, _reduced(op, dtype, n))
        b = xp.asarray(_input(rank, dtype, 6))
        dist.broadcast(b, src=1)
        _compare(wrong, f"broadcast {dtype}", b, _input(1, dtype, 6))
        r = xp.asarray(_input(rank, dtype, 6))
        dist.reduce(r, dst=0)
        if rank == 0:
            _compare(wrong, f"reduce {dtype}", r, _reduced("SUM", dtype, 6))
        g = xp.empty(N * 6, dtype)
        dist.all_gather_into_tensor(g, xp.asarray(_input(rank, dtype, 6)))
        _compare(wrong, f"all_gather {dtype}", g,
                 np.concatenate([_input(p, dtype, 6) for p in range(N)]))
        s = xp.empty(3, dtype)
        dist.reduce_scatter_tensor(s, xp.asarray(_input(rank, dtype, N * 3)))
        _compare(wrong, f"reduce_scatter {dtype}", s,
                 _reduced("SUM", dtype, N * 3)[rank * 3:rank * 3 + 3])
    flags = xp.asarray(np.array([rank == 1, True, False]))
    dist.broadcast(flags, src=1)  # bool moves as bytes
    _compare(wrong, "bool broadcast", flags, np.array([True, True, False]))
    gathered = [xp.zeros(4, "float32") for _ in range(N)] if rank == 0 else None
    dist.gather(xp.asarray(_input(rank, "float32", 4)), gathered, dst=0)
    if rank == 0:
        _compare(wrong, "gather", xp.concatenate(gathered),
                 np.concatenate([_input(p, "float32", 4) for p in range(N)]))
    mine = xp.empty(4, "float32")
    rows = [xp.arange(4, dtype="float32") + 4 * p for p in range(N)] if rank == 1 else None
    dist.scatter(mine, rows, src=1)
    _compare(wrong, "scatter", mine, np.arange(4, dtype="float32") + 4 * rank)
    listed = [xp.empty(3, "int32") for _ in range(N)]
    dist.all_gather(listed, xp.asarray(_input(rank, "int32", 3)))
    _compare(wrong, "all_gather list", xp.concatenate(listed),
             np.concatenate([_input(p, "int32", 3) for p in range(N)]))
    part = xp.empty(3, "float64")
    dist.reduce_scatter(part, [xp.asarray(_input(rank, "float64", 3)) * (p + 1)
                               for p in range(N)])
    _compare(wrong, "reduce_scatter list", part, _reduced("SUM", "float64", 3) * (rank + 1))
    swapped = xp.empty(N * 2, "int64")
    dist.all_to_all_single(swapped, xp.asarray(np.arange(N * 2) + 10 * rank))
    _compare(wrong, "all_to_all", swapped,
             np.array([2 * rank + i + 10 * p for p in range(N) for i in range(2)]))
    dist.barrier()
    return wrong


def _collectives_program(rank, queue):
    _report(rank, queue, _collectives)


def test_collectives_match_numpy(gpus):
    got = _run(_collectives_program)
    assert got == {0: [], 1: []}


# -- point-to-point, a subgroup, and the errors that leave the group usable ------------------

def test_the_unique_id_goes_through_the_store_in_either_of_cupys_forms():
    from mwrt.channels.nccl import decode_id, encode_id

    raw = bytes(range(128))  # CuPy >= 14
    chars = tuple(b - 256 if b > 127 else b for b in raw)  # CuPy 13: signed chars
    assert decode_id(encode_id(raw)) == raw
    assert decode_id(encode_id(chars)) == chars


# -- one rank: NCCL's own calls on a machine with one GPU ----------------------------------

@pytest.fixture(params=["fake", "cupy"])
def one_gpu(request):
    """One rank's environment, with one GPU."""
    yield from _ranks_environment(request.param, 1)


def _one_rank(rank: int) -> list:
    """Every collective of a one-rank group: each leaves its input as it was."""
    xp = _start(rank)
    wrong: list = []
    for dtype in DTYPES:
        mine = _input(0, dtype, SIZES[1])
        for op in ["SUM", "MAX"] + (["AVG"] if dtype[0] == "f" else []):
            a = xp.asarray(mine)
            dist.all_reduce(a, op=getattr(dist.ReduceOp, op))
            _compare(wrong, f"all_reduce {dtype} {op}", a, mine)
        for name, call in [("broadcast", lambda t: dist.broadcast(t, src=0)),
                           ("reduce", lambda t: dist.reduce(t, dst=0))]:
            t = xp.asarray(mine)
            call(t)
            _compare(wrong, f"{name} {dtype}", t, mine)
        out = xp.empty_like(xp.asarray(mine))
        dist.all_gather_into_tensor(out, xp.asarray(mine))
        _compare(wrong, f"all_gather {dtype}", out, mine)
        dist.reduce_scatter_tensor(out, xp.asarray(mine))
        _compare(wrong, f"reduce_scatter {dtype}", out, mine)
        dist.all_to_all_single(out, xp.asarray(mine))
        _compare(wrong, f"all_to_all {dtype}", out, mine)
    dist.barrier()
    return wrong


def _one_rank_program(rank, queue):
    _report(rank, queue, _one_rank)


def test_a_one_rank_group_runs_every_collective(one_gpu):
    """Where a machine has one GPU, this is what runs NCCL's own calls (CuPy's bindings)."""
    exited, got = spawn_and_collect(_one_rank_program, 1, 1, 90.0)
    assert exited and got == {0: []}, got


def _p2p_and_errors(rank: int) -> dict:
    xp = _start(rank)
    out = {}
    peer = 1 - rank
    if rank == 0:
        dist.send(xp.asarray(np.arange(5, dtype="float64")), 1)
        got = xp.empty(1000, "int32")
        dist.recv(got, 1)
    else:
        got = xp.empty(5, "float64")
        dist.recv(got, 0)
        dist.send(xp.asarray(np.arange(1000, dtype="int32") * 2), 0)
    out["recv"] = xp.asnumpy(got)[:8].tolist()
    mine, theirs = xp.asarray(np.full(3, rank, "int64")), xp.empty(3, "int64")
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer),
                                    dist.P2POp(dist.irecv, theirs, peer)]) if rank == 0 else \
        dist.batch_isend_irecv([dist.P2POp(dist.irecv, theirs, peer),
                                dist.P2POp(dist.isend, mine, peer)])
    for w in works:
        w.wait()
    out["exchange"] = xp.asnumpy(theirs).tolist()
    side = xp.cuda.Stream(non_blocking=True)
    with side:  # NCCL's calls go on the caller's current stream
        c = xp.asarray(np.ones(4, "float32"))
        dist.all_reduce(c)
    side.synchronize()
    out["side stream"] = xp.asnumpy(c).tolist()
    if hasattr(side, "last_ops"):  # the fake GPU records what ran on each stream
        out["on side stream"] = [op for op in side.last_ops if op.startswith("nccl.")]
    sub = dist.new_group([0, 1])  # its own NCCL communicator, bootstrapped on first use
    a = xp.asarray(_input(rank, "float32", 10))
    dist.all_reduce(a, group=sub)
    out["subgroup"] = bool(np.allclose(xp.asnumpy(a), _reduced("SUM", "float32", 10)))
    for name, call in [("host", lambda: dist.all_reduce(np.zeros(4, np.float32))),
                       ("host send", lambda: dist.send(np.zeros(4, np.float32), peer)),
                       ("bool", lambda: dist.all_reduce(xp.asarray(np.ones(3, bool)))),
                       ("bxor", lambda: dist.all_reduce(xp.asarray(np.ones(3, np.int32)),
                                                        op=dist.ReduceOp.BXOR)),
                       ("mismatch", lambda: dist.all_reduce(xp.ones(4 + rank, "float32")))]:
        try:
            call()
            out[name] = "no error"
        except (TypeError, ValueError, CollectiveMismatchError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    after = xp.asarray(np.ones(4, "float32"))
    dist.all_reduce(after)  # the group still works
    out["after"] = xp.asnumpy(after).tolist()
    return out


def _p2p_program(rank, queue):
    _report(rank, queue, _p2p_and_errors)


def test_p2p_subgroup_and_named_errors(gpus):
    got = _run(_p2p_program)
    for rank, out in got.items():
        assert out["recv"] == ([0, 2, 4, 6, 8, 10, 12, 14] if rank == 0 else [0, 1, 2, 3, 4])
        assert out["exchange"] == [1 - rank] * 3
        assert out["side stream"] == [N] * 4
        if gpus == "fake":  # the call check's all-gather, then the data's all_reduce
            assert out["on side stream"] == ["nccl.allGather", "nccl.allReduce"]
        assert out["subgroup"]
        assert out["host"].startswith(
            "TypeError: nccl channel: buffer is host memory (got numpy.ndarray float32[4]); "
            "NCCL moves GPU memory: .cuda() it first, or use the tcp/shm channel")
        assert "buffer is host memory (got numpy.ndarray float32[4])" in out["host send"]
        assert "NCCL cannot reduce bool" in out["bool"]
        assert "NCCL has no ReduceOp.BXOR" in out["bxor"]
        assert out["mismatch"].startswith("CollectiveMismatchError") and "disagree" in \
            out["mismatch"]
        assert out["after"] == [N] * 4


# -- a peer killed mid-collective (fake: real NCCL's own watchdog is torch's business) -------

def _killed_peer(rank: int) -> dict:
    xp = _start(rank)
    a = xp.asarray(np.ones(8, "float32"))
    dist.all_reduce(a)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # dies while rank 0 enters the next collective
    return _error_of(dist.all_reduce, a)


def _error_of(call, *args) -> dict:
    """{"error": what call(*args) raised, as text, or None}."""
    try:
        call(*args)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None}


def _killed_program(rank, queue):
    _report(rank, queue, _killed_peer)


def test_killed_peer_is_named(gpus):
    if gpus != "fake":
        pytest.skip("killing a rank under real NCCL leaves its communicator to NCCL's abort; "
                    "the fake NCCL checks the error text")
    exited, got = spawn_and_collect(_killed_program, N, 1, 60)
    assert exited and list(got) == [0], got
    error = got[0]["error"]
    assert error is not None and "rank 1" in error, error


def _late_peer(rank: int) -> dict:
    xp = _start(rank)
    a = xp.asarray(np.ones(8, "float32"))
    if rank == 1:
        # Alive, but never in the collective, until rank 0 has heard who is missing (its 2 s
        # timeout, with room for the load).
        time.sleep(machine.seconds(4, 30))
        return {"error": None}
    return _error_of(dist.all_reduce, a)


def _late_program(rank, queue):
    _report(rank, queue, _late_peer)


def test_late_peer_is_named_within_the_timeout(gpus, monkeypatch):
    if gpus != "fake":
        pytest.skip("real NCCL waits on the GPU; the fake NCCL checks the error text")
    monkeypatch.setenv("MWRT_CHANNEL_TIMEOUT", "2")  # the fake root's wait for a late rank
    got = _run(_late_program)
    assert "ranks [1] did not join it within 2.0 s" in got[0]["error"], got[0]


# -- master-issued collectives over GPU tensors: NCCL among the workers ---------------------

@pytest.fixture
def workers(gpus):
    """Two local workers, node i computing on GPU i (NCCL needs a GPU per rank)."""
    import mwrt

    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=N, timeout=30)
    yield mwrt
    mwrt.shutdown()


def test_master_collectives_over_gpu_tensors(workers):
    mwrt = workers
    ts = [mwrt.dist_send(np.full(1000, i + 1.0, np.float32), node=i, device=i)
          for i in range(N)]
    mwrt.all_reduce(ts)
    for i, t in enumerate(ts):
        assert (t.get_node(), t.get_device()) == (i, i)
        np.testing.assert_array_equal(t.numpy(), np.full(1000, 3.0, np.float32))
    # NCCL has no BOR, nor int16: the workers fall back to the session channel together.
    ints = [mwrt.dist_send(np.array([1, 2, 4], np.int16) << i, node=i, device=i)
            for i in range(N)]
    mwrt.all_reduce(ints, op=mwrt.ReduceOp.BOR)
    np.testing.assert_array_equal(ints[1].numpy(), [3, 6, 12])
    mwrt.all_reduce(ints, op="max")
    np.testing.assert_array_equal(ints[0].numpy(), [3, 6, 12])
    mwrt.broadcast(ts, src=1)
    total = mwrt.reduce(ts, dst=0)
    np.testing.assert_array_equal(total.numpy(), np.full(1000, 6.0, np.float32))
    fresh = [mwrt.dist_send(np.full(2, i, np.int64), node=i, device=i) for i in range(N)]
    gathered = mwrt.all_gather(fresh)
    for g in gathered:
        np.testing.assert_array_equal(g.numpy(), [[0, 0], [1, 1]])

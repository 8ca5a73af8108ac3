"""One test body per collective, run over every channel, world sizes 1..4 and several dtypes."""

from __future__ import annotations

import array
import time
from functools import reduce as fold

import numpy as np
import pytest
from tests.support.machine import seconds
from tests.support.ranks import available, run_ranks

from mwrt.collective import api as C
from mwrt.collective.buffers import narrow_to_bfloat16, widen_bfloat16
from mwrt.collective.reduce_ops import ReduceOp
from mwrt.errors import CollectiveMismatchError

pytestmark = pytest.mark.timeout(90)

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8]
COUNTS = [0, 1, 5, 37]
# (small_bytes, segment_bytes): latency algorithms; rings with one segment; rings with many
PATHS = [(1 << 20, 1 << 20), (0, 1 << 20), (0, 8)]
OPS = {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum,
       ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
       ReduceOp.BXOR: np.bitwise_xor, ReduceOp.AVG: np.add}



def _skip(name):
    return pytest.mark.skipif(not available(name), reason=f"channel {name!r} is not available")


BACKENDS = ["inproc"] + [pytest.param(b, marks=_skip(b)) for b in ("tcp", "shm")]
CASES = [("inproc", n) for n in (1, 2, 3, 4)] + [
    pytest.param(b, n, marks=_skip(b)) for b in ("tcp", "shm") for n in (2, 3)]


def data(rank, count, dtype, salt=0):
    """Small positive values, so PRODUCT stays exact and bitwise ops are meaningful."""
    return ((np.arange(count) * (rank + 3) + rank + salt) % 5 + 1).astype(dtype)


def ops_for(dtype):
    kind = np.dtype(dtype).kind
    return [op for op in OPS if (op not in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
                                 or kind in "iub") and (op is not ReduceOp.AVG or kind == "f")]


def cases():
    for small, seg in PATHS:
        for dtype in DTYPES:
            for count in COUNTS:
                yield small, seg, dtype, count


def over_paths(g, body):
    """Run body(small, seg, dtype, count) for every case; return the list of results."""
    out = []
    for small, seg, dtype, count in cases():
        g.small_bytes, g.segment_bytes = small, seg
        out.append(body(dtype, count))
    return out


def expected_reduce(op, n, count, dtype):
    value = fold(lambda a, b: OPS[op](a, b), [data(r, count, dtype) for r in range(n)])
    return value / n if op is ReduceOp.AVG else value


def close(a, b):
    if np.dtype(a.dtype).kind == "f":
        np.testing.assert_allclose(a, b, rtol=1e-6)
    else:
        np.testing.assert_array_equal(a, b)


# -- bodies (module level: processes need to pickle them) ----------------------------------


def _all_reduce(g, r):
    def body(dtype, count):
        res = {}
        for op in ops_for(dtype):
            a = data(r, count, dtype)
            C.all_reduce(g, a, op)
            res[op] = a
        return res
    return over_paths(g, body)


@pytest.mark.parametrize("backend,n", CASES)
def test_all_reduce(backend, n):
    results = run_ranks(backend, n, _all_reduce)
    for i, (small, seg, dtype, count) in enumerate(cases()):
        for op, got in results[0][i].items():
            close(got, expected_reduce(op, n, count, dtype))
            for other in results[1:]:  # bitwise identical on every rank
                assert other[i][op].tobytes() == got.tobytes(), (op, dtype, count, small, seg)


def _rooted(g, r, kind):
    def body(dtype, count):
        res = []
        for root in range(g.size):
            a = data(r, count, dtype)
            if kind == "broadcast":
                C.broadcast(g, a, root)
            else:
                C.reduce(g, a, root, ReduceOp.MAX if dtype == np.uint8 else ReduceOp.SUM)
            res.append(a)
        return res
    return over_paths(g, body)


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
@pytest.mark.parametrize("backend,n", CASES)
def test_broadcast_and_reduce(backend, n, kind):
    results = run_ranks(backend, n, _rooted, kind)
    for i, (_, _, dtype, count) in enumerate(cases()):
        for root in range(n):
            if kind == "broadcast":
                for r in range(n):
                    close(results[r][i][root], data(root, count, dtype))
            else:
                op = ReduceOp.MAX if dtype == np.uint8 else ReduceOp.SUM
                close(results[root][i][root], expected_reduce(op, n, count, dtype))


def _gather_scatter(g, r):
    def body(dtype, count):
        n, res = g.size, []
        for root in range(n):
            out = np.zeros(n * count, dtype) if r == root else None
            C.gather(g, data(r, count, dtype), out, root)
            got = np.zeros(count, dtype)
            src = np.concatenate([data(p, count, dtype, 1) for p in range(n)]) if r == root else None
            C.scatter(g, got, src, root)
            res.append((out, got))
        return res
    return over_paths(g, body)


@pytest.mark.parametrize("backend,n", CASES)
def test_gather_and_scatter(backend, n):
    results = run_ranks(backend, n, _gather_scatter)
    for i, (_, _, dtype, count) in enumerate(cases()):
        for root in range(n):
            close(results[root][i][root][0], np.concatenate([data(p, count, dtype) for p in range(n)]))
            for r in range(n):
                close(results[r][i][root][1], data(r, count, dtype, 1))


def _all_gather_family(g, r):
    def body(dtype, count):
        n = g.size
        gathered = np.zeros(n * count, dtype)
        C.all_gather(g, gathered, data(r, count, dtype))
        scattered = np.zeros(count, dtype)
        src = np.concatenate([data(r, count, dtype, p) for p in range(n)])
        C.reduce_scatter(g, scattered, src, ReduceOp.MAX)
        exchanged = np.zeros(n * count, dtype)
        C.all_to_all(g, exchanged, src)
        C.barrier(g)
        return gathered, scattered, exchanged
    return over_paths(g, body)


@pytest.mark.parametrize("backend,n", CASES)
def test_all_gather_reduce_scatter_all_to_all(backend, n):
    results = run_ranks(backend, n, _all_gather_family)
    for i, (_, _, dtype, count) in enumerate(cases()):
        for r in range(n):
            gathered, scattered, exchanged = results[r][i]
            close(gathered, np.concatenate([data(p, count, dtype) for p in range(n)]))
            close(scattered, fold(np.maximum, [data(p, count, dtype, r) for p in range(n)]))
            close(exchanged, np.concatenate([data(p, count, dtype, r) for p in range(n)]))


def _uneven_all_gather(g, r):
    def body(dtype, count):
        counts = [(count + p) % 4 * (p + 1) for p in range(g.size)]  # some ranks give none
        out = np.zeros(sum(counts), dtype)
        C.all_gather_v(g, out, data(r, counts[r], dtype), counts)
        return counts, out
    return over_paths(g, body)


@pytest.mark.parametrize("backend,n", CASES)
def test_all_gather_with_uneven_counts(backend, n):
    for r, per_case in enumerate(run_ranks(backend, n, _uneven_all_gather)):
        for counts, out in per_case:
            close(out, np.concatenate([data(p, c, out.dtype) for p, c in enumerate(counts)]))


def _uneven_all_to_all(g, r):
    def body(dtype, count):
        n = g.size
        def sent(a, b):  # how many elements rank a sends rank b
            return (count + a * 2 + b) % 3
        src = np.concatenate([data(r, sent(r, p), dtype, p) for p in range(n)])
        out = np.zeros(sum(sent(p, r) for p in range(n)), dtype)
        C.all_to_all_v(g, out, src, [sent(r, p) for p in range(n)],
                       [sent(p, r) for p in range(n)])
        return out, [data(p, sent(p, r), dtype, r) for p in range(n)]
    return over_paths(g, body)


@pytest.mark.parametrize("backend,n", CASES)
def test_all_to_all_with_uneven_counts(backend, n):
    for per_case in run_ranks(backend, n, _uneven_all_to_all):
        for out, parts in per_case:
            close(out, np.concatenate(parts))


def _uneven_disagreement(g, r):
    counts = [2, 1, 3] if r == 1 else [1, 2, 3]  # the same total: only the split differs
    C.all_gather_v(g, np.zeros(6), np.zeros(counts[r]), counts)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ranks_that_split_an_uneven_all_gather_differently_are_told(backend):
    for r, e in enumerate(run_ranks(backend, 3, _uneven_disagreement, errors=True)):
        assert "disagree" in str(e) and "split by rank" in str(e), (r, str(e))
        assert "rank 1:" in str(e) and "ranks 0, 2:" in str(e), (r, str(e))


# -- errors -----------------------------------------------------------------------------------


def _mismatch(g, r, field):
    a = np.zeros(4, np.float32)
    if r == 1:
        a = {"dtype": np.zeros(4, np.float64), "shape": np.zeros(5, np.float32)}.get(field, a)
    op = ReduceOp.MAX if (r == 1 and field == "op") else ReduceOp.SUM
    if field == "kind" and r == 1:
        C.broadcast(g, a, 0)
    else:
        C.all_reduce(g, a, op)
    C.all_reduce(g, np.ones(3), ReduceOp.SUM)  # the group stays usable after a clean call


@pytest.mark.parametrize("field,needle", [("dtype", "float64[4]"), ("shape", "float32[5]"),
                                          ("op", "op=MAX"), ("kind", "broadcast")])
@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatch_raises_on_every_rank(backend, field, needle):
    errors = run_ranks(backend, 3, _mismatch, field, errors=True)
    for r, e in enumerate(errors):
        assert isinstance(e, (CollectiveMismatchError, RuntimeError)), (r, e)
        assert "CollectiveMismatchError" in repr(type(e)) or "disagree" in str(e)
        assert needle in str(e) and "rank 1" in str(e) and "ranks 0, 2" in str(e), str(e)


def _small_against_large(g, r, late):
    if r == 1 and late:
        time.sleep(1.5)  # past the others' timeout: they must still name the real cause
    C.all_reduce(g, np.zeros(10 if r == 2 else 1 << 15, np.float32))


@pytest.mark.parametrize("late", [False, True], ids=["on_time", "one_rank_late"])
@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_ranks_on_different_algorithms_still_name_the_mismatch(backend, late):
    # Rank 2's small call carries its check in recursive doubling; the others' large one
    # checks beside its data: they meet, and every rank reports the shapes.
    errors = run_ranks(backend, 3, _small_against_large, late, timeout=seconds(1.0, 10.0),
                       errors=True)
    for r, e in enumerate(errors):
        if r == 1 and late and "disagree" not in str(e):  # came after the others had left
            assert "rank 0" in str(e) or "rank 2" in str(e), str(e)
            continue
        assert "disagree" in str(e) and "float32[10]" in str(e), (r, str(e))
        assert "float32[32768]" in str(e), (r, str(e))


def test_bad_arguments_are_errors_not_hangs():
    def body(g, r):
        with pytest.raises(TypeError, match="needs an integer"):
            C.all_reduce(g, np.ones(3), ReduceOp.BXOR)
        with pytest.raises(TypeError, match="needs a floating"):
            C.all_reduce(g, np.ones(3, np.int32), ReduceOp.AVG)
        with pytest.raises(ValueError, match="not C-contiguous"):
            C.all_reduce(g, np.ones((4, 4))[:, 1])
        with pytest.raises(ValueError, match="root must be"):
            C.broadcast(g, np.ones(3), 7)
        with pytest.raises(ValueError, match="wrong size"):
            C.all_gather(g, np.ones(3), np.ones(3))
    run_ranks("inproc", 2, body)


class DLPackOnly:
    """An array known to NumPy only through DLPack, as a torch CPU tensor is."""

    def __init__(self, arr, fail=False):
        self.arr, self.fail, self.dtype = arr, fail, "bfloat16" if fail else arr.dtype

    def __dlpack__(self, **kwargs):
        if self.fail:
            raise BufferError("Unsupported dtype in DLTensor")
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_in_place_on_buffer_protocol_and_dlpack_arrays():
    def body(g, r):
        packed = array.array("f", [r + 1.0] * 3)
        C.all_reduce(g, packed)
        behind = np.full(4, r + 1, np.int32)
        C.all_reduce(g, DLPackOnly(behind), ReduceOp.MAX)
        with pytest.raises(TypeError, match=r"all_reduce: NumPy cannot view .*bfloat16"):
            C.all_reduce(g, DLPackOnly(np.ones(2), fail=True))
        return list(packed), behind.tolist()
    for got in run_ranks("inproc", 2, body):
        assert got == ([3.0, 3.0, 3.0], [2, 2, 2, 2])


@pytest.mark.slow  # torch's import in each rank
def test_torch_cpu_tensors_reduce_in_place():
    torch = pytest.importorskip("torch", reason="torch is only compared against, not required")

    def body(g, r):
        t = torch.full((2, 3), float(r + 1))
        C.all_reduce(g, t)
        half = torch.tensor([1.5, 1e-3, 3e38, -2.0], dtype=torch.bfloat16) * (r + 1)
        C.all_reduce(g, half)  # summed as float32, rounded back as torch rounds
        moved = torch.full((3,), r + 0.5, dtype=torch.bfloat16)
        C.broadcast(g, moved, 1)  # moved as bits
        with pytest.raises(ValueError, match=r"not C-contiguous.*pass t\.contiguous\(\)"):
            C.all_reduce(g, t.t())  # a transposed view: torch's own fix, not NumPy's
        return t.tolist(), half, moved.tolist()
    start = torch.tensor([1.5, 1e-3, 3e38, -2.0], dtype=torch.bfloat16)
    want = (start.float() + (start * 2).float()).bfloat16()
    for t, half, moved in run_ranks("inproc", 2, body):
        assert t == [[3.0] * 3] * 2 and moved == [1.5] * 3
        assert torch.equal(half, want), (half, want)


def test_bfloat16_rounds_to_nearest_even():
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, np.nan,
                       np.finfo(np.float32).max], np.float32)  # two exact ties among them
    bits = narrow_to_bfloat16(values)
    assert bits.tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80, 0x7FC0, 0x7F80]
    np.testing.assert_array_equal(widen_bfloat16(bits[:5]), [1.0, 1.0, 1.015625, -2.5, np.inf])


def _dies(g, r, victim):
    if r == victim:
        return "left"  # the harness closes this rank's channel: as if it died
    a = np.ones(64, np.float32)
    C.all_reduce(g, a)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_rank_is_named_by_every_survivor(backend):
    errors = run_ranks(backend, 3, _dies, 2, timeout=seconds(2.0, 10.0), errors=True)
    assert errors[2] == "left"
    for r in (0, 1):
        assert "all_reduce" in str(errors[r]) and "rank 2" in str(errors[r]), str(errors[r])

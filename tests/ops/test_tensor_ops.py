"""Ops on remote tensors give what NumPy gives on the same arrays (real daemons on loopback)."""

from __future__ import annotations

import operator
import re

import numpy as np
import pytest

from mwrt.master.tensor import Element

A = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
B = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
I = np.arange(12, dtype=np.int32).reshape(3, 4)


@pytest.fixture(scope="module")
def mw(cluster):
    return cluster


def same(t, expected):
    got = t.numpy()
    assert got.shape == np.shape(expected), (got.shape, np.shape(expected))
    assert got.dtype == np.asarray(expected).dtype, (got.dtype, np.asarray(expected).dtype)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # The master knew the shape and dtype before asking.
    assert t.shape == got.shape and t.dtype == got.dtype


@pytest.mark.parametrize("op", [operator.add, operator.sub, operator.mul, operator.truediv,
                                operator.floordiv, operator.mod, operator.pow, operator.lt,
                                operator.le, operator.eq, operator.ne, operator.gt, operator.ge])
def test_binary_operators_tensor_tensor_and_scalar(mw, op):
    a, b = mw.dist_send(A), mw.dist_send(np.abs(B) + 1)
    same(op(a, b), op(A, np.abs(B) + 1))
    same(op(a, 2.0), op(A, 2.0))
    same(op(3, a), op(3, A))


def test_a_power_of_two_is_numpys_square_as_for_bools(mw):
    flags = np.array([True, False, True])
    for array in (flags, A, I):
        for exponent in (2, 3, 2.0, True):
            same(mw.dist_send(array) ** exponent, array ** exponent)  # bools: int8, int64...


@pytest.mark.parametrize("op", [operator.and_, operator.or_, operator.xor, operator.lshift,
                                operator.rshift])
def test_bitwise_operators_on_ints(mw, op):
    same(op(mw.dist_send(I), 3), op(I, 3))


@pytest.mark.parametrize("op", [operator.neg, operator.pos, operator.abs])
def test_unary_operators(mw, op):
    same(op(mw.dist_send(B)), op(B))


def test_invert_on_ints(mw):
    same(~mw.dist_send(I), ~I)


@pytest.mark.parametrize("name", ["iadd", "isub", "imul", "itruediv"])
def test_inplace_operators_keep_the_handle(mw, name):
    a = mw.dist_send(A)
    expected = getattr(operator, name)(A.copy(), 2.0)
    b = getattr(operator, name)(a, 2.0)
    assert b is a
    same(a, expected)


def test_a_zero_d_result_is_immutable_as_numpys_scalar(mw):
    """NumPy's a.sum() and a0 + a0 are scalars: `s += 1` makes a new value, which a name
    bound to the old one does not see, and a view of one is of a copy."""
    a = mw.dist_send(A)
    s = a.sum()
    kept = s
    s += 1
    assert s is not kept and float(kept) == A.sum() and float(s) == A.sum() + 1
    v = np.expand_dims(kept, 0)
    v[0] = -1
    assert float(kept) == A.sum() and v.numpy().tolist() == [-1]
    z = mw.dist_send(np.array(2.0))  # a 0-d array, not a scalar: its views write it
    w = z[None]
    w[0] = 3
    assert float(z) == 3


def test_conj_of_a_real_tensor_is_the_tensor_as_numpys(mw):
    """NumPy's a.conj() of a real array is the array itself (what writes it writes a); of a
    complex one, a new array; np.maximum.reduce's 0-d result is a scalar like sum()'s."""
    a = mw.dist_send(A.copy())
    b = a.conj()
    b[0] = 9
    assert b is a and a.numpy()[0].tolist() == [9.0] * A.shape[1]
    c = mw.dist_send(np.array([1 + 2j, 3j]))
    d = c.conjugate()
    d[0] = 0
    assert c.numpy().tolist() == [1 + 2j, 3j] and d.numpy().tolist() == [0, -3j]
    m = np.maximum.reduce(mw.dist_send(np.arange(4.0)))
    v = m[None]
    v[0] = -1
    assert float(m) == 3.0


@pytest.mark.parametrize("fn", [
    lambda v: np.dot(v, v), lambda v: v @ v, lambda v: np.linalg.norm(v),
    lambda v: np.trace(np.outer(v, v)), lambda v: np.linalg.det(np.diag(v + 1)),
    lambda v: np.take(v, 1), lambda v: np.clip(v[2:3].reshape(()), 0, 1),
    lambda v: np.round(v.sum()), lambda v: np.copy(v[1:2].reshape(()))],
    ids=["dot", "matmul", "norm", "trace", "det", "take", "clip", "round", "copy"])
def test_a_functions_zero_d_result_is_a_scalar_where_numpys_is(mw, fn):
    """np.dot(v, v), np.linalg.norm(v), np.take(v, 1) ... give NumPy scalars, whose views
    view a copy; np.copy of a 0-d array gives a 0-d array, whose views write it."""
    host = np.arange(4.0)
    expected, got = fn(host), fn(mw.dist_send(host))
    kept = np.array(expected)
    for r in (expected, got):
        view = r[None]
        view[0] = -5
    assert np.isscalar(expected) is (isinstance(got, Element)) is np.isscalar(got)
    assert got.numpy().tolist() == (kept if np.isscalar(expected) else expected).tolist()


def test_an_element_is_a_number_as_numpys_scalar_is(mw):
    import numbers

    a = np.arange(4.0)
    t = mw.dist_send(a)
    assert isinstance(t[0], numbers.Number) and np.isscalar(t.sum())
    assert not isinstance(t, numbers.Number) and not np.isscalar(t)
    np.testing.assert_equal(t[1], 1.0)  # scalars compare as scalars, as NumPy's do
    np.testing.assert_equal(t.sum(), 6.0)


_OF_A_SCALAR = {
    "astype": lambda s: s.astype(np.bool_), "copy": lambda s: s.copy(),
    "reshape": lambda s: s.reshape(()), "np.reshape": lambda s: np.reshape(s, ()),
    "real": lambda s: s.real, "imag": lambda s: s.imag, "squeeze": lambda s: s.squeeze(),
    "T": lambda s: s.T, "np.transpose": lambda s: np.transpose(s), "[()]": lambda s: s[()],
    "[...]": lambda s: s[...], "np.copy": lambda s: np.copy(s),
    "[array(0)]": lambda s: s.reshape(1)[np.array(0)],
    "np.expand_dims": lambda s: np.expand_dims(s, 0)}


@pytest.mark.parametrize("fn", _OF_A_SCALAR.values(), ids=_OF_A_SCALAR.keys())
def test_a_scalars_methods_give_scalars_where_numpys_do(mw, fn):
    """NumPy's s.astype(bool), s.copy(), s.reshape(()), s.T, s[()] of a scalar are scalars
    (`v += 0` makes a new value of NumPy's promoted dtype: an int from a bool), of a 0-d
    array they are arrays, which += writes; np.copy(s) and s[...] are arrays. They were
    arrays for both, and `s.astype(bool) += 0` raised mwrt's in-place cast error."""
    for host, tensor in ((np.int64(6), mw.dist_send(np.arange(4)).sum()),
                         (np.array(3), mw.dist_send(np.array(3)))):
        expected, got = fn(host), fn(tensor)
        assert np.isscalar(expected) is (isinstance(got, Element)), (host, got)
        if np.ndim(expected) == 0 and np.isscalar(expected):
            expected += 0
            got += 0
            assert isinstance(got, Element) and got.dtype == np.asarray(expected).dtype
        same(got, expected)
    kept = mw.dist_send(np.arange(4)).sum()
    view = kept.reshape(())
    view += 1
    assert int(kept) == 6 and int(view) == 7  # a new value, as a scalar's reshape(()) is


def test_inplace_cast_error_is_raised_at_issue_time(mw):
    a = mw.dist_send(I)
    with pytest.raises(TypeError, match="cannot cast"):
        a += 1.5


def test_shape_mismatch_raises_at_issue_time(mw):
    with pytest.raises(ValueError, match=r"could not be broadcast.*\(3, 4\) \(5,\)"):
        mw.dist_send(A) + mw.dist_send(np.ones(5, np.float32))


def test_matmul_and_ufuncs(mw):
    a = mw.dist_send(A)
    same(a @ a.T, A @ A.T)
    same(np.exp(a), np.exp(A))
    same(np.add(a, 1), A + 1)
    same(np.maximum(a, mw.dist_send(B)), np.maximum(A, B))
    q, r = np.divmod(a, 5)
    same(q, np.divmod(A, 5)[0])
    same(r, np.divmod(A, 5)[1])
    same(np.add.reduce(a), A.sum(axis=0))
    with pytest.raises(ValueError, match="core dimensions"):
        a @ a


def test_equality_with_what_numpy_cannot_compare_is_numpys_array_of_false(mw):
    a = np.arange(3.0)
    t = mw.dist_send(a)
    for other in ("a", b"z", object()):
        same(t == other, a == other)  # all False, as NumPy 2's ==
        same(t != other, a != other)
    with pytest.raises(TypeError):  # an ordering has no such answer, in NumPy either
        t < "a"


def test_an_operand_numpy_makes_no_array_of_numbers_of_is_pythons_type_error(mw):
    """t + object() returns NotImplemented, as np.ones(3) + object() fails in NumPy: Python
    raises its own TypeError, after the other operand's reflected method had its turn;
    lists, ranges and strings go as NumPy takes them."""
    a = np.arange(3.0)
    t = mw.dist_send(a)
    for other in (object(), None, {}, {1}):
        kind = type(other).__name__
        for sym, fn in (("+", operator.add), ("-", operator.sub), ("@", operator.matmul),
                        ("+=", operator.iadd), ("divmod()", divmod)):
            expected = rf"for {re.escape(sym)}: 'DistributedTensor' and '{kind}'"
            with pytest.raises(TypeError, match=rf"unsupported operand type\(s\) {expected}"):
                fn(t, other)
        with pytest.raises(TypeError, match=rf"for \*: '{kind}' and 'DistributedTensor'"):
            other * t
        with pytest.raises(TypeError, match=rf"'<' not supported between instances of "
                                            rf"'DistributedTensor' and '{kind}'"):
            t < other
        same(t == other, a == other)  # an array of False, as NumPy's ==
    with pytest.raises(TypeError, match="add_: a value of type object cannot be sent"):
        t.add_(object())  # a named method is no operator: its own error
    for other in ("a", b"z"):  # NumPy makes arrays of these, and has no loop for the pair
        with pytest.raises(TypeError, match="did not contain a loop"):
            t + other
        with pytest.raises(TypeError, match="did not contain a loop"):
            a + other
    same(t + [1, 2, 3], a + [1, 2, 3])
    same((4, 5, 6) - t, (4, 5, 6) - a)
    same(t * range(3), a * range(3))


def test_an_operand_of_another_class_has_its_reflected_operator_called(mw):
    class Other:
        def __radd__(self, other):
            return "radd"

        def __rmatmul__(self, other):
            return "rmatmul"

        def __gt__(self, other):  # t < Other() asks this, reflected
            return "gt"

    t, other = mw.dist_send(np.arange(3.0)), Other()
    assert (t + other, t @ other, t < other) == ("radd", "rmatmul", "gt")
    u = t
    u += other  # __iadd__ and __add__ decline: Python rebinds u to other.__radd__(t)
    assert u == "radd"
    element = t[0]
    element += other
    assert element == "radd"


def test_a_numpy_datetime_scalars_unit_decides_the_result_as_in_numpy(mw):
    days = np.array(["2020-01-01", "2020-03-05", "2021-07-04"], dtype="datetime64[D]")
    t = mw.dist_send(days)
    same(t > np.datetime64("2020-06-01"), days > np.datetime64("2020-06-01"))  # no unit: 'D'
    for step in (np.timedelta64(1, "D"), np.timedelta64(3, "h"), np.timedelta64(5, "ms")):
        got, want = t + step, days + step  # one op, its scalar of another unit each time
        assert got.dtype == want.dtype, (step, got.dtype)
        np.testing.assert_array_equal(got.numpy(), want)


def test_generalized_ufuncs_take_axis_axes_and_keepdims(mw):
    a = np.arange(12.0).reshape(3, 4) - 5
    t = mw.dist_send(a)
    for name, got, want in [
        ("vecdot axis", np.vecdot(t, t, axis=0), np.vecdot(a, a, axis=0)),
        ("vecdot keepdims", np.vecdot(t, t, axis=0, keepdims=True),
         np.vecdot(a, a, axis=0, keepdims=True)),
        ("vecdot axes", np.vecdot(t, t.T, axes=[(0,), (1,), ()]),
         np.vecdot(a, a.T, axes=[(0,), (1,), ()])),
        ("matvec axes", np.matvec(t, np.ones(3), axes=[(1, 0), (0,), (0,)]),
         np.matvec(a, np.ones(3), axes=[(1, 0), (0,), (0,)])),
        ("matmul axes", np.matmul(t, t.T, axes=[(-2, -1), (-2, -1), (-1, -2)]),
         np.matmul(a, a.T, axes=[(-2, -1), (-2, -1), (-1, -2)])),
    ]:
        assert got.shape == want.shape, name
        same(got, want)


def test_ufunc_out_argument(mw):
    a = mw.dist_send(A)
    assert np.multiply(a, 2, out=a) is a
    same(a, A * 2)


def test_a_numpy_array_out_is_written_as_numpy_writes_it(mw):
    a = mw.dist_send(A)
    b = np.ones_like(A)
    b -= a  # ndarray.__isub__: np.subtract(b, a, out=b)
    np.testing.assert_array_equal(b, 1 - A)
    c = np.zeros_like(A)
    assert np.add(A, a, out=c, where=A > 4) is c
    np.testing.assert_array_equal(c, np.add(A, A, out=np.zeros_like(A), where=A > 4))
    counts = np.arange(12).reshape(3, 4)
    with pytest.raises(TypeError, match="Cannot cast"):  # float into int, as NumPy refuses
        counts += a
    ranked = np.zeros(3)  # ufunc.at into a master array (scikit-learn's dcg_score)
    np.add.at(ranked, mw.dist_send(np.array([0, 2, 0])), mw.dist_send(np.array([1.0, 2, 4])))
    np.testing.assert_array_equal(ranked, [5.0, 0.0, 2.0])


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "min", "max", "argmin", "argmax",
                                  "std", "var", "any", "all"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_reductions(mw, name, axis):
    a = mw.dist_send(A)
    same(getattr(a, name)(axis=axis), getattr(np, name)(A, axis=axis))


def test_reductions_keepdims_tuple_axis_and_numpy_functions(mw):
    a = mw.dist_send(A.reshape(3, 2, 2))
    same(a.sum(axis=(0, 2), keepdims=True), A.reshape(3, 2, 2).sum(axis=(0, 2), keepdims=True))
    same(np.mean(a, axis=1), A.reshape(3, 2, 2).mean(axis=1))
    with pytest.raises(np.exceptions.AxisError):
        a.sum(axis=5)


def test_shape_ops(mw):
    a = mw.dist_send(A)
    same(a.reshape(4, 3), A.reshape(4, 3))
    same(a.view(-1), A.reshape(-1))
    same(a.reshape((2, 6)), A.reshape(2, 6))
    same(a.flatten(), A.flatten())
    same(a.T, A.T)
    same(a.transpose(1, 0), A.T)
    same(a.reshape(3, 1, 4).squeeze(), A)
    same(a.expand_dims(0), A[None])
    same(np.transpose(a), A.T)
    with pytest.raises(ValueError):
        a.reshape(5, 5)


def test_indexing(mw):
    a = mw.dist_send(A)
    same(a[1], A[1])
    same(a[:, 1:3], A[:, 1:3])
    same(a[..., None, ::2], A[..., None, ::2])
    same(a[[0, 2]], A[[0, 2]])
    same(a[mw.dist_send(np.array([2, 0]))], A[[2, 0]])
    mask = a > 6
    masked = a[mask]  # shape depends on data: resolved when first needed
    np.testing.assert_array_equal(masked.numpy(), A[A > 6])
    assert masked.shape == (6,)
    with pytest.raises(IndexError):
        a[7]


def test_item_assignment(mw):
    a = mw.dist_send(A)
    expected = A.copy()
    a[0] = 0
    expected[0] = 0
    a[:, 1] = mw.dist_send(np.full(3, 9, np.float32))
    expected[:, 1] = 9
    a[a > 10] = -1
    expected[expected > 10] = -1
    same(a, expected)
    with pytest.raises(ValueError, match="could not broadcast"):
        a[0] = mw.dist_send(np.ones(3, np.float32))


def test_astype_and_view_take_numpys_arguments(mw):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    t = mw.dist_send(a)
    assert t.astype(np.int32, copy=False) is t  # scikit-learn's X.astype(dtype, copy=False)
    same(t.astype(np.float64, copy=False), a.astype(np.float64))
    same(t.astype("f4", order="C", casting="same_kind"), a.astype("f4"))
    with pytest.raises(TypeError, match="according to the rule 'safe'"):
        t.astype(np.int16, casting="safe")
    for dtype in (np.int8, "f4", np.uint16, bool):
        same(t.view(dtype), a.view(dtype))
    with pytest.raises(ValueError, match="larger dtype"):
        t.view(np.int64)  # 12 bytes a row: NumPy's error, at issue
    t.view(np.uint8)[0, 0] = 255  # a view: the write reaches the tensor
    a.view(np.uint8)[0, 0] = 255
    same(t, a)
    assert t.view(3, 2).shape == (3, 2)  # torch's view(shape) stays reshape


def test_ndarray_methods_that_are_numpy_functions(mw):
    v = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    a = np.arange(12.0).reshape(3, 4)
    V, A = mw.dist_send(v), mw.dist_send(a)
    same(mw.dist_send(np.sort(v)).searchsorted([2, 5], side="right"),
         np.sort(v).searchsorted([2, 5], side="right"))
    assert V[V.argpartition(3)[3]].item() == np.partition(v, 3)[3]
    same(A.compress([True, False, True], axis=0), a.compress([True, False, True], axis=0))
    same(mw.dist_send(np.array([0, 1, 0])).choose([A[0, :3], A[1, :3]]),
         np.array([0, 1, 0]).choose([a[0, :3], a[1, :3]]))
    V.partition(3)  # in place, as ndarray.partition
    assert V.numpy()[3] == np.partition(v, 3)[3] and sorted(V.numpy()) == sorted(v)
    A.put([0, 5], [-1.0, -2.0])
    b = a.copy()
    b.put([0, 5], [-1.0, -2.0])
    same(A, b)
    assert A.tobytes() == b.tobytes() == bytes(A) and A.item(5) == b.item(5) == -2.0
    for value in (np.array(3), np.array(2.5), np.arange(3, dtype=np.int8)):
        assert bytes(mw.dist_send(value)) == bytes(value)  # a 0-d int: its value's zeros
    assert A.item(1, 2) == A.item((1, 2)) == b.item(1, 2)
    same(A.ravel("F"), b.ravel("F"))
    same(A.copy(order="F"), b.copy(order="F"))


def test_flat_indexing_reads_and_writes_as_numpys(mw):
    a = np.arange(9.0).reshape(3, 3)
    t = mw.dist_send(a)
    t.flat[::4] += 10  # the diagonal, as scikit-learn adds to it
    a.flat[::4] += 10
    t[:, ::-1].flat[[0, -1]] = -1  # a view's places: the write reaches the tensor
    a[:, ::-1].flat[[0, -1]] = -1
    t.flat[a.ravel() > 15] = 0
    a.flat[a.ravel() > 15] = 0
    np.testing.assert_array_equal(t.numpy(), a)
    same(t.flat[1:7:2], a.flat[1:7:2])
    assert t.flat[4].item() == a.flat[4] and len(t.flat) == 9
    np.testing.assert_array_equal(np.asarray(t.flat), np.asarray(a.flat))
    with pytest.raises(IndexError, match="index 9 is out of bounds for size 9"):
        t.flat[9]
    s = mw.dist_send(np.array(2.5))
    s.flat[0] = 4.0
    assert s.numpy() == 4.0 and s.shape == ()


def test_copies_casts_and_fills(mw):
    a = mw.dist_send(A)
    same(a.astype(np.int64), A.astype(np.int64))
    same(a.double(), A.astype(np.float64))
    c = a.clone()
    a.fill_(7)
    same(c, A)
    same(a, np.full_like(A, 7))
    a.zero_()
    same(a, np.zeros_like(A))
    a.copy_(mw.dist_send(B))
    same(a, B)
    a.copy_(mw.dist_send(np.arange(4, dtype=np.float32)))
    same(a, np.broadcast_to(np.arange(4, dtype=np.float32), (3, 4)))


def test_array_functions(mw):
    a, b = mw.dist_send(A), mw.dist_send(B)
    same(np.concatenate([a, b]), np.concatenate([A, B]))
    same(np.concatenate([a, b], axis=1), np.concatenate([A, B], axis=1))
    same(np.stack([a, b]), np.stack([A, B]))
    same(np.where(a > 5, a, b), np.where(A > 5, A, B))
    same(np.clip(a, 2, 8), np.clip(A, 2, 8))
    same(a.clip(3, None), np.clip(A, 3, None))


def test_sync_points(mw):
    a = mw.dist_send(A)
    np.testing.assert_array_equal(np.asarray(a), A)
    s = a.sum()
    assert float(s) == pytest.approx(A.sum())
    assert s.item() == pytest.approx(A.sum())
    assert a.tolist() == A.tolist()
    assert int(mw.dist_send(np.array(5))) == 5
    assert len(a) == 3
    with pytest.raises(ValueError, match="size 1"):  # NumPy's own error
        a.item()

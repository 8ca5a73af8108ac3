"""Every value NumPy's (issue 25): each case runs on NumPy arrays and on remote tensors, and
the results agree in value, dtype and shape, of the handle and of .numpy().

Each case is a function of `T`, which makes an operand from a NumPy array: the array itself
(NumPy's run) or mwrt.dist_send of it (mwrt's run). A case returns what to compare: a
result, or the tensors it changed in place (a tuple of them).
"""

from __future__ import annotations

import numpy as np
import pytest

import mwrt
from mwrt.ops import Spec
from mwrt.worker.calls import _checked

M = np.arange(12).reshape(3, 4)


def _imatmul_through_a_view(T):
    x = T(np.arange(9.0).reshape(3, 3))
    v = x[:, :2]
    v @= T(np.array([[0.0, 1.0], [1.0, 0.0]]))
    return x


def _sort_in_place(T):
    x = T(np.array([3, 1, 2]))
    returned = x.sort()
    return x, returned


def _out_with_where_keeps_skipped_places(T):
    c = T(np.full(4, -1))
    np.add(10, c, out=c, where=T(np.array([True, False, True, False])))
    return c


def _out_with_a_numpy_where(T):
    c = T(np.full(4, -1.0))
    np.multiply(T(np.arange(4.0)), 2, out=c, where=np.array([False, True, True, False]))
    return c


def _ior_on_a_bool_element(T):
    b = T(np.array([True, False]))
    b[1] |= 1
    return b


def _iadd_float_to_an_int_element(T):
    i = T(np.array([1, 2]))
    i[0] += 2.5
    return i


def _setitem_int64_into_uint8_wraps(T):
    u = T(np.zeros(2, np.uint8))
    u[0] = np.int64(300)
    return u


def _setitem_a_0d_array(T):
    a = T(np.zeros(2))
    a[0] = np.array(2.5)
    return a


def _iadd_a_0d_array(T):
    t0 = T(np.array(1))
    t0 += np.array(1)
    return t0


def _setitem_an_empty_list(T):
    t = T(np.arange(3))
    t[[]] = 5
    return t


def _sum_into_out(T):
    c = T(np.zeros(4))
    returned = np.sum(T(M), axis=0, out=c)
    return c, returned


def _reduction_method_into_out(T):
    c = T(np.zeros(3, np.int64))
    T(M).max(1, out=c)
    return c


def _clip_into_out(T):
    x = T(np.arange(8))
    np.clip(x, 2, 5, out=x)
    return x


def _dot_into_out(T):
    c = T(np.zeros((3, 3)))
    np.dot(T(M * 1.0), T(M.T * 1.0), out=c)
    return c


def _add_at(T):
    x = T(np.zeros(4))
    np.add.at(x, np.array([0, 0, 2]), 1.5)
    return x


def _fill(T):
    x = T(np.zeros(3, np.int32))
    returned = x.fill(7)
    return x, returned


def _set_real_and_imag(T):
    z = T(np.array([1 + 2j, 3 - 1j]))
    z.real = 5.0
    z.imag = np.array([1.0, 2.0])
    return z


CASES = {
    # NumPy scalars are typed on the wire (NEP 50), Python scalars weak
    "int64_scalar_widens_int8": lambda T: T(np.array([100, 120], np.int8)) + np.int64(100),
    "float64_scalar_widens_float32": lambda T: T(np.ones(3, np.float32)) * np.float64(0.1),
    "uint64_scalar_on_10000_elements": lambda T: T(np.arange(10000)) + np.uint64(1),
    "bool_scalar": lambda T: T(np.array([1, 2], np.int8)) * np.bool_(True),
    "complex64_scalar": lambda T: T(np.ones(2, np.float32)) + np.complex64(1j),
    "float32_scalar_keeps_float16": lambda T: T(np.ones(2, np.float16)) + np.float32(1),
    "python_int_is_weak": lambda T: T(np.array([100], np.int8)) + 1,
    "python_float_is_weak": lambda T: T(np.ones(2, np.float32)) * 0.1,
    "where_with_a_typed_scalar": lambda T: np.where(T(np.array([True, False])),
                                                    T(np.array([1, 2], np.int8)), np.int64(300)),
    "clip_with_typed_scalars": lambda T: np.clip(T(np.array([1, 2], np.int8)), np.int64(0),
                                                 np.int64(300)),
    # 0-d arrays stay 0-d
    "compare_with_a_0d_array": lambda T: T(np.array(3.0)) <= np.array(4.0),
    "index_with_a_0d_array": lambda T: T(M)[np.array(1)],
    "add_a_0d_array": lambda T: T(np.arange(3, dtype=np.int8)) + np.array(200, np.int16),
    # the handle's meta follows NumPy's rules
    "dot_of_3d_operands": lambda T: np.dot(T(np.ones((1, 2, 3))), T(np.ones((1, 3, 2)))),
    "dot_with_a_python_scalar": lambda T: np.dot(T(np.arange(3)), 2),
    "dot_of_a_matrix_and_a_vector": lambda T: np.dot(T(M), T(np.arange(4))),
    "inner_of_0d_and_1d": lambda T: np.inner(T(np.array(2.0)), T(np.ones(3))),
    "concatenate_with_dtype": lambda T: np.concatenate([T(np.arange(3)), T(np.arange(3))],
                                                       dtype=np.float64),
    "round_of_bool": lambda T: np.round(T(np.array([True, False]))),
    "round_builtin_of_an_element_with_digits": lambda T: round(T(np.array([0.25, 1.5]))[0], 1),
    # arguments bind by NumPy's signatures
    "sum_positional_dtype": lambda T: T(M).sum(0, np.float64),
    "mean_positional_dtype": lambda T: T(M).mean(1, np.float32),
    "prod_positional_dtype": lambda T: T(M).prod(0, np.int8),
    "sum_dtype_python_float": lambda T: T(M).sum(dtype=float),
    "sum_keepdims": lambda T: T(M).sum(1, keepdims=True),
    "sum_where": lambda T: T(M).sum(where=T(M > 4)),
    "clip_min_only": lambda T: T(np.arange(5)).clip(min=2),
    "argsort_kind": lambda T: T(np.array([3, 1, 2, 1])).argsort(kind="stable"),
    "reshape_order_f": lambda T: T(np.arange(6)).reshape((2, 3), order="F"),
    "flatten_f": lambda T: T(M).flatten("F"),
    # what raised where NumPy succeeds
    "index_with_an_empty_list": lambda T: T(np.arange(3))[[]],
    "argsort_of_0d": lambda T: np.argsort(T(np.array(3))),
    "add_a_list": lambda T: T(np.arange(3)) + [1, 2, 3],
    "add_a_range": lambda T: np.add(T(np.arange(3, dtype=np.int8)), range(3)),
    "divmod": lambda T: divmod(T(np.arange(7)), 3),
    "add_accumulate": lambda T: np.add.accumulate(T(M), axis=1),
    "multiply_outer": lambda T: np.multiply.outer(T(np.arange(3)), T(np.arange(2.0))),
    "subtract_reduce": lambda T: np.subtract.reduce(T(M), axis=1),
    "amax": lambda T: np.amax(T(M), axis=0),
    "repeat": lambda T: T(np.arange(3)).repeat(2),
    "take": lambda T: T(M).take([0, 5]),
    "nonzero": lambda T: T(np.array([0, 3, 0, 4])).nonzero(),
    "real_of_complex": lambda T: T(np.array([1 + 2j, 3 - 1j])).real,
    "imag_of_float": lambda T: T(np.arange(3.0)).imag,
    # in place means in place
    "imatmul_through_a_view": _imatmul_through_a_view,
    "sort_in_place": _sort_in_place,
    "out_with_where_keeps_skipped_places": _out_with_where_keeps_skipped_places,
    "out_with_a_numpy_where": _out_with_a_numpy_where,
    "ior_on_a_bool_element": _ior_on_a_bool_element,
    "iadd_float_to_an_int_element": _iadd_float_to_an_int_element,
    "setitem_int64_into_uint8_wraps": _setitem_int64_into_uint8_wraps,
    "setitem_a_0d_array": _setitem_a_0d_array,
    "iadd_a_0d_array": _iadd_a_0d_array,
    "setitem_an_empty_list": _setitem_an_empty_list,
    "sum_into_out": _sum_into_out,
    "reduction_method_into_out": _reduction_method_into_out,
    "clip_into_out": _clip_into_out,
    "dot_into_out": _dot_into_out,
    "add_at": _add_at,
    "fill": _fill,
    "set_real_and_imag": _set_real_and_imag,
}


def agree(got, expected, where: str = "result"):
    """`got` (tensors) equals `expected` (NumPy's) in value, dtype and shape, of the handle
    and of .numpy()."""
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected), (where, got)
        for i, (g, e) in enumerate(zip(got, expected)):
            agree(g, e, f"{where}[{i}]")
        return
    if expected is None:
        assert got is None, (where, got)
        return
    expected = np.asarray(expected)
    assert isinstance(got, mwrt.DistributedTensor), (where, type(got))
    assert (got.shape, got.dtype) == (expected.shape, expected.dtype), where
    value = got.numpy()
    assert (value.shape, value.dtype) == (expected.shape, expected.dtype), where
    np.testing.assert_array_equal(value, expected, err_msg=where)


@pytest.mark.parametrize("name", list(CASES))
def test_agrees_with_numpy(cluster, name):
    expected = CASES[name](np.array)
    got = CASES[name](cluster.dist_send)
    agree(got, expected)


def test_round_of_an_element_is_a_python_int_as_numpy_gives(cluster):
    t = cluster.dist_send(np.array([0.5, 1.5, 2.5]))
    assert [round(t[i]) for i in range(3)] == [round(v) for v in np.array([0.5, 1.5, 2.5])]
    assert type(round(t[2])) is int


def test_a_value_the_wire_cannot_carry_is_refused_before_it_is_sent(cluster):
    from mwrt.master.issue import call

    t = cluster.dist_send(np.arange(3))
    with pytest.raises(TypeError, match="cannot be sent to a worker"):
        call("add", t, object())
    with pytest.raises(TypeError, match="not a dtype"):
        t.sum(dtype=dict)
    agree(t + 1, np.arange(3) + 1)  # the session goes on


def test_a_result_that_disagrees_with_its_meta_is_a_named_error():
    with pytest.raises(TypeError, match=r"add: .*got float32\[2\], expected float64\[2\]"):
        _checked("add", np.zeros(2, np.float32), Spec((2,), np.dtype(np.float64)))
    with pytest.raises(TypeError, match=r"got int64\[3\], expected int64\[1, 3\]"):
        _checked("sum", np.zeros(3, np.int64), Spec((1, 3), np.dtype(np.int64)))
    value = np.zeros(2)
    assert _checked("add", value, Spec((2,), np.dtype(np.float64))) is value


def test_out_of_the_wrong_shape_or_dtype_is_refused_at_issue(cluster):
    t = cluster.dist_send(np.arange(4.0))
    with pytest.raises(ValueError, match="out= has the wrong shape"):
        np.sum(cluster.dist_send(M), axis=0, out=cluster.dist_send(np.zeros(3)))
    with pytest.raises(TypeError, match="cannot cast"):
        np.add(t, 0.5, out=cluster.dist_send(np.zeros(4, np.int64)))
    agree(t * 2, np.arange(4.0) * 2)


def test_a_large_result_moved_to_another_node_keeps_its_dtype(cluster):
    """The issue's reinterpreted bytes: the handle said int64 and the worker held float64."""
    a = np.arange(100_000)
    t = np.concatenate([cluster.dist_send(a), cluster.dist_send(a)], dtype=np.float64)
    agree(t.to(node=1), np.concatenate([a, a], dtype=np.float64))
    agree((cluster.dist_send(a) + np.uint64(1)).to(node=1), a + np.uint64(1))


def test_results_inside_a_graph(cluster):
    x = cluster.dist_send(np.arange(6.0))
    c = cluster.dist_send(np.zeros(1))
    with cluster.graph(x=x) as g:
        masked = x[x > 2].sum()
        top = np.amax(x) + 1
        np.add(x[x > 4], 1.0, out=c)  # out= of a shape known on replay
    g.replay()
    agree((masked, top, c), (np.float64(12.0), np.float64(6.0), np.array([6.0])))

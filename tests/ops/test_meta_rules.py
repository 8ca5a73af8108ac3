"""The master's meta rules against NumPy itself (issue 25): for random dtypes, shapes (0-d,
size 0), Python and NumPy scalars and 0-d arrays, each rule's shape and dtype equal those of
NumPy's result on real arrays, and where NumPy refuses, the rule refuses too. In-process: no
worker is needed to know what the master will announce."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mwrt import ops
from mwrt.ops import UNKNOWN, Spec

DTYPES = [np.dtype(d) for d in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4",
                                "f8", "c8", "c16")]
SETTINGS = settings(max_examples=200, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))

dtypes = st.sampled_from(DTYPES)
shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)


@st.composite
def operands(draw, shape=None):
    """An array (as a Spec for the rule, an array for NumPy), a Python scalar, a NumPy scalar
    or a 0-d array: (value for the rule, value for NumPy)."""
    kind = draw(st.sampled_from(["array", "array", "python", "numpy", "0d"]))
    dtype = draw(dtypes)
    if kind == "array":
        shape = draw(shapes) if shape is None else shape
        array = np.ones(shape, dtype)
        return Spec(shape, dtype), array
    if kind == "python":
        value = draw(st.sampled_from([True, 2, 2.5, 1 + 1j]))
        return value, value
    value = np.ones((), dtype)
    return (value[()], value[()]) if kind == "numpy" else (value, value)


def agree(rule, numpy_fn):
    """The rule's Spec(s) equal NumPy's result's; NumPy refusing means the rule refuses."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            expected = numpy_fn()
        except Exception as exc:  # noqa: BLE001 (any refusal of NumPy's)
            with pytest.raises(Exception):  # noqa: B017
                rule()
            return exc
    got = rule()
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for g, e in zip(got, expected):
            assert (g.shape, g.dtype) == (np.shape(e), np.asarray(e).dtype)
        return None
    if got is UNKNOWN:
        return None
    expected = np.asarray(expected)
    assert (got.shape, got.dtype) == (expected.shape, expected.dtype), (got, expected.dtype)
    return None


def has_array(*values) -> bool:
    return any(type(v) is Spec for v in values)


@SETTINGS
@given(st.sampled_from(["add", "subtract", "multiply", "true_divide", "floor_divide", "maximum",
                        "less", "equal", "bitwise_and", "arctan2", "power", "divmod",
                        "logical_and", "hypot", "copysign", "remainder"]),
       operands(), operands())
def test_binary_ufuncs(name, a, b):
    if not has_array(a[0], b[0]):
        return
    op = ops.get(name)
    agree(lambda: ops.infer(op, (a[0], b[0]), {}), lambda: getattr(np, name)(a[1], b[1]))


@SETTINGS
@given(st.sampled_from(["negative", "exp", "sqrt", "absolute", "invert", "sign", "isnan",
                        "floor", "modf", "frexp", "conjugate", "logical_not"]), operands())
def test_unary_ufuncs(name, a):
    if not has_array(a[0]):
        return
    agree(lambda: ops.infer(ops.get(name), (a[0],), {}), lambda: getattr(np, name)(a[1]))


@SETTINGS
@given(st.sampled_from(["sum", "mean", "prod", "min", "max", "argmax", "std", "any", "cumsum",
                        "var", "all", "nansum"]),
       dtypes, shapes, st.sampled_from([None, 0, -1, (0,), (0, -1), 2]),
       st.sampled_from([{}, {"keepdims": True}, {"dtype": "<f8"}, {"dtype": "<i4"}]),
       st.booleans())
def test_reductions(name, dtype, shape, axis, extra, positional):
    array = np.ones(shape, dtype)
    if "dtype" in extra and name in ("min", "max", "argmax", "any", "all"):
        return  # no dtype argument
    kwargs = dict(extra, **({} if axis is None else {"axis": axis}))
    args = ()
    if positional and "dtype" in extra:  # t.sum(axis, dtype) as NumPy binds it
        args, kwargs = (axis, extra["dtype"]), {k: v for k, v in kwargs.items()
                                                 if k not in ("axis", "dtype")}
    agree(lambda: ops.infer(ops.get(name), (Spec(shape, dtype), *args), kwargs),
          lambda: getattr(np, name)(array, *args, **kwargs))


@SETTINGS
@given(st.sampled_from(["dot", "matmul"]), dtypes, dtypes,
       st.lists(st.integers(1, 3), max_size=3).map(tuple),
       st.lists(st.integers(1, 3), max_size=3).map(tuple))
def test_products(name, da, db, sa, sb):
    agree(lambda: ops.infer(ops.get(name), (Spec(sa, da), Spec(sb, db)), {}),
          lambda: getattr(np, name)(np.ones(sa, da), np.ones(sb, db)))


@SETTINGS
@given(dtypes, dtypes, shapes, st.sampled_from([None, "<f8", "<i2", "|b1"]),
       st.sampled_from([0, -1, None]))
def test_concatenate_and_stack(da, db, shape, dtype, axis):
    a, b = Spec(shape, da), Spec(shape, db)
    kwargs = {} if dtype is None else {"dtype": dtype, "casting": "unsafe"}
    for name in ("concatenate", "stack"):
        agree(lambda n=name: ops.infer(ops.get(n), ((a, b),), dict(kwargs, axis=axis)),
              lambda n=name: getattr(np, n)([np.ones(shape, da), np.ones(shape, db)],
                                            axis=axis, **kwargs))


@SETTINGS
@given(operands(), operands(), operands())
def test_where_and_clip(c, x, y):
    if not has_array(c[0], x[0], y[0]):
        return
    cond = (Spec(c[0].shape, np.dtype(bool)), np.ones(c[0].shape, bool)) \
        if type(c[0]) is Spec else (True, True)
    if has_array(cond[0], x[0], y[0]):
        agree(lambda: ops.infer(ops.get("where"), (cond[0], x[0], y[0]), {}),
              lambda: np.where(cond[1], x[1], y[1]))
    if type(x[0]) is Spec:
        agree(lambda: ops.infer(ops.get("clip"), (x[0], c[0], y[0]), {}),
              lambda: np.clip(x[1], c[1], y[1]))


@SETTINGS
@given(dtypes, shapes, st.sampled_from(["round", "real", "imag", "argsort", "flatten", "copy"]))
def test_one_operand_ops(dtype, shape, name):
    array = np.ones(shape, dtype)
    numpy = {"round": np.round, "real": np.real, "imag": np.imag, "argsort": np.argsort,
             "flatten": np.ravel, "copy": np.copy}[name]
    agree(lambda: ops.infer(ops.get(name), (Spec(shape, dtype),), {}), lambda: numpy(array))


@SETTINGS
@given(dtypes, st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       st.sampled_from([0, -1, (0,), (0, 0), (slice(None), 0), (None, 0), np.array(0),
                        (np.array(0), slice(1, None)), (Ellipsis, 0), np.array([0, 0])]))
def test_indexing(dtype, shape, index):
    agree(lambda: ops.infer(ops.get("getitem"), (Spec(shape, dtype), index), {}),
          lambda: np.ones(shape, dtype)[index])


def test_remembered_rules_tell_a_python_int_from_a_float():
    i8 = Spec((3,), np.dtype(np.int8))
    assert ops.infer(ops.get("add"), (i8, 1), {}).dtype == np.int8
    assert ops.infer(ops.get("add"), (i8, 1.0), {}).dtype == np.float64
    assert ops.infer(ops.get("sum"), (i8,), {"axis": 0}).dtype == np.int64
    assert ops.infer(ops.get("sum"), (i8,), {"axis": 0, "dtype": "<f4"}).dtype == np.float32
    assert ops.infer(ops.get("clip"), (i8, 1, True), {}) == \
        ops.infer(ops.get("clip"), (i8, 1, 1), {})  # equal values, equal NumPy dtypes


@SETTINGS
@given(st.sampled_from(["inner", "outer", "kron", "vdot", "linalg.matmul"]), dtypes,
       dtypes, st.lists(st.integers(1, 3), max_size=3).map(tuple),
       st.lists(st.integers(1, 3), max_size=3).map(tuple))
def test_numpy_functions_with_rules(path, da, db, sa, sb):
    from mwrt.ops import numpy_functions

    fn = numpy_functions.resolve(np, path)
    agree(lambda: ops.infer(ops.get("numpy"), (path, numpy_functions.RULED, Spec(sa, da), Spec(sb, db)),
                            {}),
          lambda: fn(np.ones(sa, da), np.ones(sb, db)))


@SETTINGS
@given(dtypes, st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple),
       st.sampled_from([("reshape", (-1,), {"order": "F"}), ("transpose", (), {}),
                        ("squeeze", (), {}), ("expand_dims", (0,), {}), ("repeat", (2,), {}),
                        ("repeat", (2, 0), {}), ("take", ([0],), {"axis": 0}),
                        ("argsort", (0,), {"kind": "stable"}), ("flip", (), {}),
                        ("moveaxis", (0, -1), {}), ("diagonal", (), {}), ("tril", (), {})]))
def test_shape_ops(dtype, shape, case):
    name, args, kwargs = case
    agree(lambda: ops.infer(ops.get(name), (Spec(shape, dtype), *args), kwargs),
          lambda: getattr(np, name)(np.ones(shape, dtype), *args, **kwargs))


@SETTINGS
@given(st.sampled_from(["add", "multiply", "subtract", "maximum", "logical_or", "bitwise_xor"]),
       st.sampled_from(["reduce", "accumulate", "outer"]), dtypes, shapes,
       st.sampled_from([{}, {"axis": -1}, {"axis": 0, "dtype": "<f8"}, {"keepdims": True}]))
def test_ufunc_methods(name, method, dtype, shape, kwargs):
    ufunc, array = getattr(np, name), np.ones(shape, dtype)
    spec = Spec(shape, dtype)
    if method == "outer":
        agree(lambda: ops.infer(ops.get("ufunc_method"), (name, method, spec, spec), {}),
              lambda: ufunc.outer(array, array))
        return
    if method == "accumulate":
        kwargs = {k: v for k, v in kwargs.items() if k != "keepdims"}
    agree(lambda: ops.infer(ops.get("ufunc_method"), (name, method, spec), kwargs),
          lambda: getattr(ufunc, method)(array, **kwargs))


@SETTINGS
@given(st.sampled_from(["add", "multiply", "less"]), operands(), operands(),
       st.sampled_from([{}, {"dtype": "<f4"}, {"where": "mask"}, {"casting": "unsafe",
                                                                 "dtype": "<i2"}]))
def test_ufunc_keywords(name, a, b, kwargs):
    if not has_array(a[0], b[0]):
        return
    rule_kwargs, numpy_kwargs = dict(kwargs), dict(kwargs)
    if "where" in kwargs:
        shape = a[0].shape if type(a[0]) is Spec else b[0].shape
        rule_kwargs["where"] = Spec(shape, np.dtype(bool))
        numpy_kwargs["where"] = np.ones(shape, bool)
    agree(lambda: ops.infer(ops.get(name), (a[0], b[0]), rule_kwargs),
          lambda: getattr(np, name)(a[1], b[1], **numpy_kwargs))

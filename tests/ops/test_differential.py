"""NumPy is the oracle: random programs run on NumPy arrays and on mwrt tensors, compared.

Hypothesis writes a short program as Python source, one line at a time, over variables
that hold arrays of every dtype and of 0-d, size-0 and non-contiguous shapes, with Python
and NumPy scalars and 0-d arrays as operands, views, in-place ops, two streams (a slow op
first, so a missing order shows) and moves to a second node. Each line runs on NumPy first;
a line NumPy refuses is dropped. The same text then runs with every variable a
DistributedTensor, and every variable is compared: the handle's shape and dtype, and the
value, dtype and shape of `.numpy()`. A failure prints the program, ready to paste.

DIFFERENTIAL_EXAMPLES=2000 pytest tests/ops/test_differential.py --hypothesis-seed=N runs more.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import mwrt

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
SHAPES = [(), (0,), (1,), (3,), (4,), (2, 3), (3, 1), (1, 3), (2, 0), (2, 2, 2)]
BINARY = ["+", "-", "*", "/", "//", "%", "**", "&", "|", "^", "<", "<=", "==", "!=", ">",
          ">=", "@", "<<", ">>"]
INPLACE = ["+=", "-=", "*=", "/=", "//=", "%=", "&=", "|=", "^=", "**="]
UNARY = ["negative", "absolute", "exp", "sqrt", "sin", "floor", "isnan", "sign", "square",
         "logical_not", "invert", "conjugate", "positive", "reciprocal", "log1p", "rint"]
REDUCTIONS = ["sum", "mean", "prod", "min", "max", "argmin", "argmax", "any", "all", "std",
              "var", "cumsum"]
SCALARS = ["0", "1", "3", "-2", "300", "2.5", "-0.5", "True", "False", "1j", "np.int8(5)",
           "np.int64(100)", "np.uint8(200)", "np.uint64(1)", "np.float32(1.5)",
           "np.float64(0.1)", "np.float16(2)", "np.complex64(1+2j)", "np.bool_(True)",
           "np.array(4.0)", "np.array(2, np.int16)", "np.array(True)"]
VIEWS = ["[1:]", "[::2]", "[::-1]", ".T", "[0]", "[np.array(1)]", "[..., 0]", "[None]",
         ".reshape(-1)", ".ravel()", "[[]]", "[[0, 0]]", "[:, 1:]", ".real", ".imag",
         "[np.array([True, False, True])]", "[-1]", ".swapaxes(0, -1)"]
METHODS = ["{a}.sort()", "{a}.fill({s})", "np.add.at({a}, [0], {s})", "np.copyto({a}, {b})",
           "np.clip({a}, 0, 5, out={a})", "np.negative({a}, out={a})", "{a} @= {b}",
           "{a}[{a} > 0] = {s}", "{a}[[0, -1]] = {s}", "np.multiply({a}, {b}, out={a})"]


def _slow_write(a):
    """A remote op that holds its stream a while, then writes (the same values) to `a`."""
    time.sleep(0.05)
    if a.flags.writeable:  # broadcast_to's views are read-only, in NumPy too
        a[...] = a.copy()


class _NumpyWorld:
    """The oracle's names: NumPy arrays, streams that do nothing, and moves that copy unless
    the array is there already (`.to()` of a tensor in its place is the tensor itself)."""

    S1 = S2 = contextlib.nullcontext()

    @staticmethod
    def slow(a):
        return None

    @staticmethod
    def move(a, there: bool = False):
        return a if there else np.array(a, copy=True)


class _MwrtWorld:
    """The same names over mwrt: two streams of node 0, a slow remote write, a move to node 1."""

    def __init__(self, streams: tuple):
        self._streams = streams
        self._slow = mwrt.remote(_slow_write, outputs=0)

    @property
    def S1(self):
        return mwrt.stream(self._streams[0])

    @property
    def S2(self):
        return mwrt.stream(self._streams[1])

    def slow(self, a):
        self._slow(a)

    @staticmethod
    def move(a, there: bool = False):
        return a.to(node=1)


def _run(line: str, env: dict) -> None:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        exec(line, env)


@st.composite
def programs(draw, max_lines: int = 8):
    """(initial arrays by name, program lines, NumPy's final values), each line checked on NumPy."""
    initial = {}
    for i in range(draw(st.integers(1, 3))):
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = draw(st.sampled_from(SHAPES))
        initial[f"v{i}"] = draw(hnp.arrays(dtype, shape, elements=_elements(dtype)))
    env = _numpy_env(initial, [])
    nodes = dict.fromkeys(initial, 0)
    lines = []
    for _ in range(draw(st.integers(1, max_lines))):
        scalars = {k for k, v in env.items() if isinstance(v, np.generic)}
        line, made, node = _line(draw, nodes, scalars)
        try:
            _run(line, env)
        except Exception:  # NumPy refuses it (so may mwrt, in any way); it may have written
            env = _numpy_env(initial, lines)  # part of an array first: run the rest again
            continue
        if made is not None:
            if not isinstance(env[made], (np.ndarray, np.generic)):
                del env[made]
                continue
            nodes[made] = node
        lines.append(line)
    final = {k: env[k] for k in nodes if k in env}
    return initial, lines, final


def _numpy_env(initial: dict, lines: list) -> dict:
    """The oracle's variables after `lines`, from fresh copies of the initial arrays."""
    env = {"np": np, "world": _NumpyWorld()}
    env.update({k: v.copy() for k, v in initial.items()})
    for line in lines:
        _run(line, env)
    return env


def _elements(dtype):
    if dtype.kind == "f":
        return st.floats(-100, 100, width=dtype.itemsize * 8, allow_subnormal=False)
    if dtype.kind == "c":
        return st.complex_numbers(max_magnitude=50, allow_nan=False, allow_infinity=False,
                                  width=dtype.itemsize * 8)
    return None


def _line(draw, nodes: dict, scalars: set):
    """One line of source: (text, name it binds or None, node of that name).

    NumPy gives a scalar where mwrt gives a 0-d tensor (a handle is never a host value): an
    in-place op rebinds a scalar but writes a tensor, so in-place lines take arrays only.
    """
    names = sorted(nodes)
    a = draw(st.sampled_from(names))
    same = [n for n in names if nodes[n] == nodes[a]]
    b = draw(st.sampled_from(same))
    s = draw(st.sampled_from(SCALARS))
    new = f"v{len(nodes)}"
    kind = draw(st.sampled_from(["binary", "rbinary", "scalar", "unary", "reduce", "view",
                                 "inplace", "setitem", "func", "astype", "stream", "move",
                                 "method"]))
    if kind == "binary":
        return f"{new} = {a} {draw(st.sampled_from(BINARY))} {b}", new, nodes[a]
    if kind == "rbinary":
        return f"{new} = {s} {draw(st.sampled_from(BINARY))} {a}", new, nodes[a]
    if kind == "scalar":
        return f"{new} = {a} {draw(st.sampled_from(BINARY))} {s}", new, nodes[a]
    if kind == "unary":
        return f"{new} = np.{draw(st.sampled_from(UNARY))}({a})", new, nodes[a]
    if kind == "reduce":
        return f"{new} = {_reduction(draw, a)}", new, nodes[a]
    if kind == "view":
        return f"{new} = {a}{draw(st.sampled_from(VIEWS))}", new, nodes[a]
    if kind in ("setitem", "method") and a in scalars:
        kind = "unary"
    if kind == "inplace":  # of a scalar: a new value bound to its name
        target = a if a in scalars else draw(st.sampled_from(
            [a, f"{a}[1:]", f"{a}[0]", f"{a}[::2]", f"{a}[...]"]))
        return f"{target} {draw(st.sampled_from(INPLACE))} {draw(st.sampled_from([b, s]))}", \
            None, 0
    if kind == "setitem":
        # not [] with an array value: NumPy then skips its broadcast check when the value is
        # empty too (a[[]] = zeros((2, 0)) passes), a quirk mwrt does not copy
        index = draw(st.sampled_from(["0", "1:", "...", "::2", "np.array(0)"]))
        return f"{a}[{index}] = {draw(st.sampled_from([b, s]))}", None, 0
    if kind == "method":
        return draw(st.sampled_from(METHODS)).format(a=a, b=b, s=s), None, 0
    if kind == "func":
        return f"{new} = {_function(draw, a, b, s)}", new, nodes[a]
    if kind == "astype":
        return f"{new} = {a}.astype(np.{draw(st.sampled_from(DTYPES))})", new, nodes[a]
    if kind == "stream":  # a slow write on S1, then a write (or read) on S1 and a read on S2
        inner, made, node = _line(draw, nodes, scalars)
        if "\n" in inner or inner.startswith("with"):
            return inner, made, node
        return (f"world.slow({a})\nwith world.S1:\n    {inner}\nwith world.S2:\n"
                f"    v_read = {a} + 0"), made, node
    # an array made from node 1's arrays is there already: its move is itself
    there = ", there=True" if nodes[a] == 1 else ""
    return f"{new} = world.move({a}{there})", new, 1


def _reduction(draw, a: str) -> str:
    name = draw(st.sampled_from(REDUCTIONS))
    args = draw(st.sampled_from(["", "axis=0", "axis=-1", "axis=0, keepdims=True",
                                 "0, np.float64", "dtype=np.float64", "axis=None",
                                 "keepdims=True"]))
    if draw(st.booleans()):
        return f"{a}.{name}({args})"
    return f"np.{name}({a}{', ' + args if args else ''})"


def _function(draw, a: str, b: str, s: str) -> str:
    return draw(st.sampled_from([
        f"np.where({a} > 0, {a}, {s})", f"np.clip({a}, 1, 3)", f"np.clip({a}, {s}, None)",
        f"np.concatenate([{a}, {b}])", f"np.maximum({a}, {b})", f"np.minimum({a}, {s})",
        f"np.add({a}, {s}, out={a}, where={a} > 1)", f"np.dot({a}, {b})", f"np.inner({a}, {b})",
        f"np.round({a})", f"np.sort({a})", f"np.argsort({a})", f"np.stack([{a}, {b}])",
        f"np.concatenate([{a}, {b}], dtype=np.float64)", f"np.matmul({a}, {b})",
        f"np.transpose({a})", f"np.copy({a})", f"{a}.copy()", f"{a}.flatten()",
        f"np.add({a}, {b}, out={a})", f"np.multiply({a}, {s})", f"np.equal({a}, {s})",
        f"{a}.sum(0, np.float64)", f"{a}.clip(min=0)", f"np.expand_dims({a}, 0)",
        f"np.squeeze({a})", f"{a}.reshape(-1, 1)", f"np.abs({a} - {b})",
        f"{a}.take([0])", f"{a}.repeat(2)", f"np.nonzero({a})[0]", f"divmod({a}, {s})[0]",
        f"round({a})", f"np.add.accumulate({a})", f"np.cumsum({a})", f"{a}[{a} > 0]",
        f"np.unique({a})", f"np.flip({a})", f"np.diff({a})", f"{a}.T.copy()",
        f"np.einsum('...->...', {a})", f"np.tril({a})", f"np.outer({a}, {b})",
        f"np.argmax({a}, axis=0)", f"np.mean({a}, axis=0, keepdims=True)", f"{a}.var(ddof=1)",
        f"np.isclose({a}, {b})", f"np.array_equal({a}, {b})", f"{a}.astype(bool).all()",
        f"{a} @ {b}.T", f"np.tensordot({a}, {b}, 0)", f"np.broadcast_to({a}, (2,) + {a}.shape)",
        f"{a}.nonzero()[0]", f"{a}.real + {a}.imag", f"np.sign({a}) * {s}",
    ]))


def _as_source(initial: dict, lines: list) -> str:
    head = [f"{k} = mwrt.dist_send(np.array({v.tolist()!r}, np.{v.dtype}))"
            for k, v in initial.items()]
    return "\n".join(head + lines)


def _compare(name: str, expected, got, source: str) -> None:
    """The handle's and .numpy()'s shape and dtype equal NumPy's, and so do the values."""
    expected = np.asarray(expected)
    where = f"{name} of the program\n{source}\n"
    assert isinstance(got, mwrt.DistributedTensor), f"{where}is {type(got).__name__}"
    assert tuple(got.shape) == expected.shape, f"{where}handle shape {got.shape}, NumPy's " \
        f"{expected.shape}"
    assert np.dtype(got.dtype) == expected.dtype, f"{where}handle dtype {got.dtype}, NumPy's " \
        f"{expected.dtype}"
    value = got.numpy()
    assert value.shape == expected.shape and value.dtype == expected.dtype, \
        f"{where}.numpy() is {value.dtype}{value.shape}, NumPy's {expected.dtype}{expected.shape}"
    if expected.dtype.kind in "fc":
        tolerance = {2: 1e-3, 4: 1e-6, 8: 1e-12, 16: 1e-6}[expected.dtype.itemsize]
        np.testing.assert_allclose(value, expected, rtol=tolerance, atol=0, equal_nan=True,
                                   err_msg=where)
    else:
        np.testing.assert_array_equal(value, expected, err_msg=where)


def _check(program, streams: tuple) -> None:
    initial, lines, final = program
    source = _as_source(initial, lines)
    env = {"np": np, "world": _MwrtWorld(streams), "mwrt": mwrt}
    env.update({k: mwrt.dist_send(v) for k, v in initial.items()})
    try:
        for line in lines:
            _run(line, env)
    except Exception as exc:
        raise AssertionError(f"mwrt raised where NumPy did not: {exc!r}\n{source}") from exc
    for name, expected in final.items():
        _compare(name, expected, env[name], source)


@pytest.mark.timeout(600)
@settings(max_examples=int(os.environ.get("DIFFERENTIAL_EXAMPLES", "300")), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(program=programs())
def test_random_programs_equal_numpy(two_streams, program):
    _check(program, two_streams)


@pytest.fixture(scope="module")
def two_streams(cluster):
    """Two streams of node 0, made once: a session's streams are bounded and not given back."""
    return mwrt.Stream(node=0), mwrt.Stream(node=0)


# What the programs above found, each kept as a program of its own.
FOUND = {
    "a write through .real is ordered like one through any view": (
        {"v0": np.array([1, 2, 3], np.int8)},
        ["v1 = v0.real", "world.slow(v0)\nwith world.S1:\n    v2 = v0 + v0", "v1[1] = 0"]),
    "np.stack of 0-d tensors": ({"v0": np.array(2.0)}, ["v1 = np.stack([v0, v0])"]),
    "cumsum of a 0-d tensor is 1-d": ({"v0": np.array(3)}, ["v1 = np.cumsum(v0)"]),
    "sum of a 0-d tensor takes axis -1, as NumPy's": (
        {"v0": np.array(True)}, ["v1 = np.sum(v0, axis=-1)", "v2 = v0.max(0)"]),
    "setitem drops a value's leading 1s": (
        {"v0": np.zeros((1, 3))}, ["v0[0] = v0", "v0[0, 1:] = np.ones((1, 1, 2))"]),
    "generalized ufuncs keep their core dimensions": (
        {"v0": np.arange(12.0).reshape(3, 4), "v1": np.arange(4.0)},
        ["v2 = np.vecdot(v0, v1)", "v3 = np.matvec(v0, v1)", "v4 = np.vecmat(v1, v0.T)"]),
    "np.split and its kin give one tensor per part, views of the whole": (
        {"v0": np.arange(9.0).reshape(3, 3)},
        ["v1, v2, v3 = np.split(v0, 3)", "v4, v5 = np.array_split(v0, 2, axis=1)",
         "v6, v7, v8 = np.hsplit(v0, 3)", "world.slow(v0)\nwith world.S1:\n    v2[0, 1] = -1",
         "with world.S2:\n    v9 = v0 * 1"]),
    "an empty list indexes": ({"v0": np.arange(3.0)}, ["v1 = v0[[]]", "v0[[]] = 5"]),
    ".to() of a tensor already there is the tensor": (
        {"v0": np.arange(3.0)},
        ["v1 = world.move(v0)", "v2 = world.move(v1, there=True)", "v3 = v1 + v1",
         "v4 = world.move(v3, there=True)", "v1 += 1", "v3 += 1"]),
    "a view of a ufunc's 0-d result views a copy, as of NumPy's scalar": (
        {"v0": np.array(1.0, np.float16)},
        ["v1 = v0 + v0", "v2 = np.expand_dims(v1, 0)", "v2[0] = v0", "v3 = v1[None]",
         "v3[0] = 5"]),
    "a view of a reduction's or an element's 0-d result views a copy": (
        {"v0": np.arange(3.0)},
        ["v1 = v0.sum()", "v2 = v1.reshape(1)", "v2[0] = 9", "v3 = v0[1]", "v4 = np.ravel(v3)",
         "v4[0] = 7"]),
}


@pytest.mark.parametrize("what", FOUND)
def test_what_the_programs_found(two_streams, what):
    initial, lines = FOUND[what]
    env = _numpy_env(initial, lines)
    _check((initial, lines, {k: env[k] for k in env if k.startswith("v") and k != "v_read"}),
           two_streams)

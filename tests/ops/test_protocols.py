"""Python's protocols on a tensor: float(t), int(t), complex(t), bool(t), operator.index(t),
t.item(), format(t, spec), `v in t`, copy.copy and copy.deepcopy. Each gives what NumPy gives
for an array of the tensor's shape and dtype, its value or its own error (type and message),
on one place and on a mesh, except that one element converts whatever the shape (torch's
rule, and NumPy's before 2.4); a torch handle gives what torch gives. A refusal is told without
a wait: the shape is known on the master."""

from __future__ import annotations

import copy
import operator
import warnings

import numpy as np
import pytest

import mwrt

CONVERSIONS = {"float": float, "int": int, "complex": complex, "bool": bool,
               "index": operator.index, "item": lambda a: a.item()}
SHAPES = [(), (1,), (1, 1), (3,), (0,), (2, 2)]


def numpys(convert, host):
    """What NumPy gives for `host`; for one element in a shaped array, what it gives for
    that element, as mwrt (and torch) convert it where NumPy 2.4 refuses."""
    return outcome(convert, host.reshape(()) if host.size == 1 else host)


def outcome(convert, value):
    """convert(value), or the (type, message) it raised; with any warning it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got: object = convert(value)
        except Exception as exc:  # noqa: BLE001 - the error is the outcome compared
            got = (type(exc), str(exc))
    return got, [(w.category, str(w.message)) for w in caught]


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", CONVERSIONS)
def test_a_conversion_of_a_tensor_is_numpys(cluster, name, shape, dtype):
    host = np.full(shape, 3, dtype)
    want = numpys(CONVERSIONS[name], host)
    assert outcome(CONVERSIONS[name], mwrt.dist_send(host)) == want


@pytest.mark.parametrize("name", CONVERSIONS)
@pytest.mark.parametrize("shape", [(2,), (4, 1), (1,)])
def test_a_conversion_of_a_mesh_tensor_is_numpys(cluster, name, shape):
    host = np.arange(float(np.prod(shape))).reshape(shape) + 1
    sharded = mwrt.dist_send(host, mesh=mwrt.mesh(nodes=[0, 1]), shard=0)
    assert outcome(CONVERSIONS[name], sharded) == numpys(CONVERSIONS[name], host)


def test_a_refused_conversion_does_not_wait(cluster):
    vector = mwrt.dist_send(np.ones(5))
    before = mwrt.stats()["waits"]
    for convert in (float, int, bool, lambda a: a.item()):
        with pytest.raises((TypeError, ValueError)):
            convert(vector)
    assert mwrt.stats()["waits"] == before


@pytest.mark.parametrize("shape", [(), (1,), (3,), (0,)])
@pytest.mark.parametrize("name", ["float", "int", "bool", "item"])
def test_a_conversion_of_a_torch_handle_is_torchs(cluster, name, shape):
    torch = pytest.importorskip("torch")
    local = torch.full(shape, 3.0)
    want = outcome(CONVERSIONS[name], local)
    assert outcome(CONVERSIONS[name], mwrt.dist_send(local)) == want


@pytest.mark.parametrize("spec", [".2f", ">8", "e", ".3g"])
@pytest.mark.parametrize("shape", [(), (2,)])
def test_a_format_spec_formats_a_0d_tensors_value_as_numpy(cluster, shape, spec):
    host = np.full(shape, 2.5)
    want = outcome(lambda a: format(a, spec), host)
    assert outcome(lambda a: format(a, spec), mwrt.dist_send(host)) == want
    got = mwrt.dist_send(host)
    assert f"{got}" == repr(got)  # no spec: the handle's repr, without a wait


@pytest.mark.parametrize("value", [2.5, 7.0, np.float32(2.5)])
@pytest.mark.parametrize("shape", [(), (4,), (2, 3), (0,)])
def test_in_asks_one_wait_and_answers_as_numpy(cluster, shape, value):
    host = np.full(shape, 2.5)
    t = mwrt.dist_send(host)
    before = mwrt.stats()["waits"]
    assert (value in t) == (value in host)
    assert mwrt.stats()["waits"] - before == 1


def test_a_copy_is_made_on_the_worker_and_owns_its_values(cluster):
    t = mwrt.dist_send(np.arange(3.0))
    shallow, deep = copy.copy(t), copy.deepcopy({"w": [t]})["w"][0]
    t += 1.0
    for c in (shallow, deep):
        assert c is not t and c.get_node() == t.get_node()
        np.testing.assert_array_equal(c.numpy(), np.arange(3.0))
    sharded = mwrt.dist_send(np.arange(4.0), mesh=mwrt.mesh(nodes=[0, 1]), shard=0)
    copied = copy.deepcopy(sharded)
    assert copied.placements == sharded.placements
    np.testing.assert_array_equal(copied.numpy(), np.arange(4.0))


def test_a_torch_handle_says_how_to_copy_it(cluster):
    torch = pytest.importorskip("torch")
    t = mwrt.dist_send(torch.ones(2))
    for copier in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match=r"t\.clone\(\)"):
            copier(t)
    assert 1.0 in t and 2.0 not in t
    assert f"{mwrt.dist_send(torch.tensor(2.5)):.2f}" == f"{torch.tensor(2.5):.2f}"


@pytest.mark.parametrize("pair", ["same", "other values", "nan", "other shape", "broadcast",
                                  "other dtype", "local tensor"])
def test_torch_equal_and_allclose_of_handles_answer_as_torch(cluster, pair):
    torch = pytest.importorskip("torch")
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = {"same": a.clone(), "other values": a + 1e-7, "nan": a.clone().fill_(float("nan")),
         "other shape": a[:1], "broadcast": a[1], "other dtype": a.double(),
         "local tensor": a.clone()}[pair]
    ra = mwrt.dist_send(a)
    rb = b if pair == "local tensor" else mwrt.dist_send(b)
    for fn in (torch.equal, torch.allclose, lambda x, y: x.equal(y),
               lambda x, y: x.allclose(y, atol=0.0), lambda x, y: torch.allclose(x, y, equal_nan=True)):
        assert outcome(lambda pair: fn(*pair), (ra, rb)) == outcome(lambda pair: fn(*pair), (a, b))



@pytest.mark.parametrize("write", ["in place", "out="])
def test_a_result_its_int_target_cannot_hold_raises_numpys_error_class(cluster, write):
    """`i += 1.5` and np.add(i, 1.5, out=i) raise NumPy's own class (a UFuncTypeError), so
    an `except` written for NumPy's arrays catches ours, with NumPy's fields."""
    def raised(target):
        try:
            if write == "in place":
                target += 1.5
            else:
                np.add(target, 1.5, out=target)
        except TypeError as exc:
            return exc
        raise AssertionError("no error")

    fields = operator.attrgetter("ufunc", "casting", "from_", "to")
    expected, got = raised(np.arange(3)), raised(cluster.dist_send(np.arange(3)))
    assert isinstance(got, type(expected)) and fields(got) == fields(expected), (got, expected)
    assert "cannot cast the result" in str(got) and "(got float64" in str(got), str(got)


@pytest.mark.parametrize("dtype", ["int64", "uint8", "float64", "float32", "complex128"])
def test_an_element_is_the_number_numpys_scalar_is(cluster, dtype):
    """t[0] and t.sum() are numbers.Integral, Real or Complex as NumPy's scalars of their
    dtype are (numbers.Real is what scikit-learn's parameter checks ask of a float)."""
    import numbers

    host = np.arange(1, 4).astype(dtype)
    kinds = (numbers.Number, numbers.Complex, numbers.Real, numbers.Integral)
    for take in (lambda a: a[0], lambda a: a.sum(), lambda a: a.std()):
        expected, got = take(host), take(cluster.dist_send(host))
        assert [isinstance(got, k) for k in kinds] == [isinstance(expected, k) for k in kinds]


def test_scikit_learn_takes_an_elements_value_as_a_parameter(cluster):
    """Ridge(alpha=t.std()) passes scikit-learn's `Real` check and fits as with NumPy's."""
    linear = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(0)
    x, y, host = rng.random((8, 2)), rng.random(8), np.array([0.5, 1.5])
    got = linear.Ridge(alpha=cluster.dist_send(host).std()).fit(x, y).coef_
    np.testing.assert_allclose(got, linear.Ridge(alpha=host.std()).fit(x, y).coef_)


LAYOUTS = {"made": lambda a: a, "transposed": lambda a: a.T, "sliced": lambda a: a[::2, 1:],
           "fortran": np.asfortranarray, "broadcast": lambda a: np.broadcast_to(a[0], (3, 6)),
           "row": lambda a: a[1], "scalar": lambda a: a.sum(), "reshaped": lambda a: a.reshape(2, 12)}
FLAGS = ("C_CONTIGUOUS", "F_CONTIGUOUS", "WRITEABLE", "ALIGNED", "WRITEBACKIFCOPY", "FNC", "FORC",
         "BEHAVED", "CARRAY", "FARRAY")  # all but OWNDATA: where a worker's array came from


@pytest.mark.parametrize("layout", LAYOUTS)
def test_strides_flags_and_isfortran_are_those_of_numpys_array(cluster, layout):
    """t.strides, t.flags and np.isfortran(t) of the array as its worker laid it out (a view
    where NumPy makes one) are NumPy's of the same array."""
    host = np.arange(24.0).reshape(4, 6)
    expected, got = LAYOUTS[layout](host), LAYOUTS[layout](cluster.dist_send(host))
    assert got.strides == expected.strides and np.isfortran(got) == np.isfortran(expected)
    flags = got.flags
    assert {k: flags[k] for k in FLAGS} == {k: expected.flags[k] for k in FLAGS}
    assert (flags.c_contiguous, flags.f_contiguous, flags.writeable) == \
        (expected.flags.c_contiguous, expected.flags.f_contiguous, expected.flags.writeable)


def test_flags_are_a_read_only_snapshot(cluster):
    flags = cluster.dist_send(np.arange(3)).flags
    with pytest.raises(AttributeError, match=r"flags: .*read-only \(got writeable = False\)"):
        flags.writeable = False
    with pytest.raises(KeyError, match=r"unknown flag \(got 'c'"):
        flags["c"]

"""float(t), int(t), complex(t), bool(t), operator.index(t) and t.item(): each gives what
NumPy gives for an array of the tensor's shape and dtype, its value or its own error (type
and message), on one place and on a mesh; a torch handle gives what torch gives. A refusal
is told without a wait: the shape is known on the master."""

from __future__ import annotations

import operator
import warnings

import numpy as np
import pytest

import mwrt

CONVERSIONS = {"float": float, "int": int, "complex": complex, "bool": bool,
               "index": operator.index, "item": lambda a: a.item()}
SHAPES = [(), (1,), (1, 1), (3,), (0,), (2, 2)]


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
    want = outcome(CONVERSIONS[name], host)
    assert outcome(CONVERSIONS[name], mwrt.dist_send(host)) == want


@pytest.mark.parametrize("name", CONVERSIONS)
@pytest.mark.parametrize("shape", [(2,), (4, 1)])
def test_a_conversion_of_a_mesh_tensor_is_numpys(cluster, name, shape):
    host = np.arange(float(np.prod(shape))).reshape(shape) + 1
    sharded = mwrt.dist_send(host, mesh=mwrt.mesh(nodes=[0, 1]), shard=0)
    assert outcome(CONVERSIONS[name], sharded) == outcome(CONVERSIONS[name], host)


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

"""torch calls whose result's shape depends on the values (a mask's index, nonzero, unique,
masked_select, where(cond)) on torch handles: the worker runs them and the master asks the
results' metadata at once (one wait), so the handles give torch's values, shapes, dtypes,
grad and leafness, and a backward through them torch's gradients."""

from __future__ import annotations

import pytest

import mwrt

torch = pytest.importorskip("torch")

CALLS = {
    "a mask's index": lambda x: x[x > 2],
    "a row mask": lambda x: x[torch.tensor([True, False, True])],
    "nonzero": lambda x: x.nonzero(),
    "nonzero as a tuple": lambda x: torch.nonzero(x, as_tuple=True),
    "where(cond)": lambda x: torch.where(x > 2),
    "masked_select": lambda x: torch.masked_select(x, x > 1),
    "unique": lambda x: torch.unique(x.detach().round()),
    "unique with counts": lambda x: torch.unique(x.detach().long() % 3, return_counts=True),
    "a mask's index, then an op": lambda x: (x[x > 1] * 2).sum(),
    "repeat_interleave by counts": lambda x: torch.repeat_interleave(
        x, torch.tensor([2, 0, 1]), dim=0),
}


def _local():
    return (torch.arange(12.0).reshape(3, 4) - 3).requires_grad_()


def _tensors(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


@pytest.mark.parametrize("name", CALLS)
def test_a_data_dependent_call_gives_torchs_tensors(cluster, name):
    local = _local()
    remote = mwrt.dist_send(local)
    before = mwrt.stats()["waits"]
    got = CALLS[name](remote)
    assert mwrt.stats()["waits"] - before == len(_tensors(got))  # its shapes, asked once
    want = CALLS[name](local)
    assert type(got) is type(want) or isinstance(want, torch.Tensor)
    for g, w in zip(_tensors(got), _tensors(want), strict=True):
        assert tuple(g.shape) == tuple(w.shape) and g.dtype == w.dtype
        assert (g.requires_grad, g.is_leaf) == (w.requires_grad, w.is_leaf)
        torch.testing.assert_close(g.torch(), w.detach(), rtol=0, atol=0)


def test_a_backward_through_a_mask_gives_torchs_gradient(cluster):
    local = _local()
    remote = mwrt.dist_send(local)
    (remote[remote > 2] ** 2).sum().backward()
    (local[local > 2] ** 2).sum().backward()
    torch.testing.assert_close(remote.grad.torch(), local.grad, rtol=0, atol=0)


def test_a_mask_of_the_wrong_shape_fails_at_its_line(cluster):
    remote = mwrt.dist_send(_local())
    with pytest.raises(IndexError, match="IndexError: The shape of the mask") as raised:
        remote[torch.tensor([True, False])]  # torch's error class, as torch raises it here
    assert isinstance(raised.value, mwrt.RemoteError) and __file__ in str(raised.value)
    assert float(remote.sum().detach()) == 30.0  # the stream runs on


def test_on_a_mesh_such_a_call_is_refused_by_name(cluster):
    sharded = mwrt.dist_send(torch.arange(4.0), mesh=mwrt.mesh(nodes=[0, 1]), shard=0)
    with pytest.raises(TypeError, match="depends on the tensor's values"):
        sharded[sharded > 1]

"""Torch handles over a 2-D mesh (2 x 2 places): data parallel along one mesh dimension and
replicated along the other, or split over every place; replicated and sharded modules.

torch is the oracle: the same model on local torch, given the whole batch, takes the same
steps (up to the order of the sums).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import mwrt  # noqa: E402
import mwrt.torch  # noqa: E402
from mwrt.errors import PlacementError  # noqa: E402
from mwrt.master.mesh.placement import Partial, Replicate, Shard  # noqa: E402
from tests.torch.test_torch_mesh import TOL, _close, _data, _model, _step  # noqa: E402

R, P = Replicate(), Partial("sum")


@pytest.fixture(scope="module")
def grid():
    """Four local workers as a 2 x 2 mesh."""
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=4, timeout=30)
    yield mwrt.mesh({"dp": 2, "rep": 2})
    mwrt.shutdown()


def _train(model, grid, shard, steps: int = 3) -> None:
    """`steps` of AdamW on the mesh model and on local torch, compared at each."""
    X, y = _data(10)
    local = _model()
    opt = mwrt.torch.optim.AdamW(model.parameters(), lr=1e-2)
    lopt = torch.optim.AdamW(local.parameters(), lr=1e-2)
    xs, ys = mwrt.dist_send(X, mesh=grid, shard=shard), mwrt.dist_send(y, mesh=grid, shard=shard)
    for _ in range(steps):
        loss = _step(model, opt, xs, ys)
        assert loss.item() == pytest.approx(_step(local, lopt, X, y).item(), rel=1e-6)
    for (name, p), lp in zip(model.named_parameters(), local.parameters()):
        _close(p, lp)
        _close(p.grad, lp.grad)
        blocks = [b.torch() for b in p.shards()]
        if p.placements == (R, R):
            assert all(torch.equal(blocks[0], b) for b in blocks[1:]), name


def test_data_parallel_along_one_dimension_replicated_along_the_other(grid):
    """The batch Shard(0) along "dp" and replicated along "rep": the loss is Partial along
    dp alone, the gradients too, summed along dp's lines at the step."""
    model = mwrt.torch.module(_model(), mesh=grid)
    xs = mwrt.dist_send(_data(10)[0], mesh=grid, shard=(0, None))
    assert xs.placements == (Shard(0), R)
    out = model(xs)
    assert out.placements == (Shard(0), R) and tuple(out.shape) == (10, 3)
    loss = F.cross_entropy(out, mwrt.dist_send(_data(10)[1], mesh=grid, shard=(0, None)))
    assert loss.placements == (P, R)
    loss.backward()
    w = next(model.parameters())
    assert w.placements == (R, R) and w.grad.placements == (R, R)
    _train(mwrt.torch.module(_model(), mesh=grid), grid, (0, None))


def test_data_parallel_over_every_place_of_a_2d_mesh(grid):
    """The batch split over all four places (10 rows: 3, 3, 2, 2): Partial along both."""
    xs = mwrt.dist_send(_data(10)[0], mesh=grid, shard=0)
    assert xs.placements == (Shard(0), Shard(0))
    assert [tuple(b.shape) for b in xs.shards()] == [(3, 6), (2, 6), (3, 6), (2, 6)]
    assert xs.sum().placements == (P, P)
    torch.testing.assert_close(xs.sum().item(), _data(10)[0].sum().item(), **TOL)
    _train(mwrt.torch.module(_model(), mesh=grid), grid, 0)


@pytest.mark.parametrize("shard", [0, (0, None)])
def test_a_fully_sharded_module_on_a_2d_mesh_is_hybrid(grid, shard):
    """As FSDP2's on a 2-D mesh (HSDP): parameters Shard(0) along the last dimension and
    replicated along the first; the batch split over every place, or along dp alone."""
    model = mwrt.torch.fully_shard(_model(), mesh=grid)
    w = next(model.parameters())
    assert w.placements == (R, Shard(0))
    assert [tuple(b.shape) for b in w.shards()] == [(4, 6), (4, 6)] * 2
    _train(model, grid, shard)
    assert w.grad.placements == (R, Shard(0))


def test_constructors_and_refusals_on_a_2d_mesh(grid):
    z = mwrt.torch.zeros(5, 4, mesh=grid, shard=(None, 1), requires_grad=True)
    assert z.placements == (R, Shard(1))
    assert [tuple(b.shape) for b in z.shards()] == [(5, 2)] * 4
    (z * 3).sum().backward()
    assert z.grad.placements == (R, Shard(1))
    assert torch.equal(z.grad.torch(), torch.full((5, 4), 3.0))
    a = mwrt.dist_send(torch.ones(4, 3), mesh=grid, shard=(0, None))
    b = mwrt.dist_send(torch.ones(4, 3), mesh=grid, shard=(None, 0))
    with pytest.raises(PlacementError, match=r"split along different mesh dimensions"):
        a + b

"""Torch handles over a mesh: a replicated module trained data parallel from one program.

torch is the oracle: the same model on local torch, given the whole batch, takes the same
steps (up to the order of the sums) as the mesh module given the batch Shard(0), its
gradients Partial and summed by one all_reduce between the workers. torch DDP on gloo is
compared in test_the_training_example_matches_ddp (slow: it starts 2 workers and 2 ranks).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import mwrt  # noqa: E402
import mwrt.torch  # noqa: E402
from mwrt.errors import PlacementError  # noqa: E402
from mwrt.master.mesh.placement import Partial, Replicate, Shard  # noqa: E402

TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(scope="module")
def mesh():
    """Three local workers and the mesh of them (a batch of 12 rows: 4 at each place)."""
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=3, timeout=30)
    yield mwrt.mesh()
    mwrt.shutdown()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _data(rows: int) -> tuple:
    g = torch.Generator().manual_seed(rows)
    return torch.randn(rows, 6, generator=g), torch.randint(0, 3, (rows,), generator=g)


def _close(handle, local) -> None:
    torch.testing.assert_close(handle.torch(), local.detach(), **TOL)


def _step(model, opt, X, y):
    """One training step: the loss, before the step."""
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def _same_everywhere(param) -> None:
    blocks = [b.torch() for b in param._locals]
    assert all(torch.equal(blocks[0], b) for b in blocks[1:])


def test_a_replicated_module_trains_as_local_torch_on_the_whole_batch(mesh):
    X, y = _data(12)
    local = _model()
    model = mwrt.torch.module(_model(), mesh=mesh)
    opt = mwrt.torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    sched = mwrt.torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    lopt = torch.optim.AdamW(local.parameters(), lr=1e-2, weight_decay=1e-2)
    lsched = torch.optim.lr_scheduler.StepLR(lopt, step_size=2, gamma=0.5)
    for _ in range(3):
        out = model(mwrt.dist_send(X, mesh=mesh, shard=0))
        assert out._placements == (Shard(0),) and tuple(out.shape) == (12, 3)
        loss = F.cross_entropy(out, mwrt.dist_send(y, mesh=mesh, shard=0))
        assert loss._placements == (Partial("sum"),)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        lloss = F.cross_entropy(local(X), y)
        lopt.zero_grad()
        lloss.backward()
        lopt.step()
        lsched.step()
        assert loss.item() == pytest.approx(lloss.item(), rel=1e-6)
    for (name, p), lp in zip(model.named_parameters(), local.parameters()):
        assert p._placements == (Replicate(),), name
        _same_everywhere(p)
        _close(p, lp)


def test_an_uneven_batch_gives_the_mean_and_gradient_over_every_row(mesh):
    """7 rows on 3 places (3, 2, 2): each place's mean is weighted by its share of rows."""
    X, y = _data(7)
    local = _model()
    model = mwrt.torch.module(_model(), mesh=mesh)
    loss = F.cross_entropy(model(mwrt.dist_send(X, mesh=mesh, shard=0)),
                           mwrt.dist_send(y, mesh=mesh, shard=0))
    loss.backward()
    lloss = F.cross_entropy(local(X), y)
    lloss.backward()
    assert loss.item() == pytest.approx(lloss.item(), rel=1e-6)
    for p, lp in zip(model.parameters(), local.parameters()):
        grad = p.grad
        assert grad._placements == (Replicate(),)
        _close(grad, lp.grad)
        _close(p.grad, lp.grad)  # read again: resolved once, not summed twice


def test_placements_follow_the_shapes_of_the_blocks(mesh):
    x0 = torch.randn(12, 6)
    x = mwrt.dist_send(x0, mesh=mesh, shard=0)
    cases = [(torch.relu(x), torch.relu(x0), (Shard(0),)),
             (x.T, x0.T, (Shard(1),)),
             (x.sum(1), x0.sum(1), (Shard(0),)),
             (x.sum(), x0.sum(), (Partial("sum"),)),
             (x.mean(0), x0.mean(0), (Partial("sum"),)),
             (x.T @ x, x0.T @ x0, (Partial("sum"),)),
             (F.softmax(x, dim=1), F.softmax(x0, dim=1), (Shard(0),)),
             (x * 2 + 1, x0 * 2 + 1, (Shard(0),))]
    for got, want, placements in cases:
        assert got._placements == placements
        assert tuple(got.shape) == tuple(want.shape)
        _close(got, want)
    w = mwrt.dist_send(torch.ones(6), mesh=mesh)
    assert w._placements == (Replicate(),)
    _close(x @ w, x0 @ torch.ones(6))
    assert x.size(0) == 12 and x.dim() == 2


def test_two_backwards_without_zero_grad_accumulate_as_torch(mesh):
    X, y = _data(12)
    local = _model()
    model = mwrt.torch.module(_model(), mesh=mesh)
    xs, ys = mwrt.dist_send(X, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
    F.cross_entropy(model(xs), ys).backward()
    F.cross_entropy(local(X), y).backward()
    first, lfirst = next(model.parameters()).grad, next(local.parameters()).grad
    _close(first, lfirst)  # resolved: the whole at every place
    F.cross_entropy(model(xs), ys).backward()  # parts again, on top of the whole
    F.cross_entropy(local(X), y).backward()
    _close(first, lfirst)  # torch accumulates into the tensor p.grad gave, as here
    for p, lp in zip(model.parameters(), local.parameters()):
        _close(p.grad, lp.grad)


@pytest.mark.parametrize("make", ["module", "fully_shard"])
def test_a_captured_mesh_step_replays_as_local_steps(mesh, make):
    """A replicated module's step (the all_reduce), or a sharded one's (the all_gather,
    the reduce_scatter and the step on the shards), captured once."""
    X, y = _data(12)
    local = _model()
    model = getattr(mwrt.torch, make)(_model(), mesh=mesh)
    opt = mwrt.torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lopt = torch.optim.SGD(local.parameters(), lr=0.1, momentum=0.9)
    xs, ys = mwrt.dist_send(X, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
    with mwrt.graph() as step:
        loss = _step(model, opt, xs, ys)
    for _ in range(3):
        step.replay()
        lloss = _step(local, lopt, X, y)
        assert loss.item() == pytest.approx(lloss.item(), rel=1e-6)
    for p, lp in zip(model.parameters(), local.parameters()):
        if make == "module":  # a sharded one's blocks differ
            _same_everywhere(p)
        _close(p, lp)


def test_ops_that_would_mix_rows_across_places_are_refused_by_name(mesh):
    x = mwrt.dist_send(torch.randn(12, 6), mesh=mesh, shard=0)
    with pytest.raises(PlacementError, match=r"softmax: mixes values along the sharded axis"):
        F.softmax(x, dim=0)
    with pytest.raises(PlacementError, match=r"cumsum: mixes values along"):
        x.cumsum(0)
    with pytest.raises(PlacementError, match=r"no placement rule.*Shard\(0\)"):
        x[0]
    with pytest.raises(PlacementError, match=r"no placement rule"):
        x.argmax(0)
    whole = mwrt.dist_send(torch.zeros(12, 6), mesh=mesh)
    with pytest.raises(PlacementError, match="writes a replicated tensor from sharded"):
        whole.add_(x)
    with pytest.raises(PlacementError, match=r"one node.*meets a mesh tensor"):
        x + mwrt.dist_send(torch.ones(6), node=0)
    model = mwrt.torch.module(_model(), mesh=mesh)
    with pytest.raises(TypeError, match="takes mesh tensors"):
        model(torch.ones(2, 6))


def test_local_workers_run_torch_on_one_thread_each(mesh):
    """The master's local daemons share its host's cores: torch's intra-op threads, one per
    daemon (as torchrun gives several processes on a host), spun under load and made a
    training step of the example's MLP 50x slower on 2 shared cores."""
    t = mwrt.dist_send(torch.ones(1), node=1)
    threads = mwrt.remote(lambda a: a * torch.get_num_threads())(t)
    assert threads.item() == 1.0


@pytest.mark.slow
@pytest.mark.timeout(600)  # 2 daemons and 2 gloo ranks start and import torch
def test_the_training_example_matches_ddp():
    """examples/torch_training.py --mesh --ranks 2: the loss per step of its 40 steps on a
    2-node mesh within float tolerance of the same model under torch DDP on gloo with 2
    processes (the example's default of 4 each doubles the start-ups, which are most of the
    time, for the same comparison)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        root, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, os.path.join(root, "examples", "torch_training.py"),
                             "--mesh", "--ranks", "2"], capture_output=True, text=True,
                            timeout=580, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "same losses as DDP within 1e-05: True" in result.stdout, result.stdout


def test_a_copied_model_is_not_the_mesh_model(mesh):
    """The model given stays a local model: the mesh module keeps copies at the places."""
    model = _model()
    before = copy.deepcopy(model.state_dict())
    meshed = mwrt.torch.module(model, mesh=mesh)
    opt = mwrt.torch.optim.SGD(meshed.parameters(), lr=1.0)
    X, y = _data(12)
    F.cross_entropy(meshed(mwrt.dist_send(X, mesh=mesh, shard=0)),
                    mwrt.dist_send(y, mesh=mesh, shard=0)).backward()
    opt.step()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])


def test_constructors_on_a_mesh_match_local_torch(mesh):
    """mwrt.torch's constructors take mesh= and shard= as the NumPy ones do: a block at every
    place, the global tensor torch's (value, dtype, shape), leaves that require grad."""
    z = mwrt.torch.zeros(7, 3, mesh=mesh, shard=0, dtype=torch.float64, requires_grad=True)
    assert (z._placements, z.dtype, tuple(z.shape)) == ((Shard(0),), torch.float64, (7, 3))
    assert (z.requires_grad, z.is_leaf) == (True, True)
    assert [tuple(b.shape) for b in z._locals] == [(3, 3), (2, 3), (2, 3)]
    assert torch.equal(z.torch(), torch.zeros(7, 3, dtype=torch.float64))
    (z * 2 + 1).sum().backward()
    lz = torch.zeros(7, 3, dtype=torch.float64, requires_grad=True)
    (lz * 2 + 1).sum().backward()
    assert z.grad._placements == (Shard(0),) and torch.equal(z.grad.torch(), lz.grad)
    cases = [(mwrt.torch.ones(4, mesh=mesh), torch.ones(4), (Replicate(),)),
             (mwrt.torch.full((2, 6), 3.0, mesh=mesh, shard=1, dtype=torch.float16),
              torch.full((2, 6), 3.0, dtype=torch.float16), (Shard(1),)),
             (mwrt.torch.tensor([[1, 2], [3, 4]], mesh=mesh, shard=0),
              torch.tensor([[1, 2], [3, 4]]), (Shard(0),)),
             (mwrt.torch.empty(5, mesh=mesh, shard=Shard(0)).zero_(), torch.zeros(5),
              (Shard(0),))]
    for got, want, placements in cases:
        assert got._placements == placements
        assert (got.dtype, tuple(got.shape)) == (want.dtype, tuple(want.shape))
        assert torch.equal(got.torch(), want)
    with mesh:
        assert mwrt.torch.zeros(2)._placements == (Replicate(),)


def test_drawn_mesh_tensors_are_equal_where_replicated(mesh):
    """randn and rand draw a replicated tensor once and copy it to every place; a sharded one
    draws each block at its place, from that worker's generator."""
    r = mwrt.torch.randn(4, 2, mesh=mesh, requires_grad=True)
    blocks = [b.torch() for b in r._locals]
    assert all(torch.equal(blocks[0], b) for b in blocks[1:])
    assert (r.requires_grad, r.is_leaf, r.dtype) == (True, True, torch.float32)
    mwrt.torch.manual_seed(5)
    s = mwrt.torch.rand(6, 2, mesh=mesh, shard=0, dtype=torch.float64)
    assert (s._placements, tuple(s.shape), s.dtype) == ((Shard(0),), (6, 2), torch.float64)
    first = torch.rand(2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    assert torch.equal(s._locals[1].torch(), first)  # node 1's generator, seeded alike
    with pytest.raises(ValueError, match=r"randn: shard=2 is not an axis of a 2-D tensor"):
        mwrt.torch.randn(4, 2, mesh=mesh, shard=2)
    with pytest.raises(ValueError, match="shard=: no mesh to shard over"):
        mwrt.torch.zeros(4, shard=0)


def test_two_models_of_one_structure_on_one_worker_keep_their_own_parameters(mesh):
    """A worker keeps one unpickled function per content: the module each build made was
    one object, so a second model of the same structure took the first one's place (its
    values assigned into it), and the first model's forward ran on the second's values."""
    torch.manual_seed(0)
    first = mwrt.torch.module(torch.nn.Linear(3, 2), node=1)
    second = mwrt.torch.module(torch.nn.Linear(3, 2), node=1)
    with torch.no_grad():
        for p in second.parameters():
            p.zero_()
    x = torch.ones(4, 3)
    out = first(mwrt.dist_send(x, node=1)).torch()
    assert torch.equal(out, torch.nn.functional.linear(x, *first.state_dict().values()))
    assert torch.equal(second(mwrt.dist_send(x, node=1)).torch(), torch.zeros(4, 2))


def test_a_fully_sharded_module_trains_as_local_torch_and_as_the_replicated_one(mesh):
    """fully_shard: each parameter Shard(0) over the mesh (8 rows on 3 places: 3, 3, 2),
    gathered before each forward, its gradient reduce_scattered back to the shards, AdamW
    stepping on the shards: the same losses, parameters and gradients as local torch on the
    whole batch and as the replicated (DDP-style) mesh module."""
    X, y = _data(12)
    local, replicated = _model(), mwrt.torch.module(_model(), mesh=mesh)
    sharded = mwrt.torch.fully_shard(_model(), mesh=mesh)
    for (name, p), lp in zip(sharded.named_parameters(), local.parameters()):
        assert (p._placements, tuple(p.shape), p.dtype) == ((Shard(0),), tuple(lp.shape),
                                                            lp.dtype), name
        assert (p.requires_grad, p.is_leaf, p.grad) == (True, True, None)
    assert [tuple(b.shape) for b in next(sharded.parameters())._locals] == [(3, 6), (3, 6),
                                                                            (2, 6)]
    opts = [mwrt.torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (sharded, replicated)]
    lopt = torch.optim.AdamW(local.parameters(), lr=1e-2)
    xs, ys = mwrt.dist_send(X, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
    for _ in range(3):
        losses = [_step(model, opt, xs, ys).item()
                  for model, opt in zip((sharded, replicated), opts)]
        assert losses == pytest.approx([_step(local, lopt, X, y).item()] * 2, rel=1e-6)
    for (name, p), lp in zip(sharded.named_parameters(), local.parameters()):
        assert p.grad._placements == (Shard(0),), name
        _close(p, lp)
        _close(p.grad, lp.grad)
    for value, lp in zip(sharded.state_dict().values(), local.parameters()):
        torch.testing.assert_close(value, lp.detach(), **TOL)


def _held(mesh) -> list:
    """The bytes the session holds at each worker (torch tensors by their storage now)."""
    return [mwrt.memory_stats(node.index)["bytes"] for node in mesh.nodes]


def test_a_fully_sharded_module_holds_its_shards_between_uses(mesh):
    """The whole parameters' storage is freed after the forward and after the backward
    (FSDP's reshard_after_forward): between steps, and while a forward's graph waits for
    its backward, each worker holds its shards; the backward gathers them again, and the
    losses and gradients stay local torch's."""
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(96, 96), torch.nn.Tanh(),  # noqa: E731
                                       torch.nn.Linear(96, 3))
    local = make()
    X, y = torch.randn(6, 96), torch.randint(0, 3, (6,))
    xs, ys = mwrt.dist_send(X, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
    before = _held(mesh)
    torch.manual_seed(0)
    sharded = mwrt.torch.fully_shard(make(), mesh=mesh)
    params = list(sharded.parameters())
    shards = [sum(b.numel() * 4 for p in params for b in p._locals[i:i + 1])
              for i in range(mesh.size)]
    whole = sum(p.numel() * 4 for p in params)
    assert [a - b for a, b in zip(_held(mesh), before)] == shards
    opt, lopt = (mwrt.torch.optim.SGD(params, lr=0.1),
                 torch.optim.SGD(local.parameters(), lr=0.1))
    for _ in range(2):
        loss = F.cross_entropy(sharded(xs), ys)
        waiting = [a - b for a, b in zip(_held(mesh), before)]  # activations, the loss
        assert all(s <= w < s + whole // 4 for s, w in zip(shards, waiting)), (waiting, shards)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert loss.item() == pytest.approx(_step(local, lopt, X, y).item(), rel=1e-6)
        del loss
        assert [a - b for a, b in zip(_held(mesh), before)] == shards
    for p, lp in zip(params, local.parameters()):
        _close(p, lp)
        _close(p.grad, lp.grad)


def test_a_sharded_module_accumulates_and_clears_gradients_as_torch(mesh):
    X, y = _data(7)
    local, sharded = _model(), mwrt.torch.fully_shard(_model(), mesh=mesh)
    xs, ys = mwrt.dist_send(X, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
    for _ in range(2):  # no zero_grad between: the shards' gradients add up
        F.cross_entropy(sharded(xs), ys).backward()
        F.cross_entropy(local(X), y).backward()
    for p, lp in zip(sharded.parameters(), local.parameters()):
        _close(p.grad, lp.grad)
    sharded.zero_grad(set_to_none=False)
    assert all(torch.equal(p.grad.torch(), torch.zeros(p.shape)) for p in sharded.parameters())
    sharded.zero_grad()
    assert all(p.grad is None for p in sharded.parameters())
    with pytest.raises(ValueError, match="fully_shard: no mesh to shard over"):
        mwrt.torch.fully_shard(_model())


def test_a_second_backward_through_a_mean_over_the_sharded_axis(cluster):
    """Found by the random mesh programs: torch's mean saves no tensor, so a second backward
    through it runs; the mesh's weighting of each place's part saved its factor as a tensor,
    freed by the first backward ('backward through the graph a second time')."""
    local = (torch.arange(12.0).reshape(4, 3) / 7).requires_grad_()
    v0 = mwrt.dist_send(local.detach(), mesh=mwrt.mesh(), shard=0).requires_grad_()
    for t in (local, v0):
        v3 = t.mean(0)
        v3.sum().backward()
        (t * v3).mean().backward()
    torch.testing.assert_close(v0.grad.torch(), local.grad)

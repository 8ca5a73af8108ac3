"""Autograd across nodes, and torch.autograd.grad over a mesh: torch is the oracle.

A graph whose tensors were moved between nodes (`.to(node=)`) gives torch.autograd.grad,
backward(inputs=) and retain_graph what one torch graph gives: the same gradients (bit for
bit, added up in torch's order), None or torch's error for inputs it does not reach, and a
second backward through freed graphs refused with torch's own error.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import mwrt  # noqa: E402
import mwrt.torch  # noqa: E402
from mwrt.errors import RemoteError  # noqa: E402
from mwrt.master.mesh.placement import Partial, Replicate, Shard  # noqa: E402

F64 = torch.float64


@pytest.fixture(scope="module")
def two(cluster):
    """The mesh of two local workers: the session tests/conftest.py's cluster shares with the
    modules before and after, whose daemons may have imported torch already."""
    yield mwrt.mesh()


def _leaf(values, node: int):
    """A float64 leaf that requires grad on `node`, and its local twin."""
    local = torch.tensor(values, dtype=F64, requires_grad=True)
    return mwrt.dist_send(local.detach().clone().requires_grad_(), node=node), local


def test_autograd_grad_across_nodes_equals_local_torch(two):
    a, la = _leaf([0.5, -1.0, 2.0], 0)
    w, lw = _leaf([1.5, 0.25, -3.0], 1)
    h = a * 3
    b = h.to(node=1)
    ga, gw = torch.autograd.grad((b * w).sum() + torch.tanh(b).sum(), [a, w])
    lh = la * 3
    lga, lgw = torch.autograd.grad((lh * lw).sum() + torch.tanh(lh).sum(), [la, lw])
    assert (ga.get_node(), gw.get_node()) == (0, 1)
    assert torch.equal(ga.torch(), lga) and torch.equal(gw.torch(), lgw)
    assert a.grad is None and w.grad is None  # autograd.grad accumulates nothing
    there = (a.to(node=1) * 2).to(node=0)  # node 0 -> 1 -> 0, and a directly
    (g,) = torch.autograd.grad((there * there).sum() + (a * a).sum(), [a])
    (lg,) = torch.autograd.grad(((la * 2) * (la * 2)).sum() + (la * la).sum(), [la])
    assert torch.equal(g.torch(), lg)


def test_autograd_grad_across_nodes_on_inputs_it_does_not_reach(two):
    a, _ = _leaf([1.0, 2.0], 0)
    unused, _ = _leaf([1.0, 2.0], 0)
    loss = (a.to(node=1) ** 2).sum()
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        torch.autograd.grad(loss, [a, unused], retain_graph=True)
    ga, gu = torch.autograd.grad(loss, [a, unused], allow_unused=True, retain_graph=True)
    assert torch.equal(ga.torch(), torch.tensor([2.0, 4.0], dtype=F64)) and gu is None
    _, gz = torch.autograd.grad(loss, [a, unused], materialize_grads=True)
    assert torch.equal(gz.torch(), torch.zeros(2, dtype=F64))


def test_backward_with_inputs_across_nodes(two):
    """inputs= names tensors on other nodes: only they accumulate, as in torch."""
    a, la = _leaf([0.5, -1.0], 0)
    w, lw = _leaf([2.0, 3.0], 1)
    loss = (a.to(node=1) * w).sum()
    lloss = (la * lw).sum()
    loss.backward(inputs=[a], retain_graph=True)
    lloss.backward(inputs=[la], retain_graph=True)
    assert torch.equal(a.grad.torch(), la.grad) and w.grad is None and lw.grad is None
    torch.autograd.backward([loss], inputs=[w, a])
    torch.autograd.backward([lloss], inputs=[lw, la])
    assert torch.equal(a.grad.torch(), la.grad) and torch.equal(w.grad.torch(), lw.grad)


def test_a_cross_node_backward_frees_its_graphs_unless_retain_graph(two):
    """The walks free each node's graph as torch frees one graph: a second backward fails
    with torch's error (it was kept before, whatever retain_graph said)."""
    a, la = _leaf([0.5, -1.0], 0)
    loss = ((a * a).to(node=1) * 2).sum()
    lloss = ((la * la) * 2).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    lloss.backward(retain_graph=True)
    lloss.backward()
    assert torch.equal(a.grad.torch(), la.grad)
    loss.backward()  # through graphs the last one freed
    with pytest.raises(RemoteError, match="backward through the graph a second time"):
        loss.torch()  # node 1's next sync: torch's own error
    with pytest.raises(RemoteError, match=r"rank 1 sent nothing.*failed there"):
        a.grad.torch()  # node 0 waited for the gradient node 1 could not send


def test_autograd_grad_on_a_mesh_is_placed_as_backward_leaves_it(two):
    """torch.autograd.grad of a mean over a sharded batch: the replicated weight's gradient
    is Partial (its parts sum to the whole batch's), the sharded input's Shard(0)."""
    x0 = torch.randn(6, 3, dtype=F64)
    w0 = torch.randn(3, dtype=F64, requires_grad=True)
    lx = x0.clone().requires_grad_()
    x = mwrt.dist_send(lx.detach().clone().requires_grad_(), mesh=two, shard=0)
    w = mwrt.dist_send(w0.detach().clone().requires_grad_(), mesh=two)
    gw, gx = torch.autograd.grad(torch.tanh(x @ w).mean(), [w, x])
    lgw, lgx = torch.autograd.grad(torch.tanh(lx @ w0).mean(), [w0, lx])
    assert gw.placements == (Partial("sum"),) and gx.placements == (Shard(0),)
    assert x.placements == (Shard(0),) and w.placements == (Replicate(),)
    torch.testing.assert_close(gw.torch(), lgw, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(gx.torch(), lgx, rtol=1e-12, atol=1e-15)
    assert (gw.dtype, tuple(gw.shape), gx.dtype, tuple(gx.shape)) == (F64, (3,), F64, (6, 3))
    assert w.grad is None


CHAINS = {  # moves as clones in local torch; float32, where the order of sums shows
    "0 to 1 to 0 twice": "h = a * 3\nb = go0(go1(h))\nc = go0(go1(b * 2)) + h.exp()\n"
                         "loss = (c * h).sum() + b.sum() + h.sum()",
    "a chain 0, 1, 0, 1": "h = a.exp()\nb = go1(h) * 2\nc = go0(b) + h\nd = go1(c).tanh() + b\n"
                          "loss = d.sum() + go1(h).sum()",
    "one tensor moved twice": "h = a * 1.5\nb, c = go1(h), go1(h)\nloss = go0((b * b).sum() "
                              "+ c.tanh().sum()) + h.sum() + h.exp().sum()",
}


@pytest.mark.parametrize("how", ["backward", "inputs", "grad"])
@pytest.mark.parametrize("what", CHAINS)
def test_gradients_across_nodes_add_up_in_torch_order(two, what, how):
    """Each node's gradients add up in one backward there, where the gradient sent home
    enters as torch's copy would, so they equal torch's bit for bit (they were summed walk
    by walk, the last bit off); backward(inputs=) follows a gradient home (0 to 1 to 0) too
    (it stopped at the first node)."""
    values = torch.randn(5, generator=torch.Generator().manual_seed(1))
    grads = []
    for local in (True, False):
        a = values.clone().requires_grad_()
        if not local:
            a = mwrt.dist_send(a, node=0)
        env = {"a": a, "go0": (lambda t: t.clone()) if local else (lambda t: t.to(node=0)),
               "go1": (lambda t: t.clone()) if local else (lambda t: t.to(node=1))}
        exec(CHAINS[what], env)
        if how == "grad":
            (grad,) = torch.autograd.grad(env["loss"], [a])
        else:
            env["loss"].backward(inputs=[a] if how == "inputs" else None)
            grad = a.grad
        grads.append(grad if local else grad.torch())
    assert grads[0].dtype == torch.float32 and torch.equal(grads[0], grads[1])

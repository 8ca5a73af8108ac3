"""Torch handles' gradients in the per-storage ordering records.

A parameter's gradient is written on the worker by commands that name the parameter, not the
gradient's handle: a mesh optimizer's bucket (torch_grads_set copies the all_reduced sums
back into every .grad). The handle `p.grad` gave shares its parameter's record, so a use of
it on another stream waits for those writes, as a view's use waits for writes to its base.
Each test holds the default stream busy (a remote sleep) so that a use not ordered after
the write would overtake it.
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

import mwrt  # noqa: E402
import mwrt.torch  # noqa: E402
from mwrt.master.mesh.placement import Replicate  # noqa: E402


@pytest.fixture(scope="module")
def two(cluster):
    """Two local workers: the session tests/conftest.py's cluster shares with the modules
    before and after, whose daemons may have imported torch already."""
    yield


def _busy(nodes: int, seconds: float) -> None:
    """Hold the default stream of each node busy for `seconds` (later uses there queue)."""
    for i in range(nodes):
        mwrt.remote(lambda t: time.sleep(seconds), outputs=0)(mwrt.ones(1, node=i))


def _linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def test_a_gradient_read_on_another_stream_waits_for_the_bucket_that_sums_it(two):
    mesh = mwrt.mesh()
    x = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    local, model = _linear(), mwrt.torch.module(_linear(), mesh=mesh)
    xs = mwrt.dist_send(x, mesh=mesh, shard=0)
    model(xs).sum().backward()
    weight = next(model.parameters())
    g = weight.grad  # summed over the places: torch accumulates into this tensor
    other = mwrt.Stream(node=0)
    with mwrt.stream(other):  # the other stream is ordered after g's making from now on
        g._locals[0].clone()
    model(xs).sum().backward()  # each place's part, on top of the sum
    local(x).sum().backward()
    local(x).sum().backward()
    mwrt.synchronize()
    _busy(mesh.size, 1.0)
    assert weight.grad is g and g._placements == (Replicate(),)  # the bucket: queued, busy
    with mwrt.stream(other):
        seen = g._locals[0].clone()
    assert torch.equal(seen.torch(), next(local.parameters()).grad)


def test_a_write_to_a_gradient_on_another_stream_comes_before_the_bucket_reads_it(two):
    mesh = mwrt.mesh()
    x = torch.ones(4, 4)
    model = mwrt.torch.module(_linear(), mesh=mesh)
    xs = mwrt.dist_send(x, mesh=mesh, shard=0)
    model(xs).sum().backward()
    weight = next(model.parameters())
    g = weight.grad
    model(xs).sum().backward()
    mwrt.synchronize()
    streams = [mwrt.Stream(node=i) for i in range(mesh.size)]
    for i, s in enumerate(streams):  # a late write of every place's gradient on another stream
        with mwrt.stream(s):
            mwrt.remote(lambda: time.sleep(1.0), outputs=0)()
            g._locals[i].fill_(1.0)
    got = weight.grad  # the bucket, on the default stream: after the writes
    assert torch.equal(got.torch(), torch.full((1, 4), float(mesh.size)))


def _hold(t) -> None:
    """A remote read of `t` that holds its stream a while."""
    time.sleep(0.3)


@pytest.mark.parametrize("across", [False, True])
def test_a_gradient_read_on_another_stream_waits_for_the_backward_that_fills_it(two, across):
    """A backward issued on one stream behind a slow op writes the .grad of the leaves it
    fills: reading w.grad on another stream waits for it (it ran at once, before the
    backward, and found no gradient), on one node and when the backward crosses nodes."""
    hold = mwrt.remote(_hold, outputs=0)
    w = mwrt.dist_send(torch.tensor([2.0, -1.0])).requires_grad_()
    stream = mwrt.Stream(node=0)
    v = w.to(node=1) if across else w * 3
    with mwrt.stream(stream):
        hold(v)
        (v * v).sum().backward()
    want = 2 * w.torch() * (1 if across else 9)
    assert torch.equal(w.grad.torch(), want)

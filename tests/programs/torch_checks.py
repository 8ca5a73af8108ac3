"""One rank of the torch-backend comparison: `python torch_checks.py BACKEND OUT [CHECK...]`.

Runs every check below (or the ones named) in order on BACKEND under env://, each with the
same seeded inputs, and saves {check: result} to OUT.RANK, where a check that raised saves
"error: <type>: <text>". tests/torch/test_torch_backend_calls.py runs it on "mwrt" and on gloo and
compares. Checks that gloo cannot run (it races, or fails) are in MWRT_ONLY.
"""

import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import mwrt.torch  # noqa: F401 - registers the "mwrt" backend

MWRT_ONLY = ("coalescing_device", "all_to_all_in_place", "irecv_timeout", "recv_too_small",
             "shape_mismatch", "failed_on_one_rank")


def recv_any(rank, n):
    """recv without src: each sender's value, and the rank recv returned for it."""
    got = []
    if rank != 0:
        dist.send(torch.tensor([float(rank)]), dst=0)
        dist.send(torch.tensor([float(rank) + 0.5]), dst=0)
    for _ in range(2 * (n - 1) if rank == 0 else 0):
        t = torch.zeros(1)
        src = dist.recv(t)
        got.append((src, t.item()))
    dist.barrier()  # else a receive from any rank may take the next check's messages
    return sorted(got) if rank == 0 else None


def recv_order(rank, n):
    """A recv from any source, then one from that rank: the messages in the order sent."""
    if rank == 1:
        dist.send(torch.tensor([1.0]), dst=0)
        dist.send(torch.tensor([2.0]), dst=0)
    a, b, src = torch.zeros(1), torch.zeros(1), -1
    if rank == 0:
        src = dist.recv(a)
        dist.recv(b, src=src)
    dist.barrier()
    return [src, a.item(), b.item()] if rank == 0 else None


def all_to_all_list(rank, n):
    outs = [torch.empty(2) for _ in range(n)]
    dist.all_to_all(outs, [torch.tensor([10.0 * rank + p, -p]) for p in range(n)])
    return torch.stack(outs)


def all_reduce_coalesced(rank, n):
    a, b = torch.arange(3.0) + rank, torch.ones(2, 2) * rank
    dist.all_reduce_coalesced([a, b])
    return [a, b]


def all_gather_coalesced(rank, n):
    outs = [[torch.empty(2) for _ in range(2)] for _ in range(n)]  # gloo: of one shape
    dist.all_gather_coalesced(outs, [torch.tensor([rank, -rank], dtype=torch.float32),
                                     torch.arange(2.0) * rank])
    return [torch.stack(outs[0]), torch.stack(outs[1])]


def coalescing_manager(rank, n):
    a, b = torch.arange(4.0) + rank, torch.full((3,), float(rank))
    with dist._coalescing_manager():
        dist.all_reduce(a)
        dist.all_reduce(b)
    c, d = torch.ones(2) * rank, torch.ones(5) * (rank + 1)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(c)
        dist.all_reduce(d)
    cm.wait()
    return [a, b, c, d]


def coalescing_device(rank, n):
    """The form that names a device (gloo refuses it): each call runs as it comes."""
    a, b = torch.arange(4.0) + rank, torch.full((3,), float(rank))
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    return [a, b]


def all_to_all_in_place(rank, n):
    t = torch.arange(2.0 * n) + 100 * rank
    dist.all_to_all_single(t, t)
    return t


def group_name(rank, n):
    return isinstance(dist.group.WORLD.group_name, str) and bool(dist.group.WORLD.group_name)


def non_contiguous(rank, n):
    x = (torch.arange(6.0).reshape(2, 3) + rank).t()
    dist.all_reduce(x)
    b = (torch.arange(6.0).reshape(3, 2) * (rank + 1)).t()
    dist.broadcast(b, src=n - 1)
    outs = [torch.empty(3, 2).t() for _ in range(n)]
    dist.all_gather(outs, (torch.arange(6.0).reshape(3, 2) + rank).t())
    return [x, b, torch.stack(outs)]  # gloo's all_to_all_single takes contiguous ones only


def a2a_one_split(rank, n):
    inp = torch.arange(3.0 * n) + 100 * rank  # 3 rows to each rank
    out1 = torch.empty(3 * n)
    dist.all_to_all_single(out1, inp, output_split_sizes=[3] * n)
    out2 = torch.empty(3 * n)
    dist.all_to_all_single(out2, inp, input_split_sizes=[3] * n)
    return [out1, out2]


def recv_larger(rank, n):
    if rank == 0:
        dist.send(torch.tensor([7.0, 8.0]), dst=1)
    elif rank == 1:
        t = torch.zeros(4)
        dist.recv(t, src=0)
        return t
    return None


def large_p2p(rank, n):
    """Messages past 64 KiB (they follow their header): into a larger tensor, from any rank."""
    big = 200_000
    if rank == 0:
        dist.send(torch.arange(float(big)), dst=1)
        dist.send(torch.arange(float(big)) * -1, dst=1)
    if rank != 1:
        return None
    larger, exact = torch.zeros(big + 1000), torch.zeros(big)
    dist.recv(larger, src=0)
    src = dist.recv(exact)
    return [larger[:3], larger[big - 2:big + 2], larger.sum(), src, exact.sum(), exact[-2:]]


def work_result(rank, n):
    x = torch.ones(3) * rank
    w = dist.all_reduce(x, async_op=True)
    w.wait()
    return [r.clone() for r in w.result()]


def work_result_layout(rank, n):
    """What Work.result() holds for each collective: gloo's layout, tensor for tensor."""
    x = torch.arange(3.0) + rank
    calls = [lambda: dist.all_gather_into_tensor(torch.empty(3 * n), x, async_op=True),
             lambda: dist.gather(x, [torch.empty(3) for _ in range(n)] if rank == 0 else None,
                                 0, async_op=True),
             lambda: dist.all_gather([torch.empty(3) for _ in range(n)], x, async_op=True),
             lambda: dist.scatter(torch.empty(3), [x + p for p in range(n)] if rank == 0
                                  else None, 0, async_op=True),
             lambda: dist.broadcast(x.clone(), 1, async_op=True),
             lambda: dist.all_to_all_single(torch.empty(n), torch.arange(float(n)) + rank,
                                            async_op=True)]
    got = []
    for call in calls:
        w = call()
        w.wait()
        got.append([t.clone() for t in w.result()])
        got.append([t.clone() for t in w.get_future().value()])
    return got


def requires_grad(rank, n):
    """Parameters and tensors that require grad, in every call that takes them (DLPack
    refuses them: the backend moves their data, as gloo does)."""
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.nn.functional as dnn
    torch.manual_seed(rank)
    model = nn.Linear(2, 3)
    for p in model.parameters():
        dist.broadcast(p, 0)
    for p in model.parameters():
        dist.all_reduce(p)
    outs = [torch.zeros(3) for _ in range(n)]
    dist.all_gather(outs, model.bias)
    x = (torch.arange(2.0 * n) + rank).requires_grad_()
    gathered = funcol.all_gather_tensor_autograd(x, 0, dist.group.WORLD)
    scattered = funcol.reduce_scatter_tensor_autograd(x * 2, "sum", 0, dist.group.WORLD)
    swapped = funcol.all_to_all_single_autograd(x * 3, None, None, dist.group.WORLD)
    reduced = funcol.all_reduce(x, "sum", dist.group.WORLD)
    (funcol.wait_tensor(gathered).sum() + funcol.wait_tensor(scattered).sum()
     + (funcol.wait_tensor(swapped) * torch.arange(2.0 * n)).sum()).backward()
    y = torch.ones(2, requires_grad=True) * (rank + 1)
    summed = dnn.all_reduce(y)
    summed.sum().backward()
    return [p.detach().clone() for p in model.parameters()] + [
        torch.stack(outs), funcol.wait_tensor(reduced).detach().clone(),
        x.grad.clone(), summed.detach().clone()]


def completed_after_wait(rank, n):
    seen = []
    for i in range(20):
        out = torch.empty(n)
        w = dist.all_to_all_single(out, torch.arange(float(n)) + i, async_op=True)
        w.wait()
        seen.append(w.is_completed())
        x = torch.ones(2) * i
        w = dist.all_reduce(x, async_op=True)
        w.wait()
        value = w.get_future().value()
        seen.append(float(value[0][0]))
    return seen


def future_of_all_gather(rank, n):
    outs = [torch.empty(2) for _ in range(n)]
    w = dist.all_gather(outs, torch.tensor([rank, rank + 0.5]), async_op=True)
    value = w.get_future().wait()
    return [type(value).__name__, len(value), [type(v).__name__ for v in value]]


def callback_collective(rank, n):
    """A future's callback that runs another collective and waits for it (PowerSGD's)."""
    x = torch.ones(2) * rank

    def then(fut):
        y = fut.value()[0] * 2
        dist.all_reduce(y)
        return y
    return dist.all_reduce(x, async_op=True).get_future().then(then).wait()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _train(model, rank, steps, opt=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def ddp_powersgd(rank, n):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    model = DDP(_model())
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2, min_compression_rate=0.5,
                                   use_error_feedback=True, warm_start=True)
    model.register_comm_hook(state, powerSGD.powerSGD_hook)
    _train(model, rank, 5)  # compressed from the 3rd step on: 3 steps of nested collectives
    return [p.detach().clone() for p in model.parameters()]


class _Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.spare = _model(), nn.Linear(8, 4)

    def forward(self, x):
        return self.used(x)


def ddp_join(rank, n):
    from torch.distributed.algorithms.join import Join
    model = DDP(_Unused(), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    with Join([model]):
        for _ in range(2 + 2 * rank):  # uneven inputs: rank 0 runs out first
            x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    after = torch.ones(1) * rank  # the joined ranks go on to their next call
    dist.all_reduce(after)
    return [p.detach().clone() for p in model.module.used.parameters()] + [after]


def device_mesh_dtensor(rank, n):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (n,))
    torch.manual_seed(1)
    a, b = torch.randn(4 * n, 6), torch.randn(6, 5)
    da = distribute_tensor(a, mesh, [Shard(0)])
    db = distribute_tensor(b, mesh, [Shard(1)]) if 5 % n == 0 else distribute_tensor(b, mesh)
    prod = (da @ db).full_tensor()
    total = da.sum().full_tensor()
    return [prod, total]


def functional_collectives(rank, n):
    import torch.distributed._functional_collectives as funcol
    x = torch.arange(4.0) + rank
    red = funcol.all_reduce(x, "sum", dist.group.WORLD)
    gat = funcol.all_gather_tensor(x, 0, dist.group.WORLD)
    return [funcol.wait_tensor(red).clone(), funcol.wait_tensor(gat).clone()]


def fsdp2(rank, n):
    from torch.distributed.fsdp import fully_shard
    model = _model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    _train(model, rank, 3)
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def irecv_timeout(rank, n):
    """A receive whose wait timed out is withdrawn: the next message goes to the next one."""
    if rank == 1:
        dist.barrier()
        dist.send(torch.tensor([5.0]), dst=0)
        return None
    if rank != 0:
        dist.barrier()
        return None
    first = torch.zeros(1)
    w = dist.irecv(first, src=1)
    try:
        w.wait(timeout=timedelta(seconds=0.3))
        error = ""
    except Exception as exc:  # noqa: BLE001 - the test reads its text
        error = f"{type(exc).__name__}: {exc}"
    dist.barrier()
    second = torch.zeros(1)
    dist.recv(second, src=1)
    idle = dist.irecv(torch.zeros(1), tag=7)  # from any rank: nothing comes
    try:
        idle.wait(timeout=timedelta(seconds=0.2))
    except Exception:  # noqa: BLE001, S110 - withdrawn; its receivers stay blocked until the end
        pass
    return [error, first.item(), second.item()]


def recv_too_small(rank, n):
    """A receive refused (its tensor is too small) takes nothing from the next one."""
    if rank == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0]), dst=1)
        dist.send(torch.tensor([4.0]), dst=1)
    if rank != 1:
        return None
    small = torch.zeros(1)
    try:
        dist.recv(small, src=0)
        error = ""
    except Exception as exc:  # noqa: BLE001 - the test reads its text
        error = f"{type(exc).__name__}: {exc}"
    dist.recv(small, src=0)
    return [error, small.item()]


def _errors(calls) -> list[str]:
    """Each call's error text, or its value where it returned one."""
    got = []
    for call in calls:
        try:
            got.append(f"returned {call()}")
        except Exception as exc:  # noqa: BLE001 - the test reads its text
            got.append(f"{type(exc).__name__}: {exc}")
    return got


def _later_calls(group, rank):
    """The calls that follow a failed one: each must raise on every rank."""
    def all_reduce():
        x = torch.ones(2) * (rank + 1)
        dist.all_reduce(x, group=group)
        return x.tolist()
    return [all_reduce, lambda: dist.broadcast(torch.ones(1), 0, group=group),
            all_reduce, lambda: dist.barrier(group=group)]


def shape_mismatch(rank, n):
    """Ranks passing different shapes of one size: refused by design, and saying so; and
    the group runs nothing after (on a group of its own: the world goes on)."""
    group = dist.new_group(list(range(n)))
    got = _errors([lambda: dist.all_reduce(torch.ones(2, 3) if rank == 0 else torch.ones(3, 2),
                                           group=group), *_later_calls(group, rank)])
    dist.destroy_process_group(group)
    return got


def failed_on_one_rank(rank, n):
    """One rank's call fails before it takes part (a tensor it cannot pass): every rank
    raises in that call and in every later one of the group, none returns a value."""
    group = dist.new_group(list(range(n)))
    bad = torch.ones(2, device="meta") if rank == 1 else torch.ones(2)
    got = _errors([lambda: dist.all_reduce(bad, group=group), *_later_calls(group, rank)])
    dist.destroy_process_group(group)
    return got


CHECKS = [recv_any, recv_order, all_to_all_list, all_reduce_coalesced, all_gather_coalesced,
          coalescing_manager, coalescing_device,
          all_to_all_in_place, group_name, non_contiguous, a2a_one_split, recv_larger, large_p2p,
          work_result, work_result_layout, requires_grad, completed_after_wait,
          future_of_all_gather, callback_collective,
          ddp_powersgd, ddp_join, device_mesh_dtensor, functional_collectives, fsdp2,
          irecv_timeout, recv_too_small, shape_mismatch, failed_on_one_rank]


def main() -> None:
    backend, out, *names = sys.argv[1:]
    seconds = float(os.environ.get("CHECK_TIMEOUT", "60"))
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=seconds))
    rank, n = dist.get_rank(), dist.get_world_size()
    results = {}
    for check in CHECKS:
        if names and check.__name__ not in names:
            continue
        if backend != "mwrt" and check.__name__ in MWRT_ONLY:
            continue
        try:
            results[check.__name__] = check(rank, n)
        except Exception as exc:  # noqa: BLE001 - saved for the test to compare
            results[check.__name__] = f"error: {type(exc).__name__}: {exc}"
            traceback.print_exc()
        print(f"rank {rank}: {check.__name__} done", flush=True)
        torch.save(results, f"{out}.{rank}")  # what ran so far, should a later check hang
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()

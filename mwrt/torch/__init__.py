"""mwrt as a torch.distributed backend: `import mwrt.torch`, then init_process_group("mwrt").

Importing this package registers the backend "mwrt" with torch.distributed. Its process
group is a Python `torch.distributed.ProcessGroup` (the pattern of torch's own Python
process-group tests) whose collectives hand CPU tensors, as zero-copy DLPack views, to
mwrt.collective over one of mwrt's channels (MWRT_CHANNEL, "auto" by default: shared memory
on a host, tcp between hosts). Ranks find each other through the store torch made for the
group, so `init_method="env://"` under torchrun or mwrt-launch, `tcp://` and `file://` all
work; torch's DDP, new_group and the usual collectives then run unchanged, with mwrt's
agreement checks and error text. torch is an optional dependency: `pip install mwrt[torch]`.
"""

from __future__ import annotations

import atexit
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from .. import channels, config
from ..collective import api as C
from ..collective.buffers import as_flat
from ..collective.group import ProcessGroup as MwrtGroup
from ..collective.reduce_ops import ReduceOp
from ..errors import MwrtError, RendezvousError, RendezvousTimeoutError
from ..protocol import auth
from ..store import rendezvous
from ..store.stores import Store

BACKEND = "mwrt"

_REDUCE_OPS = {dist.ReduceOp.RedOpType.SUM: ReduceOp.SUM,
               dist.ReduceOp.RedOpType.PRODUCT: ReduceOp.PRODUCT,
               dist.ReduceOp.RedOpType.MIN: ReduceOp.MIN,
               dist.ReduceOp.RedOpType.MAX: ReduceOp.MAX,
               dist.ReduceOp.RedOpType.AVG: ReduceOp.AVG,
               dist.ReduceOp.RedOpType.BAND: ReduceOp.BAND,
               dist.ReduceOp.RedOpType.BOR: ReduceOp.BOR,
               dist.ReduceOp.RedOpType.BXOR: ReduceOp.BXOR}


class TorchStore(Store):
    """mwrt's Store contract over a torch.distributed store (the one torch made for a group);
    its errors become mwrt's, so a failure report still names the peers when rank 0, which
    serves torch's store, is gone."""

    def __init__(self, store, timeout: float):
        self.store, self.timeout = store, timeout

    def _call(self, method: str, *args):
        try:
            return getattr(self.store, method)(*args)
        except dist.DistError as exc:
            raise RendezvousError(f"torch store: {method} failed ({exc}); rank 0 serves it: "
                                  "check that it still runs") from None

    def set(self, key, value):
        self._call("set", key, value)

    def get(self, key, timeout=None):
        self.wait([key], timeout)
        return self._call("get", key)

    def add(self, key, amount):
        return self._call("add", key, int(amount))

    def compare_set(self, key, expected, desired):
        return self._call("compare_set", key, expected, desired)

    def wait(self, keys, timeout=None):
        seconds = self.timeout if timeout is None else float(timeout)
        try:  # torch reads a zero timeout as "none": wait at least a millisecond
            self.store.wait(list(keys), timedelta(seconds=max(seconds, 1e-3)))
        except dist.DistStoreError as exc:  # a timeout; other errors end in _call's
            missing = [k for k in keys if not self.check([k])]
            if missing:
                raise RendezvousTimeoutError(f"store: keys not set after {seconds} s (missing: "
                                             f"{missing}): {exc}") from None
        except dist.DistError:
            self._call("check", list(keys))  # raises the error, worded as the others
            raise

    def delete_key(self, key):
        return self._call("delete_key", key)

    def check(self, keys):
        return self._call("check", list(keys))


def _reduce_op(opts, what: str) -> ReduceOp:
    op = _REDUCE_OPS.get(opts.reduceOp.op if hasattr(opts.reduceOp, "op") else opts.reduceOp)
    if op is None:
        raise ValueError(f"{what}: the mwrt backend has no reduce op {opts.reduceOp} (known: "
                         f"{', '.join(o.name for o in _REDUCE_OPS)})")
    return op


def _cpu(tensors, what: str):
    """The tensors of a call, checked: mwrt's torch backend moves CPU tensors."""
    for t in tensors:
        if t.device.type != "cpu":
            raise ValueError(f"{what}: the mwrt backend takes CPU tensors (got one on "
                             f"{t.device}); pass t.cpu() and copy the result back, or use "
                             "mwrt.distributed with CuPy arrays")
    return tensors


class MwrtWork(dist.Work):
    """A torch Work over a running mwrt call: wait() raises mwrt's error; get_future() is
    the torch Future that DDP's comm hooks chain on, completed with `result`."""

    def __init__(self, future, result, timeout: float):
        super().__init__()
        self.future, self.timeout = future, timeout
        self.torch_future, self.result = torch.futures.Future(), result
        future.add_done_callback(self._finish)  # at once if it is done already

    def _finish(self, future) -> None:
        exc = future.exception()
        if exc is None:
            self.torch_future.set_result(self.result)
        else:
            self.torch_future.set_exception(exc)

    def wait(self, timeout=None) -> bool:
        """Block until done (torch's timeout, else the group's) and raise the call's error."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        seconds = seconds or self.timeout  # torch passes 0 for "no timeout given"
        try:
            self.future.result(timeout=seconds)
        except FutureTimeout:
            raise TimeoutError(f"mwrt work: not done after {seconds} s; a peer may be slow "
                               "or gone") from None
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def is_success(self) -> bool:
        return self.future.done() and self.future.exception() is None

    def get_future(self):
        return self.torch_future


class MwrtProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup running its collectives on an mwrt process group."""

    def __init__(self, group: MwrtGroup, channel, rank: int, size: int):
        super().__init__(rank, size)
        self.group, self.channel = group, channel
        self._p2p = ThreadPoolExecutor(4, thread_name_prefix="mwrt-torch-p2p")
        _live.append(self)

    def getBackendName(self):
        return BACKEND

    def _run(self, fn, *args, result=None):
        """Run fn(group, *args) in order on the group's thread; a Work completing with
        `result`."""
        future = self.group.call(fn, self.group, *args, async_op=True)
        return MwrtWork(future, result, self.group.timeout)

    # -- collectives -------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op = _reduce_op(opts or dist.AllreduceOptions(), "all_reduce")
        return self._run(_each, C.all_reduce, _cpu(tensors, "all_reduce"), op, result=tensors)

    def broadcast(self, tensors, opts=None):
        root = (opts or dist.BroadcastOptions()).rootRank
        return self._run(_each, C.broadcast, _cpu(tensors, "broadcast"), root, result=tensors)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        op = _reduce_op(opts, "reduce")
        return self._run(C.reduce, _cpu(tensors, "reduce")[0], opts.rootRank, op,
                         result=tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        inp, outs = _cpu(input_tensors, "all_gather")[0], _cpu(output_tensors[0], "all_gather")
        if any(o.shape != inp.shape for o in outs) or len(outs) != self.size():
            raise ValueError(f"all_gather: tensor_list needs {self.size()} tensors shaped like "
                             f"the input {tuple(inp.shape)} (got "
                             f"{[tuple(o.shape) for o in outs]})")
        buf = torch.empty((len(outs), *inp.shape), dtype=inp.dtype)

        def run(g):
            C.all_gather(g, buf, inp)
            for o, part in zip(outs, buf):
                o.copy_(part)
        return self._run(run, result=output_tensors)

    def all_gather_single(self, output, input, opts=None):
        return self._run(C.all_gather, *_cpu([output, input], "all_gather_into_tensor"),
                         result=[output])

    _allgather_base = all_gather_single

    def gather(self, output_tensors, input_tensors, opts=None):
        root, inp = (opts or dist.GatherOptions()).rootRank, _cpu(input_tensors, "gather")[0]
        outs = _cpu(output_tensors[0], "gather") if output_tensors else []
        buf = torch.empty((self.size(), *inp.shape), dtype=inp.dtype) if outs else None

        def run(g):
            C.gather(g, inp, buf, root)
            for o, part in zip(outs, buf if buf is not None else ()):
                o.copy_(part)
        return self._run(run, result=output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root, out = (opts or dist.ScatterOptions()).rootRank, _cpu(output_tensors, "scatter")[0]
        src = torch.stack(_cpu(input_tensors[0], "scatter")) if input_tensors else None
        return self._run(C.scatter, out, src, root, result=output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out, ins = _cpu(output_tensors, "reduce_scatter")[0], input_tensors[0]
        op = _reduce_op(opts or dist.ReduceScatterOptions(), "reduce_scatter")
        src = torch.stack(_cpu(ins, "reduce_scatter"))
        return self._run(C.reduce_scatter, out, src, op, result=output_tensors)

    def reduce_scatter_single(self, output, input, opts=None):
        op = _reduce_op(opts or dist.ReduceScatterOptions(), "reduce_scatter_tensor")
        return self._run(C.reduce_scatter, *_cpu([output, input], "reduce_scatter_tensor"), op,
                         result=[output])

    _reduce_scatter_base = reduce_scatter_single

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        _cpu([output, input], "all_to_all_single")
        if not output_split_sizes and not input_split_sizes:
            return self._run(C.all_to_all, output, input, result=[output])
        row = int(np.prod(input.shape[1:]))
        send = [int(k) * row for k in input_split_sizes]
        recv = [int(k) * int(np.prod(output.shape[1:])) for k in output_split_sizes]
        return self._run(C.all_to_all_v, output, input, send, recv, result=[output])

    def barrier(self, opts=None):
        return self._run(C.barrier, result=[])

    # -- point-to-point ----------------------------------------------------------------

    def send(self, tensors, dst: int, tag: int = 0):
        arr = as_flat(_cpu(tensors, "send")[0], "send", writable=False)
        return self._p2p_work(self.channel.isend, arr, dst, tag, tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        arr = as_flat(_cpu(tensors, "recv")[0], "recv")
        return self._p2p_work(self.channel.irecv, arr, src, tag, tensors)

    def _p2p_work(self, start, arr, peer: int, tag: int, tensors):
        """Post the message now (so messages keep their order); a thread waits for it."""
        timeout = self.group.timeout
        work = start(arr, self.group.ranks[peer], self.group.p2p_tag(int(tag)), timeout)
        return MwrtWork(self._p2p.submit(work.wait, timeout), tensors, timeout)

    # -- lifetime ----------------------------------------------------------------------

    def shutdown(self):
        """Close the group and its channel (destroy_process_group calls this)."""
        if self in _live:
            _live.remove(self)
            if not self.group.broken:
                try:  # rank 0 serves torch's store: keep it up until every rank is done
                    self.group.timeout = min(self.group.timeout, 30.0)
                    self.group.call(C.barrier, self.group)
                except MwrtError:
                    pass
            self._p2p.shutdown(wait=False, cancel_futures=True)
            self.group.close()
            self.channel.close()

    abort = shutdown


def _each(group, fn, tensors, *args):
    for t in tensors:
        fn(group, t, *args)


_live: list[MwrtProcessGroup] = []


@atexit.register
def _leave_at_exit() -> None:
    """A script that ends without destroy_process_group still leaves its peers cleanly."""
    for pg in list(_live):
        pg.channel.leave()


def create_process_group(opts, backend_options=None) -> MwrtProcessGroup:
    """torch's backend creator (its extended form, which tells the group's name and global
    ranks): rendezvous through torch's store, then connect an mwrt channel."""
    rank, size = opts.group_rank, opts.group_size
    seconds = (opts.timeout.total_seconds() if opts.timeout is not None
               else config.get("rendezvous_timeout"))
    mstore, prefix = TorchStore(opts.store, seconds), "mwrt"
    peers = rendezvous(mstore, rank, size, prefix=prefix, timeout=seconds)
    channel = channels.create(config.get("channel"), rank, size, store=mstore, prefix=prefix,
                              timeout=seconds, key=auth.job_secret())
    try:
        group = MwrtGroup(channel, store=mstore, prefix=prefix, peers=peers, timeout=seconds)
        # Errors name the group as torch knows it; their ranks are the group's.
        group.name = (f"torch group {opts.group_id} (global ranks "
                      f"{list(opts.global_ranks_in_group) or list(range(size))})")
        # Connect every pair now, while rank 0 (which serves torch's store) is sure to be up.
        probe = np.zeros(size, np.uint8)
        C.all_to_all(group, probe.copy(), probe)
    except BaseException:
        channel.close()
        raise
    return MwrtProcessGroup(group, channel, rank, size)


dist.Backend.register_backend(BACKEND, create_process_group, extended_api=True,
                               devices=["cpu"])

__all__ = ["BACKEND", "MwrtProcessGroup", "TorchStore", "create_process_group"]

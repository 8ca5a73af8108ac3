"""The "mwrt" backend's torch ProcessGroup: torch.distributed's calls on an mwrt group.

A Python subclass of `torch.distributed.ProcessGroup` (the pattern of torch's own Python
process-group tests). Every collective runs asynchronously, in program order, on the mwrt
group's thread (`group.call`), over zero-copy DLPack views of the CPU tensors; a tensor
that is not contiguous (a transposed view) goes through a contiguous copy that is copied
back. Point-to-point goes through mwrt.torch.backend_p2p. What torch's Python layer calls by name
on a group (recv_anysource, the coalesced and list forms, group_name) is here too, since
torch's C++ defaults would look for a C++ backend this group does not have.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.distributed as dist

from ..collective import api as C
from ..collective.buffers import as_flat
from ..collective.reduce_ops import ReduceOp
from ..errors import MwrtError
from . import backend_p2p
from .guard import Guard, collective
from .work import MwrtWork, seconds

BACKEND = "mwrt"

_REDUCE_OPS = {dist.ReduceOp.RedOpType.SUM: ReduceOp.SUM,
               dist.ReduceOp.RedOpType.PRODUCT: ReduceOp.PRODUCT,
               dist.ReduceOp.RedOpType.MIN: ReduceOp.MIN,
               dist.ReduceOp.RedOpType.MAX: ReduceOp.MAX,
               dist.ReduceOp.RedOpType.AVG: ReduceOp.AVG,
               dist.ReduceOp.RedOpType.BAND: ReduceOp.BAND,
               dist.ReduceOp.RedOpType.BOR: ReduceOp.BOR,
               dist.ReduceOp.RedOpType.BXOR: ReduceOp.BXOR}


LIVE: list = []  # groups not shut down yet, which leave their peers cleanly at exit


def _reduce_op(opts, what: str) -> ReduceOp:
    op = _REDUCE_OPS.get(opts.reduceOp.op if hasattr(opts.reduceOp, "op") else opts.reduceOp)
    if op is None:
        raise ValueError(f"{what}: the mwrt backend has no reduce op {opts.reduceOp} (known: "
                         f"{', '.join(o.name for o in _REDUCE_OPS)})")
    return op


def _dense(tensors, what: str) -> list:
    """The CPU tensors of a call, each as it is or, where not contiguous, a contiguous copy
    (`_copy_back` puts an output's result into the original)."""
    for t in tensors:
        if t.device.type != "cpu":
            raise ValueError(f"{what}: the mwrt backend takes CPU tensors (got one on "
                             f"{t.device}); pass t.cpu() and copy the result back, or use "
                             "mwrt.distributed with CuPy arrays")
    dense = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    for t in dense:
        as_flat(t, what, writable=False)  # a dtype NumPy cannot view fails here, not midway
    return dense


def _listed(tensors) -> list:
    """A call's tensors as a list: torch's C++ layer also calls the one-tensor overloads
    (DDP's Join hook: `allreduce(tensor)`)."""
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _options(opts, cls, field: str):
    """torch's options object; the short overloads pass a root rank or a reduce op instead."""
    if opts is None or isinstance(opts, cls):
        return opts or cls()
    made = cls()
    setattr(made, field, opts)
    return made


def _copy_back(originals, staged) -> None:
    for orig, dense in zip(originals, staged):
        if orig is not dense:
            orig.copy_(dense)


def _overlaps(a, b) -> bool:
    """True if two tensors share memory (all_to_all_single(t, t) in place)."""
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.data_ptr() == sb.data_ptr() and sa.nbytes() > 0


def _splits(sizes, rows: int, n: int, what: str, which: str) -> list[int]:
    """all_to_all_single's split sizes in rows; none given: an equal share per rank."""
    if sizes:
        return [int(k) for k in sizes]
    if rows % n:
        raise ValueError(f"{what}: without {which}, dim 0 ({rows}) must divide by the group's "
                         f"{n} ranks; pass {which}")
    return [rows // n] * n


class MwrtProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup running its collectives on an mwrt process group."""

    def __init__(self, group, channel, rank: int, size: int, name: str = ""):
        super().__init__(rank, size)
        self.group, self.channel = group, channel
        self._name, self._desc = name, ""
        self._sends = ThreadPoolExecutor(4, thread_name_prefix="mwrt-torch-send")
        self._receiver = backend_p2p.Receiver(group)
        self._coalesced: list | None = None
        self._lock = threading.Lock()
        self.guard = Guard(group)  # after a failed collective, none runs on this rank again
        LIVE.append(self)

    def getBackendName(self):
        return BACKEND

    # torch's C++ ProcessGroup reads its name from a C++ backend, which this group has not.
    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_desc(self) -> str:
        return self._desc

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    def _run(self, what: str, fn, *args, value=None):
        """Run fn(group, *args) in order on the group's thread; a Work completing with
        `value` (what gloo's future holds)."""
        future = self.group.call(self.guard.run(what, fn), self.group, *args, async_op=True)
        with self._lock:
            if self._coalesced is not None:
                self._coalesced.append(future)
        return MwrtWork(future, value, self.group.timeout, what)

    # -- collectives -------------------------------------------------------------------

    @collective("all_reduce")
    def allreduce(self, tensors, opts=None):
        if not isinstance(opts, dist.AllreduceCoalescedOptions):
            opts = _options(opts, dist.AllreduceOptions, "reduceOp")
        tensors = _listed(tensors)
        op, dense = _reduce_op(opts, "all_reduce"), _dense(tensors, "all_reduce")

        def run(g):
            for t in dense:
                C.all_reduce(g, t, op)
            _copy_back(tensors, dense)
        return self._run("all_reduce", run, value=tensors)

    @collective("all_reduce")
    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts or dist.AllreduceCoalescedOptions())

    @collective("broadcast")
    def broadcast(self, tensors, opts=None):
        tensors, root = _listed(tensors), _options(opts, dist.BroadcastOptions, "rootRank").rootRank
        dense = _dense(tensors, "broadcast")

        def run(g):
            for t in dense:
                C.broadcast(g, t, root)
            _copy_back(tensors, dense)
        return self._run("broadcast", run, value=tensors)

    @collective("reduce")
    def reduce(self, tensors, opts=None, op=None):
        tensors, opts = _listed(tensors), _options(opts, dist.ReduceOptions, "rootRank")
        if op is not None:
            opts.reduceOp = op
        op, dense = _reduce_op(opts, "reduce"), _dense(tensors, "reduce")

        def run(g):
            C.reduce(g, dense[0], opts.rootRank, op)
            _copy_back(tensors, dense)
        return self._run("reduce", run, value=tensors)

    @collective("all_gather")
    def allgather(self, output_tensors, input_tensors, opts=None):
        one = isinstance(input_tensors, torch.Tensor)  # allgather(list, tensor)
        outs = output_tensors if one else output_tensors[0]
        inp = _listed(input_tensors)[0]
        if any(o.shape != inp.shape for o in outs) or len(outs) != self.size():
            raise ValueError(f"all_gather: tensor_list needs {self.size()} tensors shaped like "
                             f"the input {tuple(inp.shape)} (got "
                             f"{[tuple(o.shape) for o in outs]})")
        return self.allgather_coalesced([[o] for o in outs], _listed(input_tensors)[:1], opts,
                                        value=outs)

    @collective("all_gather")
    def allgather_coalesced(self, output_lists, input_list, opts=None, value=None):
        """all_gather of each input i: rank r's into output_lists[r][i]."""
        inputs = _dense(input_list, "all_gather")
        want = [tuple(t.shape) for t in inputs]
        got = [[tuple(o.shape) for o in outs] for outs in output_lists]
        if len(output_lists) != self.size() or any(shapes != want for shapes in got):
            raise ValueError(f"all_gather: the outputs need {self.size()} lists (one per rank) "
                             f"of tensors shaped like the inputs {want} (got {got})")
        bufs = [torch.empty((self.size(), *inp.shape), dtype=inp.dtype) for inp in inputs]

        def run(g):
            for i, (inp, buf) in enumerate(zip(inputs, bufs)):
                C.all_gather(g, buf, inp)
                for outs, part in zip(output_lists, buf):
                    outs[i].copy_(part)
        return self._run("all_gather", run, value=output_lists if value is None else value)

    @collective("all_gather_into_tensor")
    def all_gather_single(self, output, input, opts=None):
        return self.allgather_into_tensor_coalesced([output], [input], opts)

    _allgather_base = all_gather_single

    @collective("all_gather_into_tensor")
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        dense_out = _dense(outputs, "all_gather_into_tensor")
        dense_in = _dense(inputs, "all_gather_into_tensor")

        def run(g):
            for out, inp in zip(dense_out, dense_in):
                C.all_gather(g, out, inp)
            _copy_back(outputs, dense_out)
        # gloo's value: each output as its ranks' parts
        parts = [part for out in outputs for part in out.chunk(self.size())]
        return self._run("all_gather_into_tensor", run, value=parts)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    @collective("gather")
    def gather(self, output_tensors, input_tensors, opts=None):
        root = _options(opts, dist.GatherOptions, "rootRank").rootRank
        one = isinstance(input_tensors, torch.Tensor)  # gather(list, tensor, root)
        inp = _dense(_listed(input_tensors), "gather")[0]
        outs = output_tensors if one else (output_tensors[0] if output_tensors else [])
        buf = torch.empty((self.size(), *inp.shape), dtype=inp.dtype) if outs else None

        def run(g):
            C.gather(g, inp, buf, root)
            for o, part in zip(outs, buf if buf is not None else ()):
                o.copy_(part)
        return self._run("gather", run, value=list(outs))  # gloo's: the root's tensors

    @collective("scatter")
    def scatter(self, output_tensors, input_tensors, opts=None):
        root = _options(opts, dist.ScatterOptions, "rootRank").rootRank
        one = isinstance(output_tensors, torch.Tensor)  # scatter(tensor, list, root)
        output_tensors = _listed(output_tensors)
        out = _dense(output_tensors, "scatter")
        ins = input_tensors if one else (input_tensors[0] if input_tensors else [])
        src = torch.stack(_dense(ins, "scatter")) if len(ins) else None

        def run(g):
            C.scatter(g, out[0], src, root)
            _copy_back(output_tensors, out)
        return self._run("scatter", run, value=output_tensors)

    @collective("reduce_scatter")
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        one = isinstance(output_tensors, torch.Tensor)  # reduce_scatter(tensor, list, op)
        output_tensors = _listed(output_tensors)
        out = _dense(output_tensors, "reduce_scatter")
        op = _reduce_op(_options(opts, dist.ReduceScatterOptions, "reduceOp"), "reduce_scatter")
        src = torch.stack(_dense(input_tensors if one else input_tensors[0], "reduce_scatter"))

        def run(g):
            C.reduce_scatter(g, out[0], src, op)
            _copy_back(output_tensors, out)
        return self._run("reduce_scatter", run, value=output_tensors)

    @collective("reduce_scatter_tensor")
    def reduce_scatter_single(self, output, input, opts=None):
        return self.reduce_scatter_tensor_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    @collective("reduce_scatter_tensor")
    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op = _reduce_op(opts or dist.ReduceScatterOptions(), "reduce_scatter_tensor")
        dense_out = _dense(outputs, "reduce_scatter_tensor")
        dense_in = _dense(inputs, "reduce_scatter_tensor")

        def run(g):
            for out, inp in zip(dense_out, dense_in):
                C.reduce_scatter(g, out, inp, op)
            _copy_back(outputs, dense_out)
        return self._run("reduce_scatter_tensor", run, value=outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    @collective("all_to_all_single")
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        what = "all_to_all_single"
        out, inp = _dense([output, input], what)
        if _overlaps(output, input):
            inp = input.clone()  # in place: every rank's part must be sent before it is overwritten
        if not output_split_sizes and not input_split_sizes:
            run = _then_copy(C.all_to_all, out, inp, output=output)
            return self._run(what, run, value=[output])
        n = self.size()
        send = _splits(input_split_sizes, inp.shape[0] if inp.dim() else 0, n, what,
                       "input_split_sizes")
        recv = _splits(output_split_sizes, out.shape[0] if out.dim() else 0, n, what,
                       "output_split_sizes")
        send = [k * int(np.prod(inp.shape[1:])) for k in send]
        recv = [k * int(np.prod(out.shape[1:])) for k in recv]
        return self._run(what, _then_copy(C.all_to_all_v, out, inp, send, recv, output=output),
                         value=[output])

    all_to_all_single = alltoall_base  # what torch's Python layer calls

    @collective("all_to_all")
    def alltoall(self, output_tensors, input_tensors, opts=None):
        """all_to_all's list form: one all_to_all_v of the tensors laid end to end."""
        what = "all_to_all"
        _dense(output_tensors + input_tensors, what)
        dtypes = {t.dtype for t in output_tensors + input_tensors}
        if len(dtypes) > 1:
            raise ValueError(f"{what}: every tensor must have one dtype (got "
                             f"{sorted(map(str, dtypes))})")
        src = torch.cat([t.reshape(-1) for t in input_tensors])
        buf = torch.empty(sum(t.numel() for t in output_tensors), dtype=src.dtype)
        send, recv = [t.numel() for t in input_tensors], [t.numel() for t in output_tensors]

        def run(g):
            C.all_to_all_v(g, buf, src, send, recv)
            for o, part in zip(output_tensors, torch.split(buf, recv)):
                o.copy_(part.view(o.shape))
        return self._run(what, run, value=output_tensors)

    @collective("barrier")
    def barrier(self, opts=None):
        return self._run("barrier", C.barrier, value=[])

    # -- coalescing: _coalescing_manager(device=...) -----------------------------------

    def _start_coalescing(self, device=None) -> None:
        with self._lock:
            self._coalesced = []

    @collective("coalesced calls")
    def _end_coalescing(self, device=None):
        """A Work for every call since _start_coalescing: they ran in order on one thread."""
        with self._lock:
            futures, self._coalesced = self._coalesced or [], None

        def run(g):
            for f in futures:
                f.result()
        return self._run("coalesced calls", run, value=[])

    # -- point-to-point ----------------------------------------------------------------

    def send(self, tensors, dst: int, tag: int = 0):
        dense = _dense(tensors, "send")
        arr = as_flat(dense[0], "send", writable=False).view(np.uint8)
        g = self.group
        works = backend_p2p.send(g, arr, dst, g.p2p_tag(int(tag)))

        def wait():
            for w in works:
                w.wait(g.timeout)
        return MwrtWork(self._sends.submit(wait), tensors, g.timeout,
                        f"send to rank {g.ranks[dst]}")

    def recv(self, tensors, src: int, tag: int = 0):
        return self._recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        return self._recv(tensors, None, tag)

    def _recv(self, tensors, src, tag: int):
        t = tensors[0]
        dense = _dense([t], "recv")[0]
        g, ptag = self.group, self.group.p2p_tag(int(tag))
        dest = as_flat(dense, "recv").view(np.uint8)
        recv = self._receiver.post(dest, src, ptag, g.timeout,
                                   None if dense is t else (lambda: t.copy_(dense)))
        what = f"recv from {'any rank' if src is None else f'rank {g.ranks[src]}'} (tag {tag})"
        return MwrtWork(recv.future, tensors, g.timeout, what,
                        withdraw=lambda: self._receiver.withdraw(recv, ptag))

    # -- lifetime ----------------------------------------------------------------------

    def set_timeout(self, timeout) -> None:
        self.group.timeout = seconds(timeout, self.group.timeout)

    def shutdown(self):
        """Close the group and its channel (destroy_process_group calls this)."""
        if self not in LIVE:
            return
        LIVE.remove(self)
        self.guard.settle()
        if not self.group.broken and not self.guard.failed:
            try:  # rank 0 serves torch's store: keep it up until every rank is done
                self.group.timeout = min(self.group.timeout, 30.0)
                self.group.call(C.barrier, self.group)
            except MwrtError:
                pass
        self._sends.shutdown(wait=False, cancel_futures=True)
        self.group.close()
        self.channel.close()  # the receives still waiting fail, and their pumps end

    abort = shutdown


def _then_copy(fn, out, *args, output):
    """fn(group, out, *args), then `out` into `output` where it is a contiguous stand-in."""
    def run(g):
        fn(g, out, *args)
        if out is not output:
            output.copy_(out)
    return run


__all__ = ["BACKEND", "LIVE", "MwrtProcessGroup"]

"""The session's table of tensors as stream handlers see it: resolving the Refs of a command,
storing a result, sizing a new tensor before it is made, and the entry a failed op leaves.

Every handler module (handlers, data, checkpoint) and the graph replay use these, so they
sit below all of them.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import arrays
from ..protocol import wire
from . import quotas


class Poisoned:
    """Table entry for a tensor whose producing op failed or was skipped."""

    __slots__ = ("info",)

    def __init__(self, info: dict):
        self.info = info


class PoisonedInput(Exception):
    """An argument was produced by a failed op: carries that op's error report."""

    def __init__(self, info: dict):
        super().__init__(info.get("message", ""))
        self.info = info


def resolve(ex, value):
    """Replace tensor Refs (also inside tuples and dicts) by the session's arrays."""
    kind = type(value)
    if kind is wire.Ref:
        try:
            found = ex.session.tensors[value.id]
        except KeyError:
            raise KeyError(f"tensor {value.id}: not on node {ex.session.node} (freed, never "
                           "created on this node, or made on another stream not ordered "
                           "before this one)") from None
        if type(found) is Poisoned:
            raise PoisonedInput(found.info)
        return found
    if kind is tuple:  # the args of nearly every op: scalars and Refs, looked at once each
        return tuple([resolve(ex, v) if type(v) in _NESTED else v for v in value])
    if kind is dict:
        return {k: resolve(ex, v) if type(v) in _NESTED else v for k, v in value.items()} \
            if value else value
    return value


_NESTED = frozenset((wire.Ref, tuple, dict))  # what resolve() looks inside


def ref_ids(value) -> set:
    """The ids of the tensor Refs in `value` (also inside tuples and dicts)."""
    if type(value) is wire.Ref:
        return {value.id}
    if isinstance(value, dict):
        value = tuple(value.values())
    if isinstance(value, tuple):
        return set().union(*map(ref_ids, value))
    return set()


def store(ex, out: int, value) -> None:
    """Keep a result as tensor `out`, as an array of the stream's namespace (torch's tensors,
    modules, optimizers and schedulers as they are)."""
    if type(value) is not np.ndarray and isinstance(value, np.generic):  # a reduction's
        value = ex.xp.asarray(value)  # NumPy scalar: the stream's 0-d array of it
    if type(value) is np.ndarray and not value.dtype.hasobject:  # (nearly every result)
        keep(ex, out, value)
        return
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, _torch_kinds(torch)):
        keep(ex, out, value)
        return
    kind = type(value).__name__
    if not hasattr(value, "shape") or isinstance(value, np.generic):
        value = ex.xp.asarray(value)
    if value.dtype.hasobject:  # a dict, a list of mixed things: nothing the wire can carry
        raise TypeError(f"the result is a {kind}, which is not an array of numbers; return "
                        "NumPy/CuPy arrays or numbers")
    keep(ex, out, value)


def keep(ex, out: int, value) -> None:
    """Put `value` in the table as tensor `out`, and answer the shape questions that wait
    for it: a shape is known once its tensor is made, not once its stream reaches the ask.
    (A failure is its stream's to report, in order: that clears the stream's error.)"""
    table = ex.session.tensors
    table[out] = value
    # (watched read without the lock: watch() adds under it before this store, or sees it)
    if table.watched and early_answer(value, ex.session.daemon.inline_bytes):
        for token in table.made(out):
            ex.reply(meta_answer(value, token))


def early_answer(value, inline_bytes: int) -> bool:
    """Whether a shape question on `value` is answered before its stream reaches it. Not a
    failure's (its stream reports it, in order), nor a small host array's, whose bytes ride
    with the answer so that the read after it costs no round trip (handlers.meta): a later
    command of the stream may write them."""
    if type(value) is np.ndarray:
        return value.nbytes > inline_bytes
    return type(value) is not Poisoned


def meta_answer(value, token: int):
    """The answer to a shape question (Meta) on array `value`: its shape and dtype."""
    if not isinstance(value.dtype, np.dtype):  # a torch tensor: torch's metadata
        return wire.Done(token=token, value={
            "shape": tuple(value.shape), "dtype": str(value.dtype), "stride": value.stride(),
            "requires_grad": value.requires_grad, "leaf": value.is_leaf})
    return wire.Done(token=token, value={"shape": value.shape, "dtype": value.dtype.str})


def _torch_kinds(torch) -> tuple:
    return (torch.Tensor, torch.nn.Module, torch.optim.Optimizer,
            torch.optim.lr_scheduler.LRScheduler)


def check_size(shape, dtype, what: str = "create", table=None, device=arrays.HOST) -> None:
    """Refuse an oversized host tensor before it is made (MWRT_MAX_TENSOR_BYTES, session
    quota); a GPU's own memory bounds a device tensor."""
    quotas.check_tensor(shape, dtype, what, table, device)

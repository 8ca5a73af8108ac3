"""A backward, or torch.autograd.grad, through a graph whose tensors live on several nodes.

A tensor moved to another node (`b = a.to(node=1)`) is made there by an autograd function
whose backward leaves its gradient on an anchor (torchissue.arrive); the master's copy of
the graph (torchgrad) marks it as a crossing. A backward that reaches crossings, or whose
`inputs=` (or autograd.grad's inputs) live on other nodes, runs here as walks, planned on
the master before any is issued: one on the roots' node, then, for the crossings each walk
reaches, one on each node they came from, from the tensors that were moved, seeded with
the anchors' gradients sent home over the data channel (and so on, for chains 0 to 1 to
0). A walk computes the gradients of the inputs of its node that it reaches and of its
anchors (torch.autograd.grad), or accumulates them (backward with `inputs=`, or every leaf
without it). Each walk but a node's last keeps its graph (a later walk may pass there
again); the last one frees it unless `retain_graph=True`, so a second backward fails with
torch's own error, as one graph's would. Gradients an input gets from several walks are
summed.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

from ..arrays import HOST
from . import torchgrad, transfer
from .torchissue import bits, from_raw, run, torch_call

_UNUSED = ("One of the differentiated Tensors appears to not have been used in the graph. "
           "Set allow_unused=True if this is the desired behavior.")  # torch's own error


class Walk(NamedTuple):
    """One node's part of the backward: from `roots`, reaching `visited` and `crossed`;
    `origin`: (the index of the walk, its crossings) whose anchors' gradients seed it (None:
    the first)."""

    place: tuple
    roots: list
    visited: set
    crossed: list
    origin: tuple | None


def call(func, args: tuple, kwargs: dict) -> Any:
    """torch's backward (Tensor.backward, autograd.backward) or autograd.grad across
    nodes."""
    torch = _torch()
    bound = inspect.signature(func).bind(*args, **kwargs).arguments
    if func is torch.autograd.grad:
        roots, seeds = _listed(bound["outputs"]), bound.get("grad_outputs")
    elif func is torch.autograd.backward:
        roots, seeds = _listed(bound["tensors"]), bound.get("grad_tensors")
    else:
        roots, seeds = [bound["self"]], bound.get("gradient")
    inputs = bound.get("inputs")
    inputs = None if inputs is None else _listed(inputs)
    create = bool(bound.get("create_graph"))
    retain = bound.get("retain_graph")
    retain = create if retain is None else bool(retain)
    places = {_place(t) for t in roots}
    if len(places) != 1:
        raise ValueError(f"backward: the roots live on several nodes ({sorted(places)}); "
                         "move them to one node first (t.to(node=...)) and add them")
    walks = _plan(places.pop(), roots)
    if func is torch.autograd.grad:
        found = _grads(walks, _listed(seeds) if seeds is not None else None, inputs or [],
                       retain, create)
        return _results(inputs or [], found, bound)
    _backward(walks, _listed(seeds) if seeds is not None else None, inputs, retain, create)
    return None


def _plan(place: tuple, roots: list) -> list[Walk]:
    """The walks of a backward from `roots` (on `place`), in the order they run."""
    walks: list[Walk] = []
    frontier: list = [(place, roots, None)]
    while frontier:
        place, roots, origin = frontier.pop(0)
        visited, crossed = torchgrad.reach(roots)
        index = len(walks)
        walks.append(Walk(place, roots, visited, crossed, origin))
        homes: dict = {}
        for node in crossed:
            homes.setdefault(_place(node.cross[0]), []).append(node)
        for home, nodes in homes.items():
            frontier.append((home, [n.cross[0] for n in nodes], (index, nodes)))
    return walks


def _keeps(walks: list[Walk], k: int, retain: bool) -> bool:
    """Whether walk k keeps its graph: a later walk runs on its node, or the caller asks."""
    return retain or any(w.place == walks[k].place for w in walks[k + 1:])


def _grads(walks: list[Walk], seeds: list | None, inputs: list, retain: bool,
           create: bool) -> dict:
    """autograd.grad along the walks: each input's gradients (one per walk reaching it)."""
    found: dict = {}
    sent: dict = {}  # (walk, id(crossing node)) -> its anchor's gradient, moved home
    for k, walk in enumerate(walks):
        wanted = [x for x in inputs if _place(x) == walk.place and _reached(x, walk)]
        anchors = [n.cross[1] for n in walk.crossed]
        if not wanted and not anchors:
            continue
        # by another name than torch's: issued as it is, not planned again
        grads = run("across.grad", _grads_rule, (walk.roots, [*wanted, *anchors]),
                    {"grad_outputs": _seeds(walk, seeds, sent),
                     "retain_graph": _keeps(walks, k, retain), "create_graph": create},
                    "torch", ("torch.autograd.grad",))
        for x, g in zip(wanted, grads):
            found.setdefault(id(x), []).append(g)
        for node, g in zip(walk.crossed, grads[len(wanted):]):
            sent[k, id(node)] = _home(g, node)
    return found


def _backward(walks: list[Walk], seeds: list | None, inputs: list | None, retain: bool,
              create: bool) -> None:
    """backward along the walks: the leaves (or `inputs`) each reaches accumulate."""
    torch = _torch()
    get, put = torch.Tensor.grad.__get__, torch.Tensor.grad.__set__
    sent: dict = {}
    for k, walk in enumerate(walks):
        anchors = [n.cross[1] for n in walk.crossed]
        options: dict = {"retain_graph": _keeps(walks, k, retain), "create_graph": create}
        here = None
        if inputs is not None:
            here = [x for x in inputs if _place(x) == walk.place and _reached(x, walk)]
            if not here and not anchors:
                continue
            options["inputs"] = [*here, *anchors]
        filled: list = []
        torchgrad.backward(walk.roots, here, filled)
        # by another name than torch's: issued as it is, not planned again; it writes the
        # .grad of the tensors it fills
        run("across.backward", _nothing, (walk.roots, _seeds(walk, seeds, sent)), options,
            "torch", ("torch.autograd.backward",), uses=tuple((t, True) for t in filled))
        for node, anchor in zip(walk.crossed, anchors):
            sent[k, id(node)] = _home(torch_call(get, (anchor,), {}), node)
            torch_call(put, (anchor, None), {})  # the next backward starts from nothing


def _seeds(walk: Walk, seeds: list | None, sent: dict) -> list | None:
    """The gradients a walk starts from: the caller's for the first, else those its
    origin's anchors received, moved home."""
    if walk.origin is None:
        return seeds
    index, nodes = walk.origin
    return [sent[index, id(node)] for node in nodes]


def _home(grad: Any, node: Any) -> Any:
    """An anchor's gradient sent to the node its tensor came from (worker to worker)."""
    source, _, raw = node.cross
    moved = transfer.move(bits(grad, raw), source._node.index, HOST)
    return from_raw(moved, str(grad._spec.dtype), False, source._device, type(source))


def _results(inputs: list, found: dict, bound: dict) -> tuple:
    """One gradient per input, summed over the walks; None or zeros for one no walk
    reached, as allow_unused and materialize_grads ask, else torch's error."""
    torch = _torch()
    out = []
    for x in inputs:
        parts = found.get(id(x))
        if parts is None:
            if bound.get("materialize_grads"):
                out.append(torch_call(torch.zeros_like, (x,), {}))
                continue
            if not bound.get("allow_unused"):
                raise RuntimeError(_UNUSED)
            out.append(None)
            continue
        total = parts[0]
        for part in parts[1:]:
            total = torch_call(torch.add, (total, part), {})
        out.append(total)
    return tuple(out)


def _reached(x: Any, walk: Walk) -> bool:
    node = torchgrad.node_of(x)
    return node is not None and id(node) in walk.visited


def _place(t: Any) -> tuple:
    return (t._node.index, t._device)


def _listed(value: Any) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _grads_rule(outputs: Any, inputs: list, **kwargs: Any) -> tuple:
    """torch.autograd.grad's results on the meta device, as torch's meta rule for it gives
    them (mwrt.ops.torchmeta): one per input, of its layout (contiguous where it overlaps)."""
    torch = _torch()
    grad = bool(kwargs.get("create_graph"))
    made = []
    for x in inputs:
        g = (torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
             if _dense(x) else torch.empty(x.shape, dtype=x.dtype, device="meta"))
        made.append(g.requires_grad_(grad))
    return tuple(made)


def _dense(x: Any) -> bool:
    """Whether x's strides lay its elements out without overlap or gaps (in some order)."""
    expected = 1
    for size, step in sorted((p for p in zip(x.shape, x.stride()) if p[0] != 1),
                             key=lambda p: p[1]):
        if step != expected:
            return False
        expected *= size
    return True


def _nothing(*args: Any, **kwargs: Any) -> None:
    """The meta rule of a call that makes no tensor."""


def _torch():
    import torch

    return torch

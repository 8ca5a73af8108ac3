"""A backward, or torch.autograd.grad, through a graph whose tensors live on several nodes.

A tensor moved to another node (`b = a.to(node=1)`) is made there by an autograd function
whose backward leaves its gradient on an anchor, and leaves from a departure on its own
node: an autograd node made at the move, as torch's copy would be, that leads to `a`
(torchissue.arrive); the master's copy of the graph (torchgrad) marks the crossing. A
backward that reaches crossings, or whose `inputs=` (or autograd.grad's inputs) live on
other nodes, runs here as walks, planned on the master before any is issued.

Each node is walked once in full, from the roots there and every departure there, each
seeded (the roots by the caller, a departure by its anchor's gradient sent home): torch's
engine runs one graph's nodes by their sequence numbers, latest first, and a departure
stands where torch's copy would, so every gradient adds up in the order, and to the bits,
that one graph's backward gives. A full walk computes the gradients of the inputs of its
node that it reaches (torch.autograd.grad) or accumulates them (backward with `inputs=`,
or every leaf without it), and its anchors' gradients too; it frees its graph unless
`retain_graph=True`, so a second backward fails with torch's own error, as one graph's
would. A node whose departures are not all seeded when an anchor there is needed (a chain
0 to 1 to 0) first gives that anchor's gradient by a walk of its own (autograd.grad,
keeping the graph) from the roots and the departures seeded so far; the newest crossings
go first, as only tensors made after a move reach its anchor.
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
    """One walk on `place`: in full (its roots and all its departures, its last), or for
    the anchors of `crossings` alone."""

    place: tuple
    full: bool
    crossings: list


class Start(NamedTuple):
    """What every walk starts from: the caller's roots (on `place`) and seeds, the crossings
    reached (the newest first), and the anchors' gradients sent home so far."""

    place: tuple
    roots: list
    seeds: list | None
    crossings: list
    sent: dict


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
    crossings = _crossings(roots)
    start = Start(places.pop(), roots, None if seeds is None else _listed(seeds), crossings, {})
    walks = _plan(start)
    if func is torch.autograd.grad:
        found = _grads(walks, start, inputs or [], retain, create)
        return _results(inputs or [], found, bound)
    _backward(walks, start, inputs, retain, create)
    return None


def _crossings(roots: list) -> list:
    """The crossing nodes a backward from `roots` reaches, through departures too, the
    newest first."""
    found: dict = {}
    todo = roots
    while todo:
        new = [n for n in torchgrad.reach(todo)[1] if id(n) not in found]
        found.update((id(n), n) for n in new)
        todo = [n.cross[0] for n in new]
    return sorted(found.values(), key=lambda n: n.cross[3], reverse=True)


def _plan(start: Start) -> list[Walk]:
    """The walks, in the order they run: a node's full walk as soon as its departures are
    all seeded, an anchors' walk where one is needed before."""
    walks: list[Walk] = []
    done: set = set()
    pending = list(start.crossings)
    while pending:
        where = _place(pending[0].cross[1])
        if all(_place(n.cross[0]) != where for n in pending):  # its departures are seeded
            walks.append(Walk(where, True, []))
            done.add(where)
            pending = [n for n in pending if _place(n.cross[1]) != where]
            continue
        group = 0  # the newest that arrive there: none of their departures is there
        while group < len(pending) and _place(pending[group].cross[1]) == where:
            group += 1
        walks.append(Walk(where, False, pending[:group]))
        pending = pending[group:]
    others = {start.place} | {_place(n.cross[0]) for n in start.crossings}
    walks.extend(Walk(p, True, []) for p in sorted(others - done))
    return walks


def _starts(walk: Walk, start: Start) -> tuple[list, list]:
    """(the tensors a walk starts from, their seeds): the caller's roots on its node, and
    the departures there whose anchors' gradients came home."""
    roots: list = []
    seeds: list = []
    if walk.place == start.place:
        roots.extend(start.roots)
        seeds.extend(start.seeds if start.seeds is not None else [None] * len(start.roots))
    for node in start.crossings:
        if id(node) in start.sent and _place(node.cross[0]) == walk.place:
            roots.append(node.cross[0])
            seeds.append(start.sent[id(node)])
    return roots, seeds


def _arrivals(walk: Walk, start: Start, roots: list) -> tuple[set, list, list]:
    """(the ids of the graph's nodes a walk reaches; the crossings whose anchors it gives: its
    own, or those it reaches whose gradients are not home yet; all those it reaches)."""
    visited, crossed = torchgrad.reach(roots)
    if not walk.full:
        return visited, walk.crossings, walk.crossings
    reached = {id(n) for n in crossed}
    found = [n for n in start.crossings if id(n) in reached]
    return visited, [n for n in found if id(n) not in start.sent], found


def _grads(walks: list[Walk], start: Start, inputs: list, retain: bool, create: bool) -> dict:
    """autograd.grad along the walks: each input's gradient, from its node's full walk."""
    found: dict = {}
    for walk in walks:
        roots, seeds = _starts(walk, start)
        visited, arrivals, _ = _arrivals(walk, start, roots)
        wanted = [x for x in inputs if walk.full and _place(x) == walk.place
                  and _reached(x, visited)]
        if not roots or (not wanted and not arrivals):
            continue
        grads = _grad(roots, seeds, [*wanted, *(n.cross[1] for n in arrivals)],
                      retain or not walk.full, create)
        found.update((id(x), g) for x, g in zip(wanted, grads))
        for node, g in zip(arrivals, grads[len(wanted):]):
            start.sent[id(node)] = _home(g, node)
    return found


def _grad(roots: list, seeds: list, inputs: list, retain: bool, create: bool) -> Any:
    """torch.autograd.grad of `roots` for `inputs` on their node."""
    # by another name than torch's: issued as it is, not planned again
    return run("across.grad", _grads_rule, (roots, inputs),
               {"grad_outputs": seeds, "retain_graph": retain, "create_graph": create},
               "torch", ("torch.autograd.grad",))


def _backward(walks: list[Walk], start: Start, inputs: list | None, retain: bool,
              create: bool) -> None:
    """backward along the walks: the leaves (or `inputs`) each full walk reaches
    accumulate."""
    for walk in walks:
        roots, seeds = _starts(walk, start)
        if not roots:
            continue
        visited, arrivals, reached = _arrivals(walk, start, roots)
        if not walk.full:
            anchors = [n.cross[1] for n in arrivals]
            for node, g in zip(arrivals, _grad(roots, seeds, anchors, True, create)):
                start.sent[id(node)] = _home(g, node)
            continue
        here = None
        if inputs is not None:
            here = [x for x in inputs if _place(x) == walk.place and _reached(x, visited)]
            reached = arrivals  # the only anchors it fills
        _accumulate(roots, seeds, here, arrivals, retain, create)
        get, put = _torch().Tensor.grad.__get__, _torch().Tensor.grad.__set__
        for node in arrivals:
            start.sent[id(node)] = _home(torch_call(get, (node.cross[1],), {}), node)
        for node in reached:  # the next backward starts from nothing
            torch_call(put, (node.cross[1], None), {})


def _accumulate(roots: list, seeds: list, here: list | None, arrivals: list, retain: bool,
                create: bool) -> None:
    """A node's full backward: its leaves (or `here`, and the anchors of `arrivals`)
    accumulate."""
    options: dict = {"retain_graph": retain, "create_graph": create}
    if here is not None:
        if not here and not arrivals:
            return
        options["inputs"] = [*here, *(n.cross[1] for n in arrivals)]
    filled: list = []
    torchgrad.backward(roots, here, filled)
    # by another name than torch's: issued as it is, not planned again; it writes the
    # .grad of the tensors it fills
    run("across.backward", _nothing, (roots, seeds), options, "torch",
        ("torch.autograd.backward",), uses=tuple((t, True) for t in filled))


def _home(grad: Any, node: Any) -> Any:
    """An anchor's gradient sent to the node its tensor came from (worker to worker)."""
    source, _, raw, _ = node.cross
    moved = transfer.move(bits(grad, raw), source._node.index, HOST)
    return from_raw(moved, str(grad._spec.dtype), False, source._device, type(source))


def _results(inputs: list, found: dict, bound: dict) -> tuple:
    """One gradient per input, its node's full walk's; None or zeros for one no walk
    reached, as allow_unused and materialize_grads ask, else torch's error."""
    torch = _torch()
    out = []
    for x in inputs:
        grad = found.get(id(x))
        if grad is None:
            if bound.get("materialize_grads"):
                out.append(torch_call(torch.zeros_like, (x,), {}))
                continue
            if not bound.get("allow_unused"):
                raise RuntimeError(_UNUSED)
            out.append(None)
            continue
        out.append(grad)
    return tuple(out)


def _reached(x: Any, visited: set) -> bool:
    node = torchgrad.node_of(x)
    return node is not None and id(node) in visited


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

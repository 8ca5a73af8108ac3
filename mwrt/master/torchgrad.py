"""Autograd's graph as the master sees it: which leaves a backward fills.

torch computes the gradients on the worker; the master keeps only the graph's shape, as
torch's grad_fn and AccumulateGrad do, so that `w.grad` is None, as torch's, until a
backward reached `w` (and again after zero_grad()) without asking the worker. Each torch
handle that requires grad has a Node: a leaf's own, a result's naming its inputs' nodes. An
in-place op gives the written tensor a new node, and the other tensors of its storage too:
torch rebases the history of a base and its views when one of them is written. A view of a
leaf whose storage was written (even without grad) after the view was made leads to that
leaf once it needs grad, a non-leaf: torch makes the view's grad_fn again when its version
counter has moved (an AsStridedBackward0). A backward walks the nodes from its roots and
marks the leaves it reaches; a node that stands for a tensor moved from another node
(`.to(node=)`) is handed back to the caller, which sends its gradient home (see
torchacross), and one that stands for a Partial mesh tensor made real (an all_reduce) to
the caller that carries its gradient on to the parts (see torchmeshgrad).
"""

from __future__ import annotations

import weakref
from typing import Any


class Node:
    """One node of the master's copy of the autograd graph."""

    __slots__ = ("parents", "keeps", "filled", "cross", "resolved", "owner")

    def __init__(self, parents: tuple = (), keeps: bool = False, cross: Any = None):
        self.parents = parents  # the nodes its gradient flows on to
        self.keeps = keeps  # a leaf's (or retain_grad()'s): a backward fills its .grad
        self.filled = False  # its .grad is set on the worker
        # (departure, anchor, raw class, order of the move): a tensor moved here from
        # another node, its gradient sent back to the departure there
        self.cross = cross
        # (order made, the tensor its parts' backward starts from, what the caller needs):
        # a mesh tensor made real from a Partial one
        self.resolved: tuple | None = None
        self.owner: Any = None  # a weak reference to the tensor whose .grad a backward fills


def node_of(tensor: Any) -> Node | None:
    """The node of `tensor` now (a leaf's made on first use), None if it needs no grad."""
    spec = tensor._spec
    if not getattr(spec, "requires_grad", False):  # a module's handle has no TorchSpec
        return None
    node = getattr(tensor, "_autograd", None)
    if node is None or (spec.leaf and not node.keeps and type(node) is not Inert):
        node = tensor._autograd = Node((), spec.leaf)
        if spec.leaf:
            node.owner = weakref.ref(tensor)
    return node


class Inert(Node):
    """The node of a view that needs grad only as its base does (made before the base's
    requires_grad_()): torch gives it no grad_fn and no gradient, so a backward through it
    fills nothing."""

    __slots__ = ()


def filled(tensor: Any) -> bool:
    """Whether a backward (or an assignment) set `tensor`'s .grad since it was last cleared."""
    node = getattr(tensor, "_autograd", None)
    return node is not None and node.filled


def set_filled(tensor: Any, value: bool) -> None:
    """`tensor.grad = value` (or zero_grad(set_to_none=True) when False)."""
    node = getattr(tensor, "_autograd", None)
    if node is None:
        if not value:
            return
        node = tensor._autograd = Node((), tensor._spec.leaf)
    node.filled = value


def retain(tensor: Any) -> None:
    """retain_grad(): a backward fills this non-leaf's .grad too."""
    node = node_of(tensor)
    if node is not None:
        node.keeps = True
        node.owner = weakref.ref(tensor)


def viewed(view: Any) -> None:
    """`view` shares its storage with its base's: kept for the rebase an in-place op makes.
    One made without grad of a tensor that needs grad needs grad with it, a leaf that gets
    no gradient, as torch's."""
    if view._spec.requires_grad and view._spec.leaf:
        view._autograd = Inert()
    owner = view._base
    views = getattr(owner, "_views", None)
    if views is None:
        views = owner._views = []
    elif len(views) >= 64 and len(views) & (len(views) - 1) == 0:  # dead ones, now and then
        views[:] = [v for v in views if v() is not None]
    views.append(weakref.ref(view))


# Views whose requires_grad_() set their own flag: a base's flag no longer says theirs.
_OWN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
# Views whose storage was written (in place, or its metadata changed) since they were made:
# torch's version counter moved past the view's, and once the base needs grad torch makes
# the view's grad_fn again (an AsStridedBackward0 to the base), so it is no leaf.
_STALE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def respecified(tensor: Any, old: Any) -> None:
    """requires_grad_() changed a leaf's flag from `old`'s to its spec's: the views made of
    it before, leaves too, follow it, as torch asks a view's base whether it needs grad
    (unless the view set its own); a view whose storage was written since it was made leads
    to the base instead."""
    spec = tensor._spec
    if not spec.leaf or spec.requires_grad == getattr(old, "requires_grad", None):
        return
    if tensor._base is not None:
        tensor._autograd = None  # a leaf of its own now, whose .grad a backward fills
        if spec.requires_grad:
            _OWN[id(tensor)] = tensor
        else:
            _OWN.pop(id(tensor), None)
        return
    for view in _views(tensor):
        if spec.requires_grad and _STALE.pop(id(view), None) is view:
            _remade(view, tensor)
        elif view._spec.leaf and _OWN.get(id(view)) is not view:
            view._spec = view._spec._replace(requires_grad=spec.requires_grad)
            view._autograd = Inert()


def written(tensor: Any) -> None:
    """An op wrote `tensor` in place or changed its metadata: each view of its storage is
    behind its version now; where the base is a leaf that needs grad (the write ran without
    grad), torch makes their grad_fn again when asked."""
    owner = tensor._base if tensor._base is not None else tensor
    views = _views(owner)
    if not views:
        return
    spec = owner._spec
    remake = getattr(spec, "requires_grad", False) and spec.leaf
    for view in views:
        if remake and (view._spec.leaf or view._spec.requires_grad):
            _remade(view, owner)
        else:
            _STALE[id(view)] = view


def _views(owner: Any) -> list:
    return [v for v in (r() for r in getattr(owner, "_views", None) or ()) if v is not None]


def _remade(view: Any, base: Any) -> None:
    """torch made `view`'s grad_fn again: a non-leaf whose gradient goes to `base`."""
    view._spec = view._spec._replace(requires_grad=True, leaf=False)
    view._autograd = Node((node_of(base),))


def record(inputs: list, made: list, outs: tuple, written: tuple) -> None:
    """An op ran with grad enabled: its new results that need grad get a node of `inputs`';
    each input it `written` gets one too, with the rest of its storage."""
    parents: tuple | None = None
    for tensor, (spec, same, _) in zip(made, outs):
        if same < 0 and spec.requires_grad and not spec.leaf:
            if parents is None:
                parents = _parents(inputs)
            tensor._autograd = Node(parents)
    for index in written:
        tensor = inputs[index]
        spec = tensor._spec
        if spec.requires_grad and not spec.leaf:
            if parents is None:
                parents = _parents(inputs)
            node = tensor._autograd = Node(parents)
            _rebase(tensor, node)


def _parents(inputs: list) -> tuple:
    return tuple(n for n in map(node_of, inputs) if n is not None)


def _rebase(written: Any, node: Node) -> None:
    """The base and the other views of `written`'s storage now lead to `node` too, and need
    grad (torch makes them non-leaves, as it rebases their history)."""
    owner = written._base if written._base is not None else written
    members = [owner, *(v() for v in getattr(owner, "_views", None) or ())]
    for member in members:
        if member is None or member is written:
            continue
        spec = member._spec
        old = node_of(member)
        if not spec.requires_grad or spec.leaf:
            member._spec = spec._replace(requires_grad=True, leaf=False)
        member._autograd = Node((node,) if old is None else (old, node))


def backward(roots: list, inputs: list | None, filled: list | None = None) -> list:
    """Mark the leaves a backward from `roots` fills (only `inputs`' if given), and add
    those tensors to `filled` (the backward writes their .grad); returns the nodes it
    reached that stand for tensors moved from another node."""
    wanted = None if inputs is None else {id(n) for n in map(node_of, inputs) if n}
    crossed = []
    for node in _walked(roots):
        if node.keeps if wanted is None else id(node) in wanted:
            node.filled = True
            owner = node.owner() if node.owner is not None else None
            if filled is not None and owner is not None:
                filled.append(owner)
        if node.cross is not None:
            crossed.append(node)
    return crossed  # with `inputs=` too: a gradient may come back to them (0 to 1 to 0)


def reach(roots: list) -> tuple[set, list]:
    """The ids of the nodes a backward from `roots` walks on their node, and the nodes
    among them that stand for tensors moved from another node; marks nothing."""
    nodes = _walked(roots)
    return {id(n) for n in nodes}, [n for n in nodes if n.cross is not None]


def resolutions(roots: list) -> list:
    """The `resolved` marks of the nodes a backward from `roots` reaches, and of those that
    the backwards from their parts reach in turn, the latest made first."""
    found: dict = {}
    todo = roots
    while todo:
        nodes, todo = _walked(todo), []
        for node in nodes:
            mark = node.resolved
            if mark is not None and mark[0] not in found:
                found[mark[0]] = mark
                todo.append(mark[1])
    return [found[k] for k in sorted(found, reverse=True)]


def _walked(roots: list) -> list:
    """The nodes a backward from `roots` walks on their node, each once."""
    stack = [n for n in map(node_of, roots) if n is not None]
    seen: set = set()
    walked = []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        walked.append(node)
        stack.extend(node.parents)
    return walked

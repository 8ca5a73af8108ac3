"""Issuing an op on mesh tensors: find its placement rule, then issue it at every place.

The op's meta rule runs once on the global Specs (NumPy's errors at issue time, the
result's global shape); the rule (rules.py) gives the result's placements and what each
place computes; each place's op is issued as any op on one node is (issue.call), so
streams, safe ordering, graphs and profiles hold for mesh programs unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from msgspec import Raw

from ... import ops
from ...ops import UNKNOWN, Spec
from ...protocol import wire
from .. import context, issue, ordering
from ..batches import queue_everywhere
from ..handle import Handle
from ..sites import issue_site, pin_site, unpin_site
from . import fallback, moves, rules
from .placement import local_specs
from .plan import PlacementError, Slot, is_partial

_SCALARS = (int, float, bool, complex)
_WRITES = rules.IN_PLACE | {"setitem"}  # ops that write their first operand
# NumPy functions that write an argument: on mesh tensors with no plan they would write a copy
WRITING_FUNCTIONS = {"copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis"}
_PLANS: dict = {}  # (op, mesh, operands' placements and Specs, argument kinds) -> (Spec, Plan)


def call(name: str, *args, **kwargs):
    """Issue registry op `name` on mesh tensors at every place; the result's handles. What
    it issues, at every place and on the way (moves), names one site: the op's line."""
    pinned = pin_site()
    try:
        # what views a scalar views a copy of it; its 0-d result is a scalar as one place's
        copied = issue.scalars_copied(args, call) if name in issue.ALIASING else args
        return issue.as_scalars(name, args, kwargs, _call(name, *copied, **kwargs))
    finally:
        unpin_site(pinned)


def _call(name: str, *args, **kwargs):
    operands: list = []
    margs = tuple([mark(a, operands, name) for a in args])
    mkwargs = {k: mark(v, operands, name) for k, v in kwargs.items()} if kwargs else {}
    if not operands:
        raise TypeError(f"{name}: no mesh tensor among the arguments")
    mesh = operands[0]._mesh
    for t in operands[1:]:
        if t._mesh is not mesh and t._mesh != mesh:
            raise PlacementError(f"{name}: operands lie on different meshes ({mesh!r} and "
                                 f"{t._mesh!r}); redistribute them onto one mesh first")
        if t._mesh is not mesh:  # alike, maybe of an ended session (its ids name others now)
            for node in t._mesh.nodes:
                node.check_open()
    for node in mesh.nodes:  # all or none: a lost node is named before any place runs it
        if node.lost is not None:
            node.check_lost()
    if ordering.capture:
        _real_before_capture(operands)
    elif ordering.unreplayed:
        ordering.refuse_unreplayed([b for t in operands for b in t._blocks or ()], name)
    if name in ordering.VIEWS and _views_first(margs):  # before the plan: a Partial
        moves.before_view(name, operands[0], margs)  # operand it may copy is made real
    op = ops.get(name)
    key = _plan_key(name, op, mesh, operands, margs, mkwargs)
    if key is not None:
        try:
            known = _PLANS.get(key)
        except TypeError:  # an argument that does not hash: planned every time
            key = known = None
        if known is not None:
            return run(name, known[1], operands, margs, mkwargs, known[0])
    spec = ops.infer(op, fill(margs, [t.spec for t in operands]),
                     fill(mkwargs, [t.spec for t in operands]))
    before = [t._placements for t in operands]
    try:
        plan = rules.find(name)(name, operands, margs, mkwargs, spec, moves.resolve)
        if plan.whole is not None:
            return plan.whole()
    except PlacementError as error:
        if not fallback.applies(error):
            raise
        return fallback.run(name, operands, operands[0] if name in _WRITES else None,
                            lambda local: call(name, *fill(margs, local),
                                               **fill(mkwargs, local)), call, error)
    if key is not None and not (plan.views or plan.adjust or plan.post or plan.skip) and \
            before == [t._placements for t in operands]:  # nothing resolved on the way
        if len(_PLANS) > 10_000:
            _PLANS.clear()
        _PLANS[key] = (spec, plan)
    return run(name, plan, operands, margs, mkwargs, spec)


def _real_before_capture(operands: list) -> None:
    """Inside a graph capture, a Partial operand made before it is made real now, once and
    unrecorded (moves.resolve): a replay reads its blocks as they are then, whole if a later
    op made it real, and would sum them again."""
    graph = ordering.capture[-1]
    for t in operands:
        if is_partial(t) and not graph.makes((t if t._base is None else t._base)._locals[0]):
            moves.resolve(t)


def _views_first(margs) -> bool:
    """True if a view op's first argument is operand 0 (the tensor it views)."""
    return bool(margs) and type(margs[0]) is Slot and margs[0].k == 0


def _plan_key(name, op, mesh, operands, margs, mkwargs):
    """What an op's plan depends on: the operands' placements and Specs, and the other
    arguments (a ufunc's scalars by type only); None where a shape is not known yet."""
    if any(t._spec is None for t in operands):
        return None
    by_type = op.by_type
    args = tuple([a.k if type(a) is Slot else _by_type(a) if by_type else (type(a), a)
                  for a in margs])
    return (name, mesh, *[(t._placements, t._spec) for t in operands], args,
            tuple(sorted(mkwargs.items())) if mkwargs else ())


def _by_type(value):
    """A ufunc's argument as far as its plan and result depend on it: a scalar's type, and
    whether it is zero or not finite (a Partial operand stays Partial under a multiply by
    a finite scalar only, rules._stays_partial); an array's dtype and shape (the result's);
    anything else itself."""
    kind = type(value)
    if kind is float or kind is int or kind is complex:
        return (kind, value == 0, value - value == 0)  # inf - inf and nan - nan are nan
    if kind is np.ndarray:
        return (kind, value.dtype, value.shape)
    if isinstance(value, np.number):
        return (kind, bool(value == 0), bool(np.isfinite(value)))
    return (kind, value)


def run(name, plan, operands, margs, mkwargs, spec):
    """Issue the planned op at every place; the results' handles over the mesh."""
    mesh, make = operands[0]._mesh, operands[0].results.on_mesh
    views, adjust, post, skip = plan.views, plan.adjust, plan.post, plan.skip
    if not (views or adjust or post or skip or ordering.capture) and (
            plan.placements is None or type(spec) is Spec) and name not in issue.ALIASING:
        fast = _issue_at_every_place(name, plan.placements, operands, margs, mkwargs, spec)
        if fast is not False:
            return fast
    results = []
    for i in range(mesh.size):
        if i in skip:
            continue
        local = [views[k][i] if k in views else t._locals[i] for k, t in enumerate(operands)]
        lname, largs, lkwargs = name, fill(margs, local), fill(mkwargs, local)
        if adjust is not None:
            lname, largs, lkwargs = adjust(i, lname, largs, lkwargs)
        result = issue.call(lname, *largs, **lkwargs)
        results.append(result if post is None else post(i, result))
    if plan.placements is None or not results or results[0] is None:
        return None
    if type(results[0]) is tuple:
        specs = spec if type(spec) is tuple else (None,) * len(results[0])
        return tuple(make(mesh, plan.placements, [r[j] for r in results], _known(specs[j]))
                     for j in range(len(results[0])))
    result = make(mesh, plan.placements, results, _known(spec))
    if name in ordering.VIEWS and _views_first(margs):
        moves.share(result, operands[0])
    if ordering.capture and is_partial(result):  # a replay makes it Partial again
        ordering.capture[-1].placed(result)
    if ordering.capture and result._spec is None:  # a replay may give another shape
        ordering.capture[-1].sized_by_data(result)
    return result


def _issue_at_every_place(name, placements, operands, margs, mkwargs, spec):
    """The op encoded once and its bytes queued at every place (one command id, and one
    result id that every place's worker gives its block), what issue.call does for one node
    less what the mesh knows (the op, the operands' places, the result's shape); False
    where an argument needs issue.call's general conversion."""
    wired = _wire_form(margs, mkwargs)
    if wired is None:
        return False
    mesh = operands[0]._mesh
    counter = mesh.shared_ids()
    if counter is None or context.stream_stack():  # chosen streams: each place's own
        return _place_by_place(name, placements, operands, wired, spec)
    template, slots, kwargs = wired
    nodes, places = mesh.nodes, mesh.places
    inplace = placements is None
    written = inplace and bool(slots) and slots[0] == (0, 0)
    site, fp = issue_site(), issue.fp_state()
    if not inplace:
        specs = local_specs(spec, placements, mesh)
        nodes[0].limits.check_result(name, specs[0])  # place 0's block is the largest
        out_id = next(counter)
    now = next(counter)
    # An operand made by this path has one id at every place (the same bytes everywhere);
    # another's reference is spliced into the bytes at each place.
    varying = [k for _, k in slots if not _one_id(operands[k])]
    outs_ids = () if inplace else (out_id,)
    devices = mesh.devices
    if type(devices) is int:  # one stream everywhere: every place ordered in one call
        for _, k in slots:  # the waits it needs go out before it
            ordering.order_mesh(operands[k], devices, now, written and k == 0)
    if type(devices) is int and not varying:  # one device everywhere: one command
        body = _encode(wire.Call(id=now, stream=devices, outs=outs_ids, op=name,
                                 args=_sentinel_args(template, slots, operands, varying),
                                 kwargs=kwargs, fp=fp), 0)
        bodies, streams = body, devices  # one for all: queued as one Run
    else:
        bodies, streams = _bodies(name, template, slots, operands, varying, now, outs_ids,
                                  kwargs, fp, places, written, type(devices) is not int)
    queue_everywhere(nodes, bodies, now, streams, site, _WINDOW * max(1.0, len(nodes) / 8))
    if inplace:
        return None
    made = operands[0].results
    if type(devices) is int:  # one record for every place, and no handle per place yet
        return made.everywhere(mesh, placements, spec, out_id, devices)
    return made.on_mesh(mesh, placements, made.at_places(
        nodes, mesh.place_devices, out_id, specs, mesh.place_devices), spec)


def _bodies(name, template, slots, operands, varying, now, outs_ids, kwargs, fp, places,
            written, order):
    """Each place's bytes of the op (its device's stream; varying references spliced in),
    its operands' uses ordered first if `order`."""
    bodies: list = []
    streams: list = []
    encoded: dict = {}  # device (its default stream) -> bytes, in pieces
    for i, (_, device) in enumerate(places):
        for _, k in slots if order else ():  # the waits it needs go out before it
            ordering.order((operands[k]._locals[i],), device, now, written and k == 0)
        pieces = encoded.get(device)
        if pieces is None:
            pieces = encoded[device] = _encode(wire.Call(
                id=now, stream=device, outs=outs_ids, op=name,
                args=_sentinel_args(template, slots, operands, varying), kwargs=kwargs, fp=fp),
                len(varying))
        if not varying:
            bodies.append(pieces)
        elif pieces is False:  # a sentinel not found once: this place's command built whole
            args = list(template)
            for pos, k in slots:
                args[pos] = operands[k]._locals[i]._ref
            bodies.append(Raw(wire.encode_message(wire.Call(
                id=now, stream=device, outs=outs_ids, op=name, args=tuple(args),
                kwargs=kwargs, fp=fp))))
        else:
            bodies.append(_splice(pieces, [operands[k]._locals[i]._ref.data for k in varying]))
        streams.append(device)
    return bodies, streams


# How long a place's batch gathers a mesh op's commands before it goes out, at 8 nodes
# and fewer; more nodes, longer in proportion (node.issue_encoded says why).
_WINDOW = 1e-3
_SENTINEL = 0x5EED_0000_0000_0000  # + k: where varying operand k's reference goes


def _sentinel_args(template, slots, operands, varying) -> tuple:
    args = list(template)
    for pos, k in slots:
        args[pos] = wire.ref(_SENTINEL + varying.index(k)) if k in varying else \
            _ref_of(operands[k])
    return tuple(args)


def _encode(command, varying: int):
    """The command's bytes (msgspec.Raw) with no varying operand; else the pieces between
    the sentinels' 8 bytes, or False if a sentinel is not found exactly once."""
    encoded = wire.encode_message(command)
    if not varying:
        return Raw(encoded)
    pieces, rest = [], encoded
    for j in range(varying):
        mark = (_SENTINEL + j).to_bytes(8, "little", signed=True)
        if rest.count(mark) != 1:
            return False
        head, rest = rest.split(mark)
        pieces.append(head)
    pieces.append(rest)
    return pieces


def _splice(pieces: list, refs: list):
    """The command's bytes with each operand's reference in its place."""
    if len(refs) == 1:
        return Raw(pieces[0] + refs[0] + pieces[1])
    parts = [pieces[0]]
    for ref, piece in zip(refs, pieces[1:]):
        parts += (ref, piece)
    return Raw(b"".join(parts))


def _one_id(tensor) -> bool:
    """True if every place's block has one id: a mesh tensor's blocks either all share the
    id (made by _issue_at_every_place) or all have their own (made place by place)."""
    blocks = tensor._blocks
    return blocks is None or blocks[0]._id == blocks[-1]._id


def _ref_of(tensor):
    """The reference to a mesh tensor's block at place 0 (at every place if _one_id)."""
    blocks = tensor._blocks
    return tensor._ref if blocks is None else blocks[0]._ref


def _place_by_place(name, placements, operands, wired, spec):
    """The op as one Call per place, each with its own ids, stream and encoding."""
    template, slots, kwargs = wired
    mesh = operands[0]._mesh
    inplace = placements is None
    written = inplace and bool(slots) and slots[0] == (0, 0)
    site, fp = issue_site(), issue.fp_state()
    outs = []
    specs = () if placements is None else local_specs(spec, placements, mesh)
    chosen = context.stream_stack()  # empty: every place on its device's default stream
    for i, node in enumerate(mesh.nodes):
        device = mesh.places[i][1]
        stream = context.stream_for(node.index, device) if chosen else device
        ids: tuple[int, ...] = ()
        if not inplace:
            node.limits.check_result(name, specs[i])
            out = operands[0].results(node, device, next(node.ids), specs[i], stream)
            outs.append(out)
            ids = (out._id,)
        now = next(node.ids)
        args = list(template)
        for pos, k in slots:
            tensor = operands[k]._locals[i]
            ordering.order((tensor,), stream, now, written and k == 0)
            args[pos] = tensor._ref
        node.issue(wire.Call(id=now, stream=stream, outs=ids, op=name, args=tuple(args),
                             kwargs=kwargs, fp=fp), site=site)
    return None if inplace else operands[0].results.on_mesh(mesh, placements, outs, spec)


def _wire_form(margs, mkwargs):
    """(args with None where operands go, [(position, operand)], kwargs) when every other
    argument goes on the wire as it is (scalars, strings, None, int tuples); else None."""
    template: list = []  # the arguments, None where an operand goes
    slots: list[tuple[int, Any]] = []  # (position, operand)
    for pos, value in enumerate(margs):
        if type(value) is Slot:
            template.append(None)
            slots.append((pos, value.k))
        elif type(value) in _SCALARS or value is None or type(value) is str:
            template.append(value)
        else:
            return None
    for value in mkwargs.values():
        if not (type(value) in _SCALARS or value is None or type(value) is str or (
                type(value) is tuple and all(type(v) is int for v in value))):
            return None
    return template, slots, mkwargs


def _known(spec):
    return spec if type(spec) is Spec else None


def mark(value, operands: list, name: str):
    """`value` with each mesh tensor replaced by a Slot; a one-node tensor is refused."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if isinstance(value, Handle):
        if value._mesh is not None:
            operands.append(value)
            return Slot(len(operands) - 1)
        raise PlacementError(
            f"{name}: a tensor on one node (node {value.get_node()}) meets a mesh tensor; put "
            "it on the mesh (mwrt.dist_send(t.numpy(), mesh=m), or make it with mesh=m)")
    if type(value) in (tuple, list):  # as issue.call converts them: the wire's tuples
        return tuple(mark(v, operands, name) for v in value)
    if type(value) is dict:
        return {k: mark(v, operands, name) for k, v in value.items()}
    return value


def fill(value, items: list):
    """`value` with each Slot replaced by items[slot.k]."""
    if type(value) is Slot:
        return items[value.k]
    if type(value) in (tuple, list):
        return type(value)(fill(v, items) for v in value)
    if type(value) is dict:
        return {k: fill(v, items) for k, v in value.items()}
    return value


def remote_call(fn, args: tuple, kwargs: dict):
    """mwrt.remote(fn) on mesh tensors: fn runs on each place's block; the results keep the
    first operand's placements (fn must keep the layout, as elementwise code does)."""
    operands: list = []
    margs, mkwargs = mark(args, operands, "remote"), mark(kwargs, operands, "remote")
    placements = {t._placements for t in operands}
    if len(placements) > 1:
        raise PlacementError("remote: mesh operands placed differently ("
                             + " and ".join(map(str, placements)) + "); redistribute them "
                             "alike first")
    return moves.per_place("remote", operands, lambda local: fn(*fill(margs, local),
                                                             **fill(mkwargs, local)),
                     keep=True)


__all__ = ["UNKNOWN", "call", "mark", "fill", "remote_call"]

"""np.einsum of mesh tensors by a local plan: each place runs the einsum on its blocks.

Along each mesh dimension the operands must agree on one subscript letter: each operand
sharded along that dimension is sharded on the letter's axis, the others are replicated
along it; one that holds the letter replicated is cut to each place's block of its axis
(a NumPy array too). The places then hold matching blocks of that letter's axis. A letter
kept in the output gives a result sharded on its axis there; a letter summed over gives a
Partial sum, each place's einsum a part (an all_reduce makes it real when read), as a
matmul over its sharded contraction axis does. Other subscripts (an implicit output or a
0-d one, an ellipsis, a letter sharded twice in one operand or of other lengths in
another, operands sharded on different letters, a single operand, whose einsum may view
it) have no plan here: the operands are replicated (fallback.py).
"""

from __future__ import annotations

import numpy as np

from ...ops import Spec
from ..issue import call
from .moves import resolve
from .placement import REPLICATE, Partial, Shard, local_box
from .plan import Slot


def einsum(operands: list, args: tuple, kwargs: dict, count):
    """np.einsum(subscripts, *operands) by its plan (see the module's text); None where
    the operands lie otherwise."""
    if kwargs or len(args) < 3 or type(args[0]) is not str:
        return None
    inputs, arrow, output = args[0].replace(" ", "").partition("->")
    terms, values = inputs.split(","), args[1:]
    if not arrow or not output or "." in args[0] or len(terms) != len(values) or not all(
            type(v) is Slot or isinstance(v, np.ndarray) for v in values):
        return None
    for t in operands:
        resolve(t)
    mesh = operands[0]._mesh
    letters = [_letter(operands, terms, values, d) for d in range(mesh.ndim)]
    cuts = _cuts(operands, terms, values, letters)
    if False in letters or cuts is None:
        return None
    out = tuple(REPLICATE if c is None else Shard(output.index(c)) if c in output else
                Partial("sum") for c in letters)
    sizes = {c: n for term, v in zip(terms, values)
             for c, n in zip(term, _of(v, operands).shape)}
    spec = Spec(tuple(sizes[c] for c in output),
                np.result_type(*[_of(v, operands).dtype for v in values]))
    blocks = []
    for i, coord in enumerate(mesh.coords):
        local = [v if type(v) is not Slot else operands[v.k]._locals[i] for v in values]
        for j, axis, (holder, at) in cuts:
            index = (slice(None),) * axis + (slice(*local_box(
                holder.shape, holder._placements, mesh.shape, coord)[at]),)
            local[j] = local[j][index] if type(values[j]) is not Slot else call(
                "getitem", local[j], index)
        blocks.append(call("numpy", "einsum", count, args[0], *local))
    return operands[0].results.on_mesh(mesh, out, blocks, spec)


def _of(value, operands: list):
    return operands[value.k] if type(value) is Slot else value


def _placement(operands: list, value, d: int):
    return operands[value.k]._placements[d] if type(value) is Slot else REPLICATE


def _letter(operands: list, terms: list, values: tuple, d: int):
    """The one letter that the operands sharded along mesh dimension d are sharded on (the
    others replicated along it), None if none is, False where they do not agree so."""
    sharded = set()
    for term, v in zip(terms, values):
        p = _placement(operands, v, d)
        if type(p) is Shard:
            if p.axis >= len(term) or term.count(term[p.axis]) != 1:
                return False
            sharded.add(term[p.axis])
        elif p != REPLICATE:
            return False
    return None if not sharded else sharded.pop() if len(sharded) == 1 else False


def _cuts(operands: list, terms: list, values: tuple, letters: list):
    """[(operand position, its axis, (a holder sharded on the letter, that axis))] for each
    operand that holds a sharded letter replicated along all of its dimensions; None where
    one holds it sharded along some of them only, or of another length."""
    cuts = []
    for letter in {c for c in letters if c}:
        dims = {d for d, c in enumerate(letters) if c == letter}
        held = [(j, term.index(letter)) for j, term in enumerate(terms) if letter in term]
        whole: list = []
        replicated: list = []
        for j, axis in held:
            along = {d for d in dims if _placement(operands, values[j], d) == Shard(axis)}
            if along and along != dims:
                return None
            (whole if along else replicated).append((j, axis))
        if not whole or len({_of(values[j], operands).shape[axis] for j, axis in held}) > 1:
            return None
        j, axis = whole[0]
        cuts += [(k, at, (operands[values[j].k], axis)) for k, at in replicated]
    return cuts


__all__ = ["einsum"]

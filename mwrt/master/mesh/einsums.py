"""np.einsum of mesh tensors by a local plan: each place runs the einsum on its blocks.

Along each mesh dimension the operands must agree on one subscript letter (each operand
that holds the letter sharded on its axis along that dimension, every other operand
replicated along it): the places then hold matching blocks of that letter's axis. A letter
kept in the output gives a result sharded on its axis there; a letter summed over gives a
Partial sum, each place's einsum a part (an all_reduce makes it real when read), as a
matmul over its sharded contraction axis does. Other subscripts (an implicit output or a
0-d one, an ellipsis, a letter sharded twice in one operand, operands sharded on
different letters, a single operand, whose einsum may view it) have no plan here: the
operands are replicated (fallback.py).
"""

from __future__ import annotations

import numpy as np

from ...ops import Spec
from ..issue import call
from .moves import resolve
from .placement import REPLICATE, Partial, Shard
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
    out = []
    for d in range(mesh.ndim):
        letter = _letter(operands, terms, values, d)
        if letter is False:
            return None
        out.append(REPLICATE if letter is None else Shard(output.index(letter))
                   if letter in output else Partial("sum"))
    sizes = {c: n for term, v in zip(terms, values)
             for c, n in zip(term, _of(v, operands).shape)}
    spec = Spec(tuple(sizes[c] for c in output),
                np.result_type(*[_of(v, operands).dtype for v in values]))
    blocks = [call("numpy", "einsum", count, args[0], *[
        v if type(v) is not Slot else operands[v.k]._locals[i] for v in values])
        for i in range(mesh.size)]
    return operands[0].results.on_mesh(mesh, tuple(out), blocks, spec)


def _of(value, operands: list):
    return operands[value.k] if type(value) is Slot else value


def _letter(operands: list, terms: list, values: tuple, d: int):
    """The one letter sharded along mesh dimension d by every operand that holds it (each
    other operand replicated along d), None if no operand is sharded along d, False where
    they do not agree so."""
    sharded = set()
    for term, v in zip(terms, values):
        p = operands[v.k]._placements[d] if type(v) is Slot else REPLICATE
        if type(p) is Shard:
            if p.axis >= len(term) or term.count(term[p.axis]) != 1:
                return False
            sharded.add(term[p.axis])
        elif p != REPLICATE:
            return False
    if not sharded:
        return None
    if len(sharded) != 1:
        return False
    letter = sharded.pop()
    lengths = set()
    for term, v in zip(terms, values):  # every holder of the letter sharded on it along d
        p = operands[v.k]._placements[d] if type(v) is Slot else REPLICATE
        if letter in term:
            if p != Shard(term.index(letter)):
                return False
            lengths.add(_of(v, operands).shape[term.index(letter)])
    return letter if len(lengths) == 1 else False


__all__ = ["einsum"]

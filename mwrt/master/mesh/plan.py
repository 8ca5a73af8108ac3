"""What a placement rule returns (Plan), how it marks operands (Slot), and how it fails
(PlacementError, with the redistribute() call that fixes it)."""

from __future__ import annotations

from .placement import REPLICATE, Partial, PlacementError, Shard, describe


class Slot:
    """Where operand `k` stands among an op's arguments."""

    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k

    def __eq__(self, other) -> bool:  # by position: remembered plans match on it
        return type(other) is Slot and other.k == self.k

    def __hash__(self) -> int:
        return hash((Slot, self.k))


class Plan:
    """What each place computes: the op on local operands (some replaced by `views`),
    `adjust(i, name, args, kwargs)` per place, `post(i, result)` after; `skip` places
    run nothing; `whole()`, when given, does the op itself (it moves data between places)."""

    __slots__ = ("adjust", "placements", "post", "skip", "views", "whole")

    def __init__(self, placements, views=None, adjust=None, post=None, skip=(), whole=None):
        self.placements, self.views = placements, views or {}
        self.adjust, self.post, self.skip, self.whole = adjust, post, skip, whole


def fix_text(placements: tuple) -> str:
    """The redistribute() call that puts a tensor at `placements`."""
    if all(p == REPLICATE for p in placements):
        return "t.replicate()"
    if len(set(placements)) == 1 and type(placements[0]) is Shard:
        return f"t.redistribute(shard={placements[0].axis})"
    return "t.redistribute(" + ", ".join(map(repr, placements)) + ")"


def no_plan(message: str, fix: str = "") -> PlacementError:
    """The error of an op with no local plan for its operands' placements: one that runs
    anyway, on redistributed operands, unless MWRT_STRICT_PLACEMENT is set (fallback.py)."""
    error = PlacementError(message)
    error.no_plan = True  # type: ignore[attr-defined]  # read by fallback.applies
    error.fix = fix or message  # type: ignore[attr-defined]  # what the warning quotes
    return error


def no_rule(name: str, operands, fix: str) -> PlacementError:
    placed = " and ".join(describe(t._placements) for t in operands)
    return no_plan(f"{name}: no placement rule for operands placed {placed} on "
                   f"{operands[0]._mesh!r}; {fix} (mwrt never gathers a tensor silently; "
                   "MWRT_STRICT_PLACEMENT=0 runs it on redistributed operands)", fix)


def is_partial(t) -> bool:
    return any(type(p) is Partial for p in t._placements)


def all_sum(t) -> bool:
    return all(p.op == "sum" for p in t._placements if type(p) is Partial)


def replicated_only(name, operands, args, kwargs, spec, resolve) -> Plan:
    """Any other op: at every place, on replicated operands."""
    for t in operands:
        resolve(t)
    if any(p != REPLICATE for t in operands for p in t._placements):
        raise no_rule(name, operands, f"{name} has no rule for sharded operands: replicate "
                      "them first (t.replicate())")
    return Plan(operands[0]._placements)

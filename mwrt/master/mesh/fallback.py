"""An op with no local plan for its operands' placements still runs: the workers replicate
its operands (all_gather of shards, all_reduce of parts, worker to worker, never through
the master), the op runs at every place on the copies, and the user is told once per call
site with a PlacementWarning naming the bytes moved and the explicit call. The first
operand keeps its placements where the op has a plan with the others replicated; an
in-place op writes its result back into its target's own blocks. MWRT_STRICT_PLACEMENT=1
raises the PlacementError instead.
"""

from __future__ import annotations

import warnings

from ... import config
from ..sites import issue_site
from .moves import redistribute
from .placement import REPLICATE, PlacementError, PlacementWarning, describe

_WARNED: set = set()  # call sites told already: (code, line)
_DEPTH = [0]  # > 0 while an op runs on replicated operands: no second fallback


def applies(error: PlacementError) -> bool:
    """True if `error` is an op without a local plan and the strict setting is off."""
    return (getattr(error, "no_plan", False) and not _DEPTH[0]
            and not config.get("strict_placement"))


def replicated(t):
    """t at every place whole (t itself if it is so already)."""
    if all(p == REPLICATE for p in t._placements):
        return t
    return redistribute(t, (REPLICATE,) * t._mesh.ndim)


def run(name: str, operands: list, target, again, call, error: PlacementError):
    """Run the op by again(operands redistributed): tell the user once per call site. First
    the operands after the first replicated (the first, an in-place op's `target` among
    them, keeps its placements: X0 + X1 stays Shard(0)); where that has no plan either,
    every operand, an in-place op's target by a copy whose result call("copy_", ...)
    (dispatch's call, which imports this module) writes back into its blocks."""
    _warn(name, operands, error)
    _DEPTH[0] += 1
    try:
        first = operands[0]
        if len(operands) > 1 and any(p != REPLICATE for p in first._placements):
            try:
                return again([first] + [t if t is first else replicated(t)
                                        for t in operands[1:]])
            except PlacementError as again_error:
                if not getattr(again_error, "no_plan", False):
                    raise
        if target is None or all(p == REPLICATE for p in target._placements):
            return again([replicated(t) for t in operands])
        whole = redistribute(target, (REPLICATE,) * target._mesh.ndim)  # a new tensor
        again([whole if t is target else replicated(t) for t in operands])
        call("copy_", target, whole)  # each place takes its own part of the result
        return None
    finally:
        _DEPTH[0] -= 1


def _warn(name: str, operands: list, error: PlacementError) -> None:
    site = issue_site()
    if site in _WARNED:
        return
    if len(_WARNED) < 100_000:
        _WARNED.add(site)
    mesh = operands[0]._mesh
    moved = sum(t.nbytes for t in operands if any(p != REPLICATE for p in t._placements))
    placed = " and ".join(describe(t._placements) for t in operands)
    reason = getattr(error, "fix", str(error))
    message = (f"{name}: no local plan for operands placed {placed}; ran on replicated "
               f"copies (each of the {mesh.size} places received up to {moved} bytes, worker "
               f"to worker): {reason}. Redistribute first to say so, or set "
               "MWRT_STRICT_PLACEMENT=1 to raise PlacementError")
    if site is None:
        warnings.warn(message, PlacementWarning, stacklevel=2)
    else:
        code, line = site
        warnings.warn_explicit(message, PlacementWarning, code.co_filename, line)

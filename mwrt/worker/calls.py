"""The Call command: a registry op run on a stream, its results checked against the op's
meta rule (what the master announced), and which calls are short enough for the daemon's
socket thread to run at once (quick_call)."""

from __future__ import annotations

import math

import numpy as np

from .. import arrays, ops
from ..protocol import wire
from . import fperrors, quotas
from .handlers import answer_value
from .tensors import resolve, store


def call(ex, cmd, frames):
    run_op(ex, ops.get(cmd.op), cmd)


def call_get(ex, cmd, frames):
    """Run the Call, then answer with its result's value, as a Get of it would (its
    warnings first); a failure is the answer (executor.fail), its results poisoned."""
    run_op(ex, ops.get(cmd.op), cmd)
    if not ex.raise_sticky(cmd.token):
        answer_value(ex, ex.session.tensors[cmd.outs[0]], cmd.token)


def run_op(ex, op, cmd) -> None:
    """Run Call `cmd` of registry op `op` (looked up once by a replayed graph) under the
    master's floating-point error state, keeping the warnings NumPy noted for the master."""
    try:
        if cmd.fp is None:
            _run_op(ex, op, cmd)
        elif (state := fperrors.state_object(cmd.fp)) is not None:
            token = fperrors.STATE.set(state)  # type: ignore[union-attr]
            try:
                _run_op(ex, op, cmd)
            finally:
                fperrors.STATE.reset(token)  # type: ignore[union-attr]
        else:
            with np.errstate(**fperrors.modes(cmd.fp)):
                _run_op(ex, op, cmd)
    finally:
        if fperrors.NOTED:
            fperrors.claim(ex.warned, cmd.id, cmd.op, KEPT_WARNINGS)


_UNSET = object()  # no result Specs (or key) worked out yet
KEPT_WARNINGS = 100  # per stream until its next answer: a loop that never syncs is bounded


def _run_op(ex, op, cmd) -> None:
    """Run Call `cmd`; its results must have the shapes and dtypes of the op's meta rule,
    as the master announced them."""
    prepared, expected = ex.prepared, _UNSET
    if prepared is not None and prepared[0] is cmd:  # quick_call's of a moment ago
        ex.prepared = None
        _, args, kwargs, expected = prepared
    else:
        args, kwargs = resolve(ex, cmd.args), resolve(ex, cmd.kwargs)
    if op.own_results:  # torch's: checked by the op against torch's meta device
        ex.use_torch_stream()
        table = ex.session.tensors
        for out, value in zip(cmd.outs, op.impl(ex.xp, *args, **kwargs), strict=True):
            table[out] = value
        return
    if not cmd.outs:  # in place, or out=: NumPy writes into tensors the master knows
        if op.name == "numpy_":
            quotas.check_inplace(ex.session.tensors, cmd.args, cmd.kwargs,
                                 ex.device == arrays.HOST)
        op.impl(ex.xp, *args, **kwargs)
        return
    if expected is _UNSET:
        expected = _expected(ex, op, cmd, args)
    result = op.impl(ex.xp, *args, **kwargs)
    if len(cmd.outs) == 1:
        store(ex, cmd.outs[0], _checked(op.name, result, expected))
        return
    if type(expected) is not tuple or not isinstance(result, (tuple, list)):
        raise TypeError(f"{op.name}: returned {type(result).__name__} (expected a tuple of "
                        f"{len(cmd.outs)} arrays)")
    for out, value, spec in zip(cmd.outs, result, expected, strict=True):
        store(ex, out, _checked(op.name, value, spec))


def _expected(ex, op, cmd, args, key=_UNSET):
    """The results' Specs by the op's meta rule: the same rule on the same Specs as on the
    master, so what it announced, without the announcement riding in every command. An
    oversized host result is refused here, before it is made (a GPU's allocator names its
    own); the numpy op is sized by its allow-list entry before its rule probes NumPy.
    Remembered by what decides them (operands' shapes and dtypes, plain values; `key`, if
    _scan found it): a sync loop's op pays one lookup, not the walk of its arguments."""
    table, host = ex.session.tensors, ex.device == arrays.HOST
    if key is _UNSET:
        key = _ufunc_key(op, args) if op.by_type and not cmd.kwargs else \
            _value_key(op.name, cmd.args, cmd.kwargs, table)
    seen = _SEEN.get(key) if key is not None else None
    if seen is None:
        specs, kwspecs = quotas.specs(table, cmd.args), quotas.specs(table, cmd.kwargs)
        # (on any device: the entry serves host and GPU streams alike)
        bound = quotas.numpy_bytes(specs, kwspecs) if op.name == "numpy" else -1
        if host and bound >= 0:
            quotas.check_bytes(bound, f"np.{specs[0]!s:.60}", table)
        result = ops.infer(op, specs, kwspecs)
        seen = (result, bound, specs, kwspecs, quotas.largest_result(result))
        if key is not None:
            if len(_SEEN) > 10_000:
                _SEEN.clear()
            _SEEN[key] = seen
    elif host and seen[1] >= 0:
        quotas.check_bytes(seen[1], f"np.{seen[2][0]!s:.60}", table)
    if host and seen[1] < 0:
        quotas.check_result(op.name, seen[0], seen[2], seen[3], table, seen[4])
    return seen[0]


_SEEN: dict = {}  # an op's (result Specs, numpy bound, Specs, largest) by what decides them
_SCALAR_TYPES = frozenset((int, float, bool, complex))


def _ufunc_key(op, args) -> tuple | None:
    """What decides a ufunc's results: its operands' shapes and dtypes, a scalar's type."""
    key = [op.name]
    for value in args:
        kind = type(value)
        if kind in _SCALAR_TYPES:
            key.append(kind)
        elif isinstance(value, np.generic):  # its dtype: a datetime's unit decides too
            key.append(value.dtype)
        elif hasattr(value, "dtype"):
            key.append((value.shape, value.dtype))
        else:
            return None
    return tuple(key)


class _Unkeyed(Exception):
    """A value whose meta may depend on more than its type and value (an array)."""


def _value_key(name: str, args: tuple, kwargs: dict, table) -> tuple | None:
    """What decides any op's results: its tensors' shapes and dtypes (from the table, by
    Ref) and its other arguments' values, typed; None where an argument is an array sent
    by value (a mask's values decide its result) or a tensor is missing."""
    try:  # (args: always a tuple, its items keyed at once; most ops have no keywords)
        return (name, tuple([_plain_key(v, table) for v in args]),
                _plain_key(kwargs, table) if kwargs else None)
    except (_Unkeyed, KeyError, AttributeError):
        return None


def _plain_key(value, table):
    kind = type(value)
    if kind is wire.Ref:
        found = table[value.id]
        return (found.shape, found.dtype)
    if kind in _SCALAR_TYPES or kind is str or value is None or kind is bytes:
        return (kind, value)
    if kind is tuple or kind is list:
        return (kind, tuple([_plain_key(v, table) for v in value]))
    if kind is dict:
        return (kind, tuple([(k, _plain_key(v, table)) for k, v in value.items()]))
    if kind is slice:
        return (kind, _plain_key((value.start, value.stop, value.step), table))
    if value is Ellipsis or (isinstance(value, np.generic) and value.dtype.kind in "biufc"):
        return (kind, value)
    raise _Unkeyed


def _checked(name: str, value, spec):
    """`value` if it has `spec`'s shape and dtype (or the rule left them to the worker);
    else a named error now, never bytes read later as another dtype or shape."""
    if type(spec) is not ops.Spec:
        return value
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None:  # a Python scalar from a function: NumPy's 0-d array of it
        value = np.asarray(value)
        shape, dtype = value.shape, value.dtype
    if shape != spec.shape or dtype != spec.dtype:
        raise TypeError(f"{name}: the result disagrees with the shape and dtype the master "
                        f"announced (got {dtype}{list(shape)}, expected {spec.dtype}"
                        f"{list(spec.shape)}); mwrt's meta rule for {name} is wrong: please "
                        "report it; .numpy() of the arguments and NumPy give the right value")
    return value


def quick_call(ex, cmd, limit: int) -> bool:
    """True if Call `cmd` is short enough to run on the daemon's socket thread: a registry
    op (never user code) over NumPy arrays in host memory, holding at most `limit` elements
    among its operands and its results (by the meta rule). Anything odd (a missing or
    poisoned input, a refused size) says False: the stream's executor reports it."""
    if cmd.op in _NEVER_QUICK:
        return False
    try:
        op = ops.get(cmd.op)
        scanned = _scan(ex.session.tensors, cmd, op.by_type and not cmd.kwargs)
        if scanned is not None:  # (nearly every op: one walk of its arguments)
            args, kwargs, count, key = scanned
        else:
            args = resolve(ex, cmd.args)
            kwargs = resolve(ex, cmd.kwargs) if cmd.kwargs else cmd.kwargs
            count = _elements(args, limit) + (_elements(kwargs, limit) if kwargs else 0)
            key = _UNSET
        if count > limit:
            return False
        expected = _expected(ex, op, cmd, args, key) if cmd.outs else _UNSET
    except Exception:  # noqa: BLE001 - whatever it is, the executor's run reports it
        return False
    if type(expected) is ops.Spec:  # one result of a known shape (nearly every op)
        count += math.prod(expected.shape)
    elif cmd.outs:
        for spec in expected if type(expected) is tuple else (expected,):
            # a data-dependent result (a mask's) holds at most what its operands hold
            count += math.prod(spec.shape) if type(spec) is ops.Spec else count
    if count > limit:
        return False
    ex.prepared = (cmd, args, kwargs, expected)  # for its run, next (the caller clears it)
    return True


_NEVER_QUICK = frozenset(("to_device",))  # a GPU's copy: on its own stream's thread


def _scan(table, cmd, by_type: bool) -> tuple | None:
    """A Call whose arguments are host arrays (by Ref) and plain values, its keywords plain
    values, walked once: (args, kwargs, their arrays' elements, what decides its results as
    _ufunc_key or _value_key would make it, by `by_type`); None for any other, which the
    general walks take (and which says what is wrong with a missing or poisoned input)."""
    args, count = [], 0
    parts: list = [cmd.op] if by_type else []
    for value in cmd.args:
        kind = type(value)
        if kind is wire.Ref:
            value = table.get(value.id)
            if type(value) is not np.ndarray:
                return None
            count += value.size
            parts.append((value.shape, value.dtype))
        elif kind in _PLAIN and (not by_type or kind in _SCALAR_TYPES):
            parts.append(kind if by_type else (kind, value))
        else:
            return None
        args.append(value)
    if by_type:
        return tuple(args), cmd.kwargs, count, tuple(parts)
    kwargs = cmd.kwargs
    if kwargs:
        named = []
        for name, value in kwargs.items():
            if type(value) not in _PLAIN:
                return None
            named.append((name, (type(value), value)))
        return tuple(args), kwargs, count, (cmd.op, tuple(parts), (dict, tuple(named)))
    return tuple(args), kwargs, count, (cmd.op, tuple(parts), None)


_PLAIN = frozenset((int, float, bool, complex, str, type(None)))


def _elements(value, limit: int) -> int:
    """The elements of the NumPy arrays in `value` (also in tuples, lists and dicts); past
    `limit`, or for any other array kind (torch, CuPy, a module), limit + 1."""
    kind = type(value)
    if kind is np.ndarray:
        return value.size
    if kind is tuple or kind is list:  # (an op's args: a loop, not a generator's calls)
        total = 0
        for v in value:
            total += v.size if type(v) is np.ndarray else _elements(v, limit)
        return total
    if kind is dict:
        return sum(_elements(v, limit) for v in value.values())
    if kind in _SCALAR_TYPES or kind is str or value is None or isinstance(value, np.generic):
        return 0
    return 0 if kind in (slice, bytes, type(Ellipsis)) else limit + 1

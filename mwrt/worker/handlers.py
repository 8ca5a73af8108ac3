"""One handler per stream command, named like the command (Call: call, WaitEvent: wait_event);
they run on stream executors."""

from __future__ import annotations

import math
import re
import sys
import time

import numpy as np

from .. import arrays, config, ops, staging
from ..protocol import wire
from . import cuda_events, fperrors, quotas
from .tensors import Poisoned, check_size, resolve, store


def create(ex, cmd, frames):
    xp, dtype, shape = ex.xp, np.dtype(cmd.dtype), tuple(cmd.shape)
    check_size(shape, dtype, "create", ex.session.tensors, ex.device)
    kind, args = cmd.kind, cmd.args
    if kind == "empty":  # freed memory may hold another session's bytes: never hand it out
        kind = "zeros"
    if kind in ("empty", "zeros", "ones"):
        value = getattr(xp, kind)(shape, dtype)
    elif kind == "full":
        value = xp.full(shape, args[0], dtype)
    elif kind == "arange":  # sized by its arguments, which the shape need not match
        check_size((_arange_length(*args),), dtype, "create", ex.session.tensors, ex.device)
        value = xp.arange(*args, dtype=dtype)
    elif kind == "eye":
        value = xp.eye(*shape, k=args[0], dtype=dtype)
    elif kind == "linspace":
        value = xp.linspace(args[0], args[1], shape[0], endpoint=args[2], dtype=dtype)
    elif kind in ("fftfreq", "rfftfreq"):
        value = getattr(xp.fft, kind)(args[0], args[1]).astype(dtype, copy=False)
    elif kind in ("rand", "randn"):
        rng = xp.random.default_rng(args[0])
        draw = rng.random if kind == "rand" else rng.standard_normal
        if dtype.kind == "f" and dtype.itemsize >= 4:
            value = draw(shape, dtype=dtype)
        else:
            value = draw(shape).astype(dtype)
    else:
        raise ValueError(f"create: unknown kind {kind!r} (known: empty zeros ones full arange "
                         "eye linspace fftfreq rfftfreq rand randn)")
    store(ex, cmd.out, value)


def _arange_length(start, stop=None, step=1) -> int:
    """How many elements np.arange(start, stop, step) makes, as NumPy counts them."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("create: arange's step must not be 0")
    return max(0, math.ceil((stop - start) / step))


def put(ex, cmd, frames):
    dtype, shape = np.dtype(cmd.dtype), tuple(cmd.shape)
    check_size(shape, dtype, "put", ex.session.tensors, ex.device)
    data = frames[cmd.frame]
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise ValueError(f"put: data frame has the wrong size (got {len(data)} bytes, expected "
                         f"{expected} for {dtype}{list(shape)})")
    host = np.frombuffer(data, dtype=dtype).reshape(shape)
    ex.bytes_in += expected
    if ex.device != arrays.HOST:  # through a pinned buffer of the pool, on this stream
        store(ex, cmd.out, staging.upload(ex.xp, host, ex.cuda_stream))
        return
    store(ex, cmd.out, ex.xp.array(host))  # copies: the frame's memory is read-only


def call(ex, cmd, frames):
    run_op(ex, ops.get(cmd.op), cmd)


def run_op(ex, op, cmd) -> None:
    """Run Call `cmd` of registry op `op` (looked up once by a replayed graph) under the
    master's floating-point error state, keeping the warnings NumPy noted for the master."""
    try:
        if cmd.fp is None:
            _run_op(ex, op, cmd)
        else:
            with np.errstate(**fperrors.modes(cmd.fp)):
                _run_op(ex, op, cmd)
    finally:
        if fperrors.NOTED:
            fperrors.claim(ex.warned, cmd.id, cmd.op, KEPT_WARNINGS)


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


def _expected(ex, op, cmd, args):
    """The results' Specs by the op's meta rule: the same rule on the same Specs as on the
    master, so what it announced, without the announcement riding in every command. An
    oversized host result is refused here, before it is made (a GPU's allocator names its
    own); the numpy op is sized by its allow-list entry before its rule probes NumPy.
    Remembered by what decides them (operands' shapes and dtypes, plain values): a sync
    loop's op pays one lookup, not the walk of its arguments."""
    table, host = ex.session.tensors, ex.device == arrays.HOST
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
        if kind in _SCALAR_TYPES or isinstance(value, np.generic):
            key.append(kind)
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
    try:  # (most ops have no keywords)
        return (name, _plain_key(args, table), _plain_key(kwargs, table) if kwargs else None)
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
        args, kwargs = resolve(ex, cmd.args), resolve(ex, cmd.kwargs)
        count = _elements(args, limit) + (_elements(kwargs, limit) if kwargs else 0)
        if count > limit:
            return False
        expected = _expected(ex, ops.get(cmd.op), cmd, args) if cmd.outs else _UNSET
    except Exception:  # noqa: BLE001 - whatever it is, the executor's run reports it
        return False
    if cmd.outs:
        for spec in expected if type(expected) is tuple else (expected,):
            # a data-dependent result (a mask's) holds at most what its operands hold
            count += math.prod(spec.shape) if type(spec) is ops.Spec else count
    if count > limit:
        return False
    ex.prepared = (cmd, args, kwargs, expected)  # for its run, next (the caller clears it)
    return True


_UNSET = object()  # no result Specs worked out yet


_NEVER_QUICK = frozenset(("to_device",))  # a GPU's copy: on its own stream's thread


def _elements(value, limit: int) -> int:
    """The elements of the NumPy arrays in `value` (also in tuples, lists and dicts); past
    `limit`, or for any other array kind (torch, CuPy, a module), limit + 1."""
    kind = type(value)
    if kind is np.ndarray:
        return value.size
    if kind is tuple or kind is list:
        return sum(_elements(v, limit) for v in value)
    if kind is dict:
        return sum(_elements(v, limit) for v in value.values())
    if kind in _SCALAR_TYPES or kind is str or value is None or isinstance(value, np.generic):
        return 0
    return 0 if kind in (slice, bytes, type(Ellipsis)) else limit + 1


def remote(ex, cmd, frames):
    fn = ex.session.load_function(cmd.fn)
    torch = sys.modules.get("torch")
    if torch is not None and ex.device != arrays.HOST and torch.cuda.is_available():
        ex.use_torch_stream()  # a function's torch kernels run on this stream too
    result = fn(*resolve(ex, cmd.args), **resolve(ex, cmd.kwargs))
    if len(cmd.outs) == 1:
        store(ex, cmd.outs[0], result)
    elif cmd.outs:
        if not isinstance(result, (tuple, list)) or len(result) != len(cmd.outs):
            raise ValueError(f"remote: function returned {type(result).__name__}, expected a "
                             f"tuple of {len(cmd.outs)} arrays (outputs={len(cmd.outs)})")
        for out, value in zip(cmd.outs, result):
            store(ex, out, value)


def free(ex, cmd, frames):
    ex.session.free(cmd.ids, cmd.uses)


def get(ex, cmd, frames):
    if ex.raise_sticky(cmd.token):
        return
    value = resolve(ex, wire.Ref(cmd.ref))
    if type(value) is not np.ndarray:  # on a GPU: through a pinned buffer, on this stream
        host = staging.download(value, ex.cuda_stream)
    else:
        host = np.asarray(value, order="C")
    ex.reply(wire.Data(token=cmd.token, shape=host.shape, dtype=host.dtype.str),
             [host.reshape(-1).view(np.uint8)])
    ex.bytes_out += host.nbytes


def share(ex, cmd, frames):
    if ex.raise_sticky(cmd.token):
        return
    value = resolve(ex, wire.Ref(cmd.ref))
    if type(value) is not np.ndarray:  # on a GPU: through a pinned buffer, on this stream
        value = staging.download(value, ex.cuda_stream)
    name = ex.session.share(value)
    ex.reply(wire.Done(token=cmd.token, value={"name": name, "shape": value.shape,
                                               "dtype": value.dtype.str}))
    ex.bytes_out += value.nbytes


def meta(ex, cmd, frames):
    if ex.raise_sticky(cmd.token):
        return
    value = resolve(ex, wire.Ref(cmd.ref))
    if type(value) is np.ndarray and value.nbytes <= ex.session.daemon.inline_bytes:
        # A data-dependent result is asked its shape to be read next: its bytes come too,
        # so the read costs no second round trip.
        get(ex, cmd, frames)
        return
    if not isinstance(value.dtype, np.dtype):  # a torch tensor: torch's metadata
        ex.reply(wire.Done(token=cmd.token, value={
            "shape": tuple(value.shape), "dtype": str(value.dtype), "stride": value.stride(),
            "requires_grad": value.requires_grad, "leaf": value.is_leaf}))
        return
    ex.reply(wire.Done(token=cmd.token, value={"shape": value.shape, "dtype": value.dtype.str}))


def sync(ex, cmd, frames):
    ex.synchronize_device()
    if not ex.raise_sticky(cmd.token):
        ex.reply(wire.Done(token=cmd.token, value=None))


def record(ex, cmd, frames):
    if ex.device != arrays.HOST:  # a CUDA event; it fires once the GPU passed it
        cuda_events.record(ex, cmd)
        return
    if cmd.event <= wire.IMPLICIT_EVENTS:  # safe streams, graphs: one waiter, this node
        ex.session.implicit.record(cmd.event)
        return
    ex.session.fire_event(cmd.event, time.time(), ex.send)


def wait_event(ex, cmd, frames):
    if cmd.event <= wire.IMPLICIT_EVENTS:
        ex.session.implicit.wait(cmd.event, config.get("sync_timeout"))
        cuda_events.wait_implicit(ex, cmd.event)
        return
    if ex.session.fired_time(cmd.event) is not None:  # fired for good: nothing to wait on
        return
    state = ex.session.event(cmd.event)
    # A GPU stream needs the record issued (by a GPU stream of this worker: then it waits on
    # the GPU, stream.wait_event; otherwise recorded means fired); a host stream, the firing.
    gpu = ex.device != arrays.HOST
    if not _await(ex, state.recorded if gpu else state.fired, cmd.event):
        return
    if state.error:
        raise RuntimeError(f"wait_event: event {cmd.event} will never fire: {state.error}")
    if gpu:
        cuda_events.wait_local(ex, state)


def _await(ex, flag, event: int) -> bool:
    """Wait for `flag` (MWRT_SYNC_TIMEOUT); False if the session closed meanwhile."""
    timeout = config.get("sync_timeout")
    deadline = time.monotonic() + timeout
    while not flag.wait(0.2):
        if ex.session.closed:
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"wait_event: event {event} was not recorded after "
                               f"{timeout} s (MWRT_SYNC_TIMEOUT); did its stream fail?")
    return True


def expect(ex, cmd, frames):
    if cmd.ref not in ex.session.tensors:
        raise RuntimeError(
            f"tensor {cmd.ref} was made on stream {cmd.made_on} and is not finished; order the "
            f"streams with an event (stream.wait_stream(), event.wait()), or leave "
            "MWRT_STREAM_ORDER unset (and Stream(order='safe')) to order them automatically")


def explain(ex, exc: BaseException) -> tuple[str, str]:
    """An error's type and message for its report; a GPU out of memory is named for users."""
    if ex.device == arrays.HOST or not isinstance(exc, MemoryError):
        return type(exc).__name__, str(exc)
    wanted = re.search(r"allocating ([\d,]+) bytes", str(exc))
    size = _bytes(int(wanted.group(1).replace(",", ""))) if wanted else "memory"
    try:
        with ex.xp.cuda.Device(ex.device):
            free, total = ex.xp.cuda.runtime.memGetInfo()
        room = f" (free {_bytes(free)} of {_bytes(total)})"
    except Exception:  # noqa: BLE001 - the report goes on without the figures
        room = ""
    return type(exc).__name__, (f"node {ex.session.node} GPU {ex.device}: out of memory "
                                f"allocating {size}{room}; free tensors or use another device")


def _bytes(n: int) -> str:
    """A byte count as people read it: 1.0 GiB, 512 MiB, 64 KiB, 12 B."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.1f} {unit}" if unit == "GiB" else f"{value:.0f} {unit}"
    return f"{n} B"


def op_name(command) -> str:
    """The op a command runs, for error reports."""
    if isinstance(command, wire.Call):
        return command.op
    if isinstance(command, wire.Create):
        return command.kind
    return type(command).__name__.lower()


def arg_shapes(ex, command) -> list:
    """Shapes of a command's tensor arguments that still exist, for error reports."""
    args = getattr(command, "args", ())
    shapes = []
    for value in args if isinstance(args, tuple) else ():
        if isinstance(value, wire.Ref):
            found = ex.session.tensors.get(value.id)
            shapes.append(list(getattr(found, "shape", ())) if found is not None else None)
    return shapes


def poison(ex, command, info: dict) -> None:
    """Mark what a failed or skipped command would have made."""
    outs = getattr(command, "outs", None)
    if outs is None:
        out = getattr(command, "out", None)
        outs = () if out is None else (out,)
    for out in outs:
        ex.session.tensors[out] = Poisoned(info)

"""The stream commands' handlers, each named like its command (WaitEvent: wait_event), run on
stream executors, and how a failed command is reported; Call's are in calls.py, the data
channel's in data_commands.py, the checkpoint files' in checkpoint_files.py (routes.py lists
them all)."""

from __future__ import annotations

import math
import os
import re
import sys
import time
from types import SimpleNamespace

import numpy as np

from .. import arrays, config, staging
from ..netaddr import host_identity
from ..protocol import values, wire
from . import cuda_events
from .tensors import Poisoned, check_size, keep, meta_answer, resolve, store


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
    if not ex.raise_sticky(cmd.token):
        answer_value(ex, resolve(ex, wire.Ref(cmd.ref)), cmd.token)


def answer_value(ex, value, token: int) -> None:
    """Answer `token` with array `value`'s bytes (a Get's, a CallGet's answer)."""
    if type(value) is not np.ndarray:  # on a GPU: through a pinned buffer, on this stream
        host = staging.download(value, ex.cuda_stream)
    else:
        host = np.asarray(value, order="C")
    # Counted before the answer leaves: a master that reads the totals after it sees them.
    ex.bytes_out += host.nbytes
    # A small value's bytes copied cost less than a flat uint8 view of it (0.1 us, 0.8 us).
    data = host.tobytes() if host.nbytes <= _COPIED_BYTES else host.reshape(-1).view(np.uint8)
    ex.reply(wire.Data(token=token, shape=host.shape, dtype=values.dtype_str(host.dtype)),
             [data])


_COPIED_BYTES = 4096


def share(ex, cmd, frames):
    if ex.raise_sticky(cmd.token):
        return
    value = resolve(ex, wire.Ref(cmd.ref))
    if type(value) is not np.ndarray:  # on a GPU: through a pinned buffer, on this stream
        value = staging.download(value, ex.cuda_stream)
    name = ex.session.share(value)
    ex.bytes_out += value.nbytes  # before the answer, as answer_value counts
    ex.reply(wire.Done(token=cmd.token, value={"name": name, "shape": value.shape,
                                               "dtype": value.dtype.str}))


def lend(ex, cmd, frames):
    if ex.raise_sticky(cmd.token):
        return
    value = resolve(ex, wire.Ref(cmd.ref))
    # On a GPU, torch's, or a strided view (whose copy the socket thread, which may run
    # this, must not make): the master reads it by SendTo instead.
    if type(value) is not np.ndarray or not value.flags.c_contiguous:
        ex.reply(wire.Done(token=cmd.token, value=None))
        return
    ex.session.lend(cmd.id, value)
    ex.bytes_out += value.nbytes  # before the answer, as answer_value counts
    ex.reply(wire.Done(token=cmd.token, value={
        "pid": os.getpid(), "address": value.ctypes.data, "nbytes": value.nbytes,
        "where": host_identity()}))


def unlend(ex, cmd, frames):
    ex.session.unlend(cmd.lend)


def meta(ex, cmd, frames):
    if ex.session.tensors.answered(cmd.ref, cmd.token):  # once its tensor was made
        return
    if ex.raise_sticky(cmd.token):
        return
    value = resolve(ex, wire.Ref(cmd.ref))
    if type(value) is np.ndarray and value.nbytes <= ex.session.daemon.inline_bytes:
        # A data-dependent result is asked its shape to be read next: its bytes come too,
        # so the read costs no second round trip.
        get(ex, cmd, frames)
        return
    ex.reply(meta_answer(value, cmd.token))


def layout(ex, cmd, frames):
    if ex.raise_sticky(cmd.token):
        return
    value = resolve(ex, wire.Ref(cmd.ref))
    flags = value.flags if type(value) is np.ndarray else _gpu_flags(value.flags)
    ex.reply(wire.Done(token=cmd.token, value={"strides": tuple(value.strides), "flags": {
        name: bool(getattr(flags, name)) for name in (
            "c_contiguous", "f_contiguous", "owndata", "writeable", "aligned",
            "writebackifcopy", "fnc", "forc", "behaved", "carray", "farray")}}))


def _gpu_flags(flags) -> SimpleNamespace:
    """NumPy's flags of a CuPy array, whose own say only c_contiguous, f_contiguous and
    owndata: its memory is writeable and aligned, and never a writeback copy."""
    c, f = flags.c_contiguous, flags.f_contiguous
    return SimpleNamespace(c_contiguous=c, f_contiguous=f, owndata=flags.owndata,
                           writeable=True, aligned=True, writebackifcopy=False,
                           fnc=f and not c, forc=f or c, behaved=True, carray=c,
                           farray=not c)


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
    if isinstance(exc, SystemExit):
        return "SystemExit", (f"the function called sys.exit({exc.code!r}), which ends no "
                              "worker: return a value, or raise an exception")
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
        keep(ex, out, Poisoned(info))

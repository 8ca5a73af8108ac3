"""The command and reply format: one frozen dataclass per message, msgpack-encoded.

A message is a ZeroMQ multipart: [header, body, *data frames]. The header is
(MAGIC, VERSION, batch sequence); the body a list of messages, each `[code, *fields]`.
Array bytes ride in the data frames (or on a data channel), never inside the body.
Decoding builds plain values and these dataclasses only; it never runs code.
Lists arrive as tuples: a list index must be sent as an array.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import msgpack
import numpy as np

from ..errors import WireError
from .messages import *  # noqa: F403  (the message classes, reached as wire.Call etc.)
from .messages import MESSAGES

_ARRAY_DTYPE = re.compile(r"[<>|=][biufcSUmM]\d{1,3}(\[\w+\])?\Z")

CODES = {cls: code for code, cls in enumerate(MESSAGES)}
_FIELDS = [tuple(f.name for f in dataclasses.fields(cls)) for cls in MESSAGES]
# Codes of the messages that run on a stream: their fields start (id, stream, ...).
STREAM_CODES = frozenset(c for c, names in enumerate(_FIELDS) if names[1:2] == ("stream",))
_TYPES = {"int": int, "str": str, "tuple": tuple, "dict": dict, "bool": bool, "bytes": bytes,
          "float": (int, float), "object": object}
# What each field must decode to: a command with a dict for a stream id is refused here,
# not deep inside a handler.
_FIELD_TYPES = [tuple(_TYPES[f.type] for f in dataclasses.fields(cls)) for cls in MESSAGES]

MAGIC = b"mwrt"
VERSION = 1

# msgpack extension codes for values that plain msgpack cannot carry.
EXT_REF, EXT_SLICE, EXT_ELLIPSIS, EXT_ARRAY, EXT_COMPLEX = 1, 2, 3, 4, 5


@dataclass(frozen=True)
class Ref:
    """A tensor named by its session-wide id."""

    id: int



# -- values ---------------------------------------------------------------------------------

def _default(value):
    if isinstance(value, Ref):
        return msgpack.ExtType(EXT_REF, value.id.to_bytes(8, "little", signed=True))
    if isinstance(value, slice):
        return msgpack.ExtType(EXT_SLICE, _pack((value.start, value.stop, value.step)))
    if value is Ellipsis:
        return msgpack.ExtType(EXT_ELLIPSIS, b"")
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise WireError(f"wire: object arrays cannot be sent (got dtype {value.dtype})")
        arr = np.ascontiguousarray(value)
        return msgpack.ExtType(EXT_ARRAY, _pack((arr.dtype.str, arr.shape, arr.tobytes())))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, complex):
        return msgpack.ExtType(EXT_COMPLEX, _pack((value.real, value.imag)))
    if isinstance(value, np.dtype):
        return value.str
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).str
    raise WireError(f"wire: cannot encode a {type(value).__name__} (got {value!r:.60})")


def _ext_hook(code, data):
    if code == EXT_REF:
        return Ref(int.from_bytes(data, "little", signed=True))
    if code == EXT_SLICE:
        return slice(*_unpack(data))
    if code == EXT_ELLIPSIS:
        return Ellipsis
    if code == EXT_ARRAY:
        dtype, shape, raw = _unpack(data)
        # Only the canonical form a sender writes (dtype.str): not object arrays, nor the
        # aliases np.dtype would also take (some deprecated, some not numbers at all).
        if not isinstance(dtype, str) or not _ARRAY_DTYPE.match(dtype):
            raise WireError(f"wire: arrays need a dtype like '<f4' (got {dtype!r:.40})")
        dt = np.dtype(dtype)
        return np.frombuffer(raw, dtype=dt).reshape(shape).copy()
    if code == EXT_COMPLEX:
        return complex(*_unpack(data))
    raise WireError(f"wire: unknown extension type {code}")


def _pack(value) -> bytes:
    return msgpack.packb(value, default=_default, use_bin_type=True, strict_types=False)


def _unpack(data):
    return msgpack.unpackb(data, ext_hook=_ext_hook, use_list=False, raw=False,
                           strict_map_key=False)


def ref(tensor_id: int) -> msgpack.ExtType:
    """A tensor reference already in wire form (the master builds one per tensor)."""
    return msgpack.ExtType(EXT_REF, tensor_id.to_bytes(8, "little", signed=True))


# -- messages -------------------------------------------------------------------------------

def encode_header(seq: int) -> bytes:
    """The first frame of every message."""
    return _pack((MAGIC, VERSION, seq))


def decode_header(frame) -> int:
    """Check magic and version of a header frame; return its batch sequence number."""
    try:
        magic, version, seq = _unpack(frame)
    except Exception as exc:
        raise WireError(f"wire: malformed header ({type(exc).__name__}: {exc})") from None
    if type(magic) is not bytes or magic != MAGIC:
        raise WireError(f"wire: not an mwrt message (got magic {magic!r}, expected {MAGIC!r})")
    if type(version) is not int or version != VERSION:
        raise WireError(f"wire: protocol version mismatch (got {version}, expected {VERSION}); "
                        "run the same mwrt version on master and workers")
    if not isinstance(seq, int):
        raise WireError(f"wire: batch sequence must be an int (got {type(seq).__name__})")
    return seq


def encode_body(messages) -> bytes:
    """Pack a list of messages into one frame."""
    return _pack([(CODES[type(m)], *(getattr(m, f) for f in _FIELDS[CODES[type(m)]]))
                  for m in messages])


def encode_raw(rows) -> bytes:
    """Pack rows already in `[code, *fields]` form (the master's fast path)."""
    return _pack(rows)


def decode_body(frame, max_bytes: int | None = None) -> list:
    """Unpack a body frame into message dataclasses; any malformation is a WireError."""
    if max_bytes is not None and len(frame) > max_bytes:
        raise WireError(f"wire: command frame too large (got {len(frame)} bytes, "
                        f"limit {max_bytes}; MWRT_MAX_FRAME_BYTES)")
    try:
        rows = _unpack(frame)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"wire: malformed body ({type(exc).__name__}: {exc})") from None
    if not isinstance(rows, tuple):
        raise WireError(f"wire: body must be a list of messages (got {type(rows).__name__})")
    return [_build(row) for row in rows]


def _build(row):
    if not isinstance(row, tuple) or not row or not isinstance(row[0], int):
        raise WireError(f"wire: a message must be [code, *fields] (got {row!r:.80})")
    code = row[0]
    if not 0 <= code < len(MESSAGES):
        raise WireError(f"wire: unknown message code {code} (known: 0..{len(MESSAGES) - 1})")
    cls, names = MESSAGES[code], _FIELDS[code]
    if len(row) - 1 != len(names):
        raise WireError(f"wire: {cls.__name__} takes {len(names)} fields "
                        f"(got {len(row) - 1})")
    for value, kind, name in zip(row[1:], _FIELD_TYPES[code], names):
        if not isinstance(value, kind):
            raise WireError(f"wire: {cls.__name__}.{name} has the wrong type (got "
                            f"{type(value).__name__}, expected {getattr(kind, '__name__', kind)})")
    return cls(*row[1:])


def send(sock, identity, message, frames=()) -> None:
    """Send one message (after a routing identity, if given); array frames go zero-copy."""
    parts = [encode_header(0), encode_body([message]), *frames]
    if identity is not None:
        parts.insert(0, identity)
    # pyzmq's zero-copy path costs tens of µs per frame: only worth it for big payloads.
    sock.send_multipart(parts, copy=not frames or sum(len(memoryview(f)) for f in frames)
                        < ZERO_COPY_BYTES)


ZERO_COPY_BYTES = 1 << 16


def code(cls) -> int:
    """The wire code of message class `cls`."""
    return CODES[cls]

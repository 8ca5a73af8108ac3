"""The command and reply format: the messages of messages.py, msgpack-encoded.

A message is a ZeroMQ multipart: [header, body, *data frames]. The header is
(MAGIC, VERSION, batch sequence); the body a list of messages, each `[code, *fields]`.
Array bytes ride in the data frames (or on a data channel), never inside the body.
Encoding is msgspec's (a message Struct packs itself); decoding is msgpack's, into plain
values and the message classes only, after checking every field's type: it never runs
code. Lists arrive as tuples: a list index must be sent as an array. NumPy scalars
(np.int64(100), np.float32(0.5)) and 0-d arrays travel typed, so the worker promotes them as
NumPy does (NEP 50: NumPy scalars are typed, Python scalars weak).
"""

from __future__ import annotations

import re

import msgpack
import msgspec
import numpy as np
import zmq

from .. import config
from ..errors import WireError
from .messages import *  # noqa: F403  (the message classes and constants, as wire.Call etc.)
from .messages import MESSAGES

_ARRAY_DTYPE = re.compile(r"[<>|=][biufcSUmM]\d{1,3}(\[\w+\])?\Z")

_FIELDS = [cls.__struct_fields__ for cls in MESSAGES]
# What each field must decode to: a command with a dict for a stream id is refused here,
# not deep inside a handler.
_TYPES = {float: (int, float)}
_FIELD_TYPES = [tuple(_TYPES.get(f.type, f.type) for f in msgspec.structs.fields(cls))
                for cls in MESSAGES]

MAGIC = b"mwrt"
VERSION = 1

# msgpack extension codes for values that plain msgpack cannot carry.
EXT_REF, EXT_SLICE, EXT_ELLIPSIS, EXT_ARRAY, EXT_COMPLEX, EXT_SCALAR = 1, 2, 3, 4, 5, 6


class Ref:
    """A tensor named by its session-wide id.

    A plain class, not a dataclass: msgspec would pack a dataclass as a map by itself, and a
    Ref must travel as its extension type.
    """

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id

    def __eq__(self, other):
        return type(other) is Ref and other.id == self.id

    def __hash__(self):
        return hash((Ref, self.id))

    def __repr__(self):
        return f"Ref(id={self.id})"



# -- values ---------------------------------------------------------------------------------

def _default(value):
    if isinstance(value, Ref):
        return ref(value.id)
    if isinstance(value, slice):
        return _Ext(EXT_SLICE, _pack((value.start, value.stop, value.step)))
    if value is Ellipsis:
        return _Ext(EXT_ELLIPSIS, b"")
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise WireError(f"wire: object arrays cannot be sent (got dtype {value.dtype})")
        # tobytes() is C order whatever the layout (ascontiguousarray would make a 0-d 1-d)
        return _Ext(EXT_ARRAY, _pack((value.dtype.str, value.shape, value.tobytes())))
    if isinstance(value, np.generic):
        if value.dtype.hasobject or value.dtype.kind == "V":
            raise WireError(f"wire: cannot encode a NumPy {value.dtype} scalar")
        return _Ext(EXT_SCALAR, _pack((value.dtype.str, value.tobytes())))
    if isinstance(value, complex):
        return _Ext(EXT_COMPLEX, _pack((value.real, value.imag)))
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
        return np.frombuffer(raw, dtype=_dtype(dtype)).reshape(shape).copy()
    if code == EXT_SCALAR:
        dtype, raw = _unpack(data)
        dt = _dtype(dtype)
        if not isinstance(raw, bytes) or len(raw) != dt.itemsize:
            raise WireError(f"wire: a {dt} scalar needs {dt.itemsize} bytes (got "
                            f"{len(raw) if isinstance(raw, bytes) else type(raw).__name__})")
        return np.frombuffer(raw, dtype=dt)[0]
    if code == EXT_COMPLEX:
        return complex(*_unpack(data))
    raise WireError(f"wire: unknown extension type {code}")


def _dtype(dtype) -> np.dtype:
    # Only the canonical form a sender writes (dtype.str): not object arrays, nor the
    # aliases np.dtype would also take (some deprecated, some not numbers at all).
    if not isinstance(dtype, str) or not _ARRAY_DTYPE.match(dtype):
        raise WireError(f"wire: arrays need a dtype like '<f4' (got {dtype!r:.40})")
    return np.dtype(dtype)


_Ext = msgspec.msgpack.Ext
# One encoder for every thread: each call keeps its state on its own stack.
_pack = msgspec.msgpack.Encoder(enc_hook=_default).encode


def _unpack(data):
    return msgpack.unpackb(data, ext_hook=_ext_hook, use_list=False, raw=False,
                           strict_map_key=False)


def ref(tensor_id: int) -> msgspec.msgpack.Ext:
    """A tensor reference already in wire form (the master builds one per tensor)."""
    return _Ext(EXT_REF, tensor_id.to_bytes(8, "little", signed=True))


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


def encode_body(messages: list) -> bytes:
    """Pack a list of messages into one frame."""
    return _pack(messages)


def encode_message(message) -> bytes:
    """One message's bytes, to be queued as msgspec.Raw in batches (the same bytes for
    every node of a mesh op)."""
    return _pack(message)


def decode_body(frame, max_bytes: int | None = None) -> list:
    """Unpack a body frame into messages; any malformation is a WireError."""
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


def iter_body(frame, max_bytes: int | None = None):
    """decode_body one message at a time, each a short call: a thread decoding a long body
    beside a busy one can let it run between messages."""
    if max_bytes is not None and len(frame) > max_bytes:
        raise WireError(f"wire: command frame too large (got {len(frame)} bytes, "
                        f"limit {max_bytes}; MWRT_MAX_FRAME_BYTES)")
    unpacker = msgpack.Unpacker(ext_hook=_ext_hook, use_list=False, raw=False,
                                strict_map_key=False, max_buffer_size=max(len(frame), 1))
    try:
        unpacker.feed(frame)
        count = unpacker.read_array_header()
    except Exception as exc:
        raise WireError(f"wire: body must be a list of messages ({type(exc).__name__}: "
                        f"{exc})") from None
    for _ in range(count):
        try:
            row = unpacker.unpack()
        except WireError:
            raise
        except Exception as exc:
            raise WireError(f"wire: malformed body ({type(exc).__name__}: {exc})") from None
        yield _build(row)
    if unpacker.tell() != len(frame):
        raise WireError(f"wire: {len(frame) - unpacker.tell()} bytes after the last message")


def _build(row):
    if not isinstance(row, tuple) or not row or not isinstance(row[0], int):
        raise WireError(f"wire: a message must be [code, *fields] (got {row!r:.80})")
    number = row[0]
    if not 0 <= number < len(MESSAGES):
        raise WireError(f"wire: unknown message code {number} (known: 0..{len(MESSAGES) - 1})")
    cls, names = MESSAGES[number], _FIELDS[number]
    if len(row) - 1 != len(names):
        raise WireError(f"wire: {cls.__name__} takes {len(names)} fields "
                        f"(got {len(row) - 1})")
    for value, kind, name in zip(row[1:], _FIELD_TYPES[number], names):
        if not isinstance(value, kind):
            raise WireError(f"wire: {cls.__name__}.{name} has the wrong type (got "
                            f"{type(value).__name__}, expected {getattr(kind, '__name__', kind)})")
    return cls(*row[1:])


def rides_inline(nbytes: int) -> bool:
    """Whether an array of `nbytes` rides beside its command (else over the data channel)."""
    return nbytes <= config.get("inline_bytes")


def send(sock, identity, message, frames=()) -> None:
    """Send one message (after a routing identity, if given); array frames go zero-copy."""
    copy = not frames or sum(len(memoryview(f)) for f in frames) < ZERO_COPY_BYTES
    if copy and frames:  # pyzmq sends a non-bytes buffer zero-copy anyway (+40 µs a round trip)
        frames = [f if type(f) is bytes else bytes(memoryview(f)) for f in frames]
    parts = [_HEADER_0, encode_body([message]), *frames]
    if identity is not None:
        parts.insert(0, identity)
    # pyzmq's zero-copy path costs tens of µs per frame: only worth it for big payloads.
    if copy:
        send_parts(sock, parts)
    else:
        sock.send_multipart(parts, copy=False)


_MORE, _RCVMORE = int(zmq.SNDMORE), int(zmq.RCVMORE)


def send_parts(sock, parts: list) -> None:
    """sock.send_multipart(parts) of small frames, copied, without the flag objects pyzmq
    makes per frame (a few µs of every round trip)."""
    last = len(parts) - 1
    for i, part in enumerate(parts):
        sock.send(part, _MORE if i < last else 0)


def recv_parts(sock) -> list:
    """sock.recv_multipart() as bytes, without the flag objects pyzmq makes per frame."""
    parts = [sock.recv()]
    while sock.get(_RCVMORE):
        parts.append(sock.recv())
    return parts


ZERO_COPY_BYTES = 1 << 16
_HEADER_0 = encode_header(0)  # every reply's header: encoded once

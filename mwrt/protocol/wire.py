"""The command and reply format: the messages of messages.py, as MessagePack (msgspec).

A message is one ZeroMQ frame (after a ROUTER's routing identity): an envelope, a fixed
prefix (MAGIC, VERSION, batch sequence, the body's length and each inline data frame's),
then the body, a list of messages each `[code, *fields]`, then the inline data frames.
Array bytes ride in the data frames (large ones as frames of their own, sent zero-copy; or
on a data channel), never inside the body.
Both ways are msgspec's: a message Struct packs itself, and a body decodes straight into the
message classes, each field's type checked as it is read (a body that fails that check is
read again as plain values, to name what is wrong). Decoding never runs code. The values
inside messages travel as values.py packs them: lists arrive as tuples, at any depth (a
list index must be sent as an array); NumPy scalars (np.int64(100), np.float32(0.5)) and
0-d arrays travel typed, so the worker promotes them as NumPy does (NEP 50: NumPy scalars
are typed, Python scalars weak).
"""

from __future__ import annotations

import struct
from operator import attrgetter
from typing import Any, Union, get_origin

import msgspec
import zmq

from .. import config
from ..errors import WireError
from .messages import *  # noqa: F403  (the message classes and constants, as wire.Call etc.)
from .messages import MESSAGES
from .values import EXT_ARRAY as EXT_ARRAY  # the value encoding's names, as wire.NAME
from .values import EXT_COMPLEX as EXT_COMPLEX
from .values import EXT_ELLIPSIS as EXT_ELLIPSIS
from .values import EXT_REF as EXT_REF
from .values import EXT_SCALAR as EXT_SCALAR
from .values import EXT_SLICE as EXT_SLICE
from .values import NESTED as _NESTED
from .values import Ref as Ref
from .values import ext_hook as _ext_hook
from .values import mapping as _mapping
from .values import pack as _pack
from .values import ref as ref
from .values import sequence as _sequence
from .values import tuples as _tuples
from .values import unpack as _unpack

_FIELDS = [cls.__struct_fields__ for cls in MESSAGES]
# What each field must decode to: a command with a dict for a stream id is refused here,
# not deep inside a handler.
_TYPES = {float: (int, float), dict | None: (dict, type(None))}
_FIELD_TYPES = [tuple(_TYPES.get(f.type, get_origin(f.type) or f.type)
                      for f in msgspec.structs.fields(cls)) for cls in MESSAGES]

MAGIC = b"mwrt"
VERSION = 2
# The envelope's prefix: magic, version, inline data frames, body bytes, batch sequence.
# One frame per message, where version 1 had a header frame, a body frame and a frame per
# array: each ZeroMQ frame costs a call and a check of RCVMORE on both sides.
_PREFIX = struct.Struct("<5sBIq")
_HEAD = MAGIC + bytes((VERSION,))  # magic and version, packed and compared as one field
_OLD_HEADER = b"\x93\xc4\x04" + MAGIC  # version 1's header frame: a msgpack [MAGIC, version, seq]

# Any one message class, by the code in its first field (a Union made at run time: no type
# for mypy to read, so it is Any to it).
_MESSAGE: Any = Union[tuple(MESSAGES)]  # noqa: UP007 - a Union of a tuple of types needs the name
_messages = msgspec.msgpack.Decoder(list[_MESSAGE], ext_hook=_ext_hook).decode
_message = msgspec.msgpack.Decoder(_MESSAGE, ext_hook=_ext_hook).decode
_rows = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode  # a body's messages, not read yet

# -- messages -------------------------------------------------------------------------------

def envelope(seq: int, body, data=()) -> bytes:
    """A message's one frame: the prefix, `body` (encode_body's) and the `data` frames."""
    if not data:
        return _PREFIX.pack(_HEAD, 0, len(body), seq) + body
    if len(data) == 1:  # a small read's reply: the prefix and the frame's length at once
        return b"".join((_PREFIX_ONE.pack(_HEAD, 1, len(body), seq,
                                          memoryview(data[0]).nbytes), body, data[0]))
    if len(data) > 255:
        raise WireError(f"wire: a message carries at most 255 inline data frames (got "
                        f"{len(data)}); send the arrays in several batches")
    sizes = [memoryview(frame).nbytes for frame in data]
    return b"".join([_PREFIX.pack(_HEAD, len(data), len(body), seq),
                     _sizes(len(data)).pack(*sizes), body, *data])


def open_envelope(frames, max_bytes: int | None = None) -> tuple[int, memoryview, list]:
    """(batch sequence, body, data frames) of a message's frames (its routing identity
    taken off): the envelope's inline frames, then the frames sent on their own."""
    first = frames[0] if frames else b""
    try:
        head, count, size, seq = _unprefix(first)
    except (struct.error, TypeError):
        raise WireError(_stranger(first)) from None
    if head != _HEAD:
        raise WireError(_stranger(first))
    if max_bytes is not None and size > max_bytes:
        _check_size(size, max_bytes)
    view = memoryview(first)
    if count == 0:  # a command's batch, most replies
        if _PREFIX_BYTES + size != len(first):
            raise _unequal(len(first), _PREFIX_BYTES + size)
        return seq, view[_PREFIX_BYTES:], frames[1:]
    if count == 1 and len(first) >= _ONE_BYTES:  # a small read's reply
        end = _ONE_BYTES + size
        if end + _one_size(first, _PREFIX_BYTES)[0] != len(first):
            raise _unequal(len(first), end + _one_size(first, _PREFIX_BYTES)[0])
        return seq, view[_ONE_BYTES:end], [view[end:], *frames[1:]]
    start = _PREFIX_BYTES + 4 * count
    if start + size > len(first):
        raise _unequal(len(first), start + size)
    end = start + size
    data = []
    for length in _sizes(count).unpack_from(first, _PREFIX_BYTES):
        data.append(view[end:end + length])
        end += length
    if end != len(first):
        raise _unequal(len(first), end)
    return seq, view[start:start + size], data + frames[1:]


def _unequal(got: int, said: int) -> WireError:
    return WireError(f"wire: a message's envelope does not add up (got {got} bytes, its "
                     f"prefix says {said})")


_unprefix, _PREFIX_BYTES = _PREFIX.unpack_from, _PREFIX.size
_PREFIX_ONE = struct.Struct(_PREFIX.format + "I")  # the prefix, one inline frame's length
_ONE_BYTES = _PREFIX_ONE.size
_SIZES = [struct.Struct(f"<{n}I") for n in range(4)]
_one_size = _SIZES[1].unpack_from


def _sizes(count: int) -> struct.Struct:
    """The struct of `count` frame lengths (uint32)."""
    return _SIZES[count] if count < len(_SIZES) else struct.Struct(f"<{count}I")


def _stranger(first) -> str:
    """What is wrong with a frame that does not open with this version's prefix."""
    head = bytes(first[:8]) if isinstance(first, (bytes, memoryview)) else b""
    if head[:7] == _OLD_HEADER and len(head) == 8:
        return (f"wire: protocol version mismatch (got {head[7]}, expected {VERSION}); run the "
                "same mwrt version on master and workers")
    if len(head) >= 5 and head[:4] == MAGIC:
        return (f"wire: protocol version mismatch (got {head[4]}, expected {VERSION}); run the "
                "same mwrt version on master and workers")
    return f"wire: not an mwrt message (got {head!r:.40}, expected it to open with {MAGIC!r})"


def encode(seq: int, messages: list, data=()) -> list[bytes]:
    """The frames of one message of `messages` (what send_parts sends)."""
    return [envelope(seq, encode_body(messages), data)]


def decode(frames, max_bytes: int | None = None) -> tuple[int, list, list]:
    """(batch sequence, messages, data frames) of a message's frames; a WireError if bad."""
    seq, body, data = open_envelope(frames, max_bytes)
    return seq, decode_body(body), data


def encode_body(messages: list) -> bytes:
    """Pack a list of messages into one frame."""
    return _pack(messages)


def encode_message(message) -> bytes:
    """One message's bytes, to be queued as msgspec.Raw in batches (the same bytes for
    every node of a mesh op)."""
    return _pack(message)


def decode_body(frame, max_bytes: int | None = None) -> list:
    """Unpack a body frame into messages; any malformation is a WireError."""
    if max_bytes is not None:
        _check_size(len(frame), max_bytes)
    # Each message with the lists in its bare tuple, dict and object fields as tuples
    # (msgspec gives arrays as lists wherever a field's type does not say tuple).
    try:
        return [message if (settle := _SETTLE.get(type(message))) is None else
                settle(message) for message in _messages(frame)]
    except WireError:  # an extension's own check
        raise
    except Exception:  # noqa: BLE001 - not well-typed messages: read again to say what is wrong
        rows = _read_again(frame)
    if not isinstance(rows, tuple):
        raise WireError(f"wire: body must be a list of messages (got {type(rows).__name__})")
    return [_build(row) for row in rows]


def iter_body(frame, max_bytes: int | None = None):
    """decode_body a few messages at a time, each few a short call: a thread decoding a long
    body beside a busy one can let it run between them."""
    _check_size(len(frame), max_bytes)
    try:
        rows = _rows(frame)  # where each message lies: one quick pass in C, nothing decoded
    except Exception as exc:  # noqa: BLE001 - whatever msgspec finds wrong with the frame
        raise WireError(f"wire: body must be a list of messages ({type(exc).__name__}: "
                        f"{exc})") from None
    for start in range(0, len(rows), _CHUNK):
        part = rows[start:start + _CHUNK]
        yield from decode_body(_ARRAY16.pack(0xDC, len(part)) + b"".join(part))


_CHUNK = 64  # messages per call of iter_body's decoder
_ARRAY16 = struct.Struct(">BH")  # a MessagePack array header (array 16) for `_CHUNK` of them


def _read_again(data):
    """`data` as plain values (arrays as tuples), for _build to say what is wrong with it."""
    try:
        return _unpack(data)
    except WireError:
        raise
    except Exception as exc:  # noqa: BLE001 - garbage, truncation, too deep: the sender's
        raise WireError(f"wire: malformed body ({type(exc).__name__}: {exc})") from None


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
        # (a bool is an int here, but not a stream's id: a worker starts a thread per id)
        if not isinstance(value, kind) or (name == "stream" and type(value) is bool):
            raise WireError(f"wire: {cls.__name__}.{name} has the wrong type (got "
                            f"{type(value).__name__}, expected {getattr(kind, '__name__', kind)})")
    return cls(*row[1:])


def _check_size(nbytes: int, max_bytes: int | None) -> None:
    if max_bytes is not None and nbytes > max_bytes:
        raise WireError(f"wire: command frame too large (got {nbytes} bytes, "
                        f"limit {max_bytes}; MWRT_MAX_FRAME_BYTES)")


def _settler(cls):
    """The function that settles a decoded `cls` in place (a message decoded just now: no
    one else holds it), or None where no field can hold a list. Every message class has at
    most one bare tuple field (args) and one dict or object field (kwargs, a reply's value):
    one short function per message of a batch, as most messages hold no list at all."""
    fields = msgspec.structs.fields(cls)
    tuples = [f.name for f in fields if f.type is tuple]
    others = [f.name for f in fields if f.type in (dict, object)]
    if not tuples and not others:
        return None
    if len(tuples) > 1 or len(others) > 1:
        raise TypeError(f"wire: {cls.__name__} has more than one field of each kind that may "
                        "hold lists; give _settler() a case for it")
    items_name = tuples[0] if tuples else ""  # "": no such field
    value_name = others[0] if others else ""
    items = attrgetter(items_name) if items_name else None
    value_of = attrgetter(value_name) if value_name else None

    def settle(message):
        if items is not None and not _disjoint(map(type, items(message))):
            _force_setattr(message, items_name, _sequence(items(message)))
        if value_of is not None:
            value = value_of(message)
            kind = type(value)
            if kind is dict:
                if value and not _disjoint(map(type, value.values())):
                    _force_setattr(message, value_name, _mapping(value))
            elif kind is list:
                _force_setattr(message, value_name, _tuples(value))
        return message
    return settle


_disjoint = _NESTED.isdisjoint
_force_setattr = msgspec.structs.force_setattr
_SETTLE = {cls: _settler(cls) for cls in MESSAGES}


def rides_inline(nbytes: int) -> bool:
    """Whether an array of `nbytes` rides beside its command (else over the data channel)."""
    return nbytes <= config.get("inline_bytes")


def send(sock, identity, message, frames=()) -> None:
    """Send one message (after a routing identity, if given): one frame holding the array
    `frames` too, or, past ZERO_COPY_BYTES of them, the frames after it zero-copy."""
    body = _pack([message])
    # pyzmq's zero-copy path costs tens of µs per frame: only worth it for big payloads.
    if frames and sum(memoryview(f).nbytes for f in frames) >= ZERO_COPY_BYTES:
        parts = [_PREFIX.pack(_HEAD, 0, len(body), 0) + body, *frames]
        if identity is not None:
            parts.insert(0, identity)
        sock.send_multipart(parts, copy=False)
        return
    if identity is not None:
        _send(sock, identity, _MORE)
    _send(sock, envelope(0, body, frames))


def parts(message, frames=()) -> list:
    """The frames send() sends for one message (after its routing identity), as a list."""
    body = _pack([message])
    if frames and sum(memoryview(f).nbytes for f in frames) >= ZERO_COPY_BYTES:
        return [_PREFIX.pack(_HEAD, 0, len(body), 0) + body, *frames]
    return [envelope(0, body, frames)]


_MORE = int(zmq.SNDMORE)
# pyzmq's own send, under the Python method that adds DRAFT options to it (~0.4 µs a call).
_send = zmq.backend.Socket.send


def send_parts(sock, parts: list) -> None:
    """sock.send_multipart(parts) of small frames, copied, without the flag objects pyzmq
    makes per frame (a few µs of every round trip)."""
    last = len(parts) - 1
    if last == 0:  # a batch, a request: one frame
        _send(sock, parts[0])
        return
    for i, part in enumerate(parts):
        _send(sock, part, _MORE if i < last else 0)


def recv_parts(sock) -> list:
    """sock.recv_multipart() as bytes, without the flag objects pyzmq makes per frame.

    Bytes, not Frames: a Ctrl-C that lands as a Frame is freed raises in its __dealloc__,
    where Python drops the KeyboardInterrupt, and the master's program ran on (a test's
    interrupted dist_send loop, one run in a loaded whole-suite pair)."""
    parts = [sock.recv()]
    while _get(sock, _RCVMORE):
        parts.append(sock.recv())
    return parts


_RCVMORE = int(zmq.RCVMORE)
_get = zmq.backend.Socket.get  # (pyzmq's own, under the method that makes an option enum)


def recv_routed(sock) -> list:
    """recv_parts() of a ROUTER socket that has a message (zmq.Again if not): its routing
    identity, then the message's frames. Whether more frames follow is read from a Frame
    (`more`), not asked (RCVMORE): pyzmq makes an enum for every option it reads."""
    parts = [sock.recv(_NOBLOCK)]
    frame = sock.recv(copy=False)
    parts.append(frame.bytes)
    while frame.more:
        frame = sock.recv(copy=False)
        parts.append(frame.bytes)
    return parts


_NOBLOCK = int(zmq.NOBLOCK)


ZERO_COPY_BYTES = 1 << 16

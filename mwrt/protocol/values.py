"""How values travel inside messages: MessagePack, with extension types for what it cannot
carry (a tensor Ref, slices, Ellipsis, NumPy arrays and scalars, complex numbers). Lists
arrive as tuples, at any depth; NumPy scalars and arrays arrive typed. Decoding never runs
code: an extension's bytes are checked (an array's dtype must be a number's, in the form a
sender writes) before NumPy reads them."""

from __future__ import annotations

import re
import struct

import msgspec
import numpy as np

from ..errors import WireError

_int64 = struct.Struct("<q").unpack
_pack_int64 = struct.Struct("<q").pack
_ARRAY_DTYPE = re.compile(r"[<>|=][biufcSUmM]\d{1,3}(\[\w+\])?\Z")

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


def _default(value):
    if isinstance(value, Ref):
        return ref(value.id)
    if isinstance(value, slice):
        return _Ext(EXT_SLICE, pack((value.start, value.stop, value.step)))
    if value is Ellipsis:
        return _Ext(EXT_ELLIPSIS, b"")
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise WireError(f"wire: object arrays cannot be sent (got dtype {value.dtype})")
        # tobytes() is C order whatever the layout (ascontiguousarray would make a 0-d 1-d)
        return _Ext(EXT_ARRAY, pack((value.dtype.str, value.shape, value.tobytes())))
    if isinstance(value, np.generic):
        if value.dtype.hasobject or value.dtype.kind == "V":
            raise WireError(f"wire: cannot encode a NumPy {value.dtype} scalar")
        return _Ext(EXT_SCALAR, pack((value.dtype.str, value.tobytes())))
    if isinstance(value, complex):
        return _Ext(EXT_COMPLEX, pack((value.real, value.imag)))
    if isinstance(value, np.dtype):
        return value.str
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).str
    raise WireError(f"wire: cannot encode a {type(value).__name__} (got {value!r:.60})")


def ext_hook(code, data):
    if code == EXT_REF:  # the common case, and struct reads a memoryview fastest
        return Ref(_int64(data)[0] if len(data) == 8 else int.from_bytes(data, "little",
                                                                         signed=True))
    if code == EXT_SLICE:
        return slice(*_values(data))
    if code == EXT_ELLIPSIS:
        return Ellipsis
    if code == EXT_ARRAY:
        dtype, shape, raw = _values(data)
        return np.frombuffer(raw, dtype=_dtype(dtype)).reshape(shape).copy()
    if code == EXT_SCALAR:
        dtype, raw = _values(data)
        dt = _dtype(dtype)
        if not isinstance(raw, bytes) or len(raw) != dt.itemsize:
            raise WireError(f"wire: a {dt} scalar needs {dt.itemsize} bytes (got "
                            f"{len(raw) if isinstance(raw, bytes) else type(raw).__name__})")
        return np.frombuffer(raw, dtype=dt)[0]
    if code == EXT_COMPLEX:
        return complex(*_values(data))
    raise WireError(f"wire: unknown extension type {code}")


def _dtype(dtype) -> np.dtype:
    # Only the canonical form a sender writes (dtype.str): not object arrays, nor the
    # aliases np.dtype would also take (some deprecated, some not numbers at all).
    if not isinstance(dtype, str) or not _ARRAY_DTYPE.match(dtype):
        raise WireError(f"wire: arrays need a dtype like '<f4' (got {dtype!r:.40})")
    return np.dtype(dtype)


_Ext = msgspec.msgpack.Ext
# One encoder and decoder of each kind for every thread: each call keeps its state on its
# own stack.
pack = msgspec.msgpack.Encoder(enc_hook=_default).encode
_values = msgspec.msgpack.Decoder(ext_hook=ext_hook).decode  # arrays as lists
NESTED = frozenset((list, tuple, dict))


def unpack(data):
    """A msgpack value, its arrays as tuples at every depth."""
    return tuples(_values(data))


def tuples(value):
    """`value` with every list a tuple, inside tuples and dict values too (a value that
    holds none is returned as it is)."""
    kind = type(value)
    if kind is list or kind is tuple:
        if NESTED.isdisjoint(map(type, value)):
            return value if kind is tuple else tuple(value)
        return sequence(value)
    if kind is dict and not NESTED.isdisjoint(map(type, value.values())):
        return mapping(value)
    return value


def sequence(value) -> tuple:
    """A list or tuple that holds an array or map, as a tuple of settled items."""
    return tuple([tuples(v) if type(v) in NESTED else v for v in value])


def mapping(value: dict) -> dict:
    """A dict whose values hold an array or map, its values settled."""
    settled = {}
    for key, item in value.items():  # a reply's dict of shapes: a flat list, made a tuple here
        kind = type(item)
        if kind is list and NESTED.isdisjoint(map(type, item)):
            item = tuple(item)
        elif kind in NESTED:
            item = tuples(item)
        settled[key] = item
    return settled


def ref(tensor_id: int) -> msgspec.msgpack.Ext:
    """A tensor reference already in wire form (the master builds one per tensor)."""
    return _Ext(EXT_REF, _pack_int64(tensor_id))  # (int.to_bytes's keywords cost more)


def dtype_str(dtype: np.dtype) -> str:
    """dtype.str, remembered: NumPy builds the string anew on each read (0.4 us)."""
    found = _STRS.get(dtype)
    if found is None:
        if len(_STRS) > _REMEMBERED:  # (structured dtypes could be made without end)
            _STRS.clear()
        found = _STRS[dtype] = dtype.str
    return found


def dtype_of(text: str) -> np.dtype:
    """np.dtype(text), remembered: NumPy parses the string anew on each call (0.35 us)."""
    found = _DTYPES.get(text)
    if found is None:
        if len(_DTYPES) > _REMEMBERED:
            _DTYPES.clear()
        found = _DTYPES[text] = np.dtype(text)
    return found


_STRS: dict = {}
_DTYPES: dict = {}
_REMEMBERED = 1000


def list_layout(value):
    """Where `value` holds lists, which arrive as tuples: its nesting (lists, tuples and
    dicts as they are, every other value None), or None if it holds no list."""
    found: list = []
    nesting = _nesting(value, found)
    return nesting if found else None


def _nesting(value, found: list):
    kind = type(value)
    if kind is list:
        found.append(True)
        return [_nesting(v, found) for v in value]
    if kind is tuple:
        return tuple([_nesting(v, found) for v in value])
    if kind is dict:
        return {k: _nesting(v, found) for k, v in value.items()}
    return None


def relist(value, layout):
    """`value` (arrived, its lists tuples) with the lists of `layout` (list_layout's) back."""
    if layout is None:
        return value
    if type(layout) is dict:
        return {k: relist(v, layout.get(k)) for k, v in value.items()}
    parts = [relist(v, part) for v, part in zip(value, layout)]
    return parts if type(layout) is list else tuple(parts)


class Relisted:
    """A shipped function given its arguments' lists back: mwrt.remote(fn)(t, [2, 0]) calls
    fn with the list it was given, not the tuple the wire delivers (x[[2, 0]] != x[2, 0])."""

    def __init__(self, fn, layout):
        self.fn, self.layout = fn, layout

    def __call__(self, *args, **kwargs):
        args, kwargs = relist((args, kwargs), self.layout)
        return self.fn(*args, **kwargs)

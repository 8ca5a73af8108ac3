"""safetensors files: one worker's part of a checkpoint, written and read without the master.

The format (github.com/huggingface/safetensors) is an 8-byte little-endian header length, a
JSON header naming each tensor's dtype, shape and byte range, then the raw bytes. HF's
`safetensors`, torch, JAX and plain NumPy read it; it needs no library to write. complex128,
which the format lacks, is stored as float64 pairs with a trailing axis of 2 and named in
the header's `__metadata__`, so other readers still get the numbers.

Every tensor's CRC32 is computed as it is written and checked as it is read: a truncated
or corrupted file is an error naming the file and the tensor, never wrong numbers.
"""

from __future__ import annotations

import json
import os
import queue
import struct
import threading
import zlib

import numpy as np

CODES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
         "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16",
         "float32": "F32", "float64": "F64", "complex64": "C64"}
DTYPES = {code: np.dtype(name) for name, code in CODES.items()}
_PAIRS = "mwrt.complex128"  # __metadata__ key: tensors stored as float64 pairs
_CHUNK = 64 << 20  # CRC32 and write in pieces, so a GB tensor never needs a second GB


class TensorFileError(ValueError):
    """A checkpoint file that cannot give what its manifest promised."""


def write(path: str, arrays: dict) -> list[int]:
    """Write `arrays` (name -> host array) to `path` atomically; returns each one's CRC32."""
    pairs = [name for name, a in arrays.items() if a.dtype == np.complex128]
    stored = {name: _storable(a) for name, a in arrays.items()}
    header, offset = {}, 0
    for name, a in stored.items():
        header[name] = {"dtype": CODES[a.dtype.name], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    if pairs:
        header["__metadata__"] = {_PAIRS: ",".join(pairs)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format allows padding; aligned data reads faster
    temporary = f"{path}.partial-{os.getpid()}"
    crcs: list = []  # summed on a thread of their own while the bytes go to the file
    summing = threading.Thread(target=lambda: crcs.extend(map(_crc32, stored.values())),
                               name="mwrt-crc32", daemon=True)
    summing.start()
    try:
        with open(temporary, "wb", buffering=0) as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for a in stored.values():
                _write_bytes(f, a)
            os.fsync(f.fileno())
    finally:
        summing.join()
    os.replace(temporary, path)
    return crcs


def read(path: str, expected: dict) -> dict:
    """The arrays named in `expected` (name -> (dtype, shape, crc)) from `path`, each checked."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - the with below; only the open's miss is caught
    except FileNotFoundError:
        raise TensorFileError(f"{path}: checkpoint file missing (a save that never finished, "
                              "or a path other hosts cannot see?)") from None
    with f:
        header, start = _header(f, path)
        pairs = set(header.get("__metadata__", {}).get(_PAIRS, "").split(","))
        return {name: _read_one(f, path, start, header, name, want, name in pairs)
                for name, want in expected.items()}


def _storable(a: np.ndarray) -> np.ndarray:
    a = a if a.flags.c_contiguous else a.copy(order="C")  # ascontiguousarray makes 0-d 1-d
    if a.dtype == np.complex128:
        return a.view(np.float64).reshape(a.shape + (2,))
    if a.dtype.name not in CODES:
        raise TensorFileError(f"checkpoint: dtype {a.dtype} has no safetensors code (expected "
                              f"one of {', '.join(CODES)})")
    return a


def _write_bytes(f, a: np.ndarray) -> None:
    view = a.reshape(-1).view(np.uint8).data
    while view:  # a raw file may write less than asked
        view = view[f.write(view[:_CHUNK]):]


def _crc32(a: np.ndarray) -> int:
    flat, crc = a.reshape(-1).view(np.uint8), 0
    for start in range(0, flat.size, _CHUNK):  # zlib lets go of the GIL for each piece
        crc = zlib.crc32(flat[start:start + _CHUNK].data, crc)
    return crc


def _read_summing(f, flat: np.ndarray) -> tuple[int, int]:
    """Read into `flat` in pieces, each summed (CRC32) on a thread while the next is read:
    (bytes read, their CRC32)."""
    pieces: queue.SimpleQueue = queue.SimpleQueue()
    crc = [0]

    def summing():
        while (piece := pieces.get()) is not None:  # not iter(get, None): arrays compare
            crc[0] = zlib.crc32(piece, crc[0])      # with == elementwise

    thread = threading.Thread(target=summing, name="mwrt-crc32", daemon=True)
    thread.start()
    got, view = 0, flat.data
    try:
        while got < flat.size:
            n = f.readinto(view[got:got + _CHUNK])
            if not n:
                break
            pieces.put(flat[got:got + n])
            got += n
    finally:
        pieces.put(None)
        thread.join()
    return got, crc[0]


def _header(f, path: str) -> tuple[dict, int]:
    head = f.read(8)
    if len(head) < 8:
        raise TensorFileError(f"{path}: truncated (no safetensors header)")
    (length,) = struct.unpack("<Q", head)
    size = os.fstat(f.fileno()).st_size
    if length > size - 8:
        raise TensorFileError(f"{path}: truncated (header of {length} bytes, file of {size})")
    try:
        return json.loads(f.read(length)), 8 + length
    except ValueError as exc:
        raise TensorFileError(f"{path}: corrupted header ({exc})") from None


def _read_one(f, path: str, start: int, header: dict, name: str, want: tuple, pairs: bool):
    dtype, shape, crc = np.dtype(want[0]), tuple(want[1]), want[2]
    entry = header.get(name)
    if entry is None:
        raise TensorFileError(f"{path}: tensor {name!r} missing")
    stored_dtype = DTYPES.get(entry["dtype"])
    got_dtype = np.dtype(np.complex128) if pairs else stored_dtype
    got_shape = tuple(entry["shape"][:-1] if pairs else entry["shape"])
    if got_dtype != dtype or got_shape != shape:
        raise TensorFileError(f"{path}: tensor {name!r} is {got_dtype}{list(got_shape)} (expected "
                              f"{dtype}{list(shape)} as the manifest says)")
    begin, end = entry["data_offsets"]
    out = np.empty(shape, dtype)
    flat = out.reshape(-1).view(np.uint8)
    if end - begin != flat.size:
        raise TensorFileError(f"{path}: tensor {name!r} has {end - begin} bytes (expected "
                              f"{flat.size})")
    f.seek(start + begin)
    got, found = _read_summing(f, flat)
    if got != flat.size:
        raise TensorFileError(f"{path}: truncated in tensor {name!r} (read {got} of {flat.size} "
                              "bytes)")
    if crc is not None and found != crc:
        raise TensorFileError(f"{path}: tensor {name!r} fails its checksum (crc32 {found:#010x}, "
                              f"expected {crc:#010x}): the file was changed or damaged")
    return out

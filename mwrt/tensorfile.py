"""safetensors files: one worker's part of a checkpoint, written and read without the master.

The format (github.com/huggingface/safetensors) is an 8-byte little-endian header length, a
JSON header naming each tensor's dtype, shape and byte range, then the raw bytes. HF's
`safetensors`, torch, JAX and plain NumPy read it; it needs no library to write. complex128,
which the format lacks, is stored as float64 pairs with a trailing axis of 2 and named in
the header's `__metadata__`, so other readers still get the numbers.

Every tensor's CRC32 is computed as it is written and checked as it is read: a truncated
or corrupted file is an error naming the file and the tensor, never wrong numbers.

Checkpoints are shared and downloaded, so a file's place comes from a manifest nobody here
wrote: it is a path relative to the checkpoint's folder, opened one folder at a time from
the folder's descriptor without following a link (O_NOFOLLOW), and a header's length is
admitted against the reader's memory bound before it is read.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import stat
import struct
import threading
import zlib

import numpy as np

CODES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
         "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16",
         "float32": "F32", "float64": "F64", "complex64": "C64"}
DTYPES = {code: np.dtype(name) for name, code in CODES.items()}
# torch's dtypes NumPy lacks: written from, and read as, same-sized integers of their bits
BITS: dict[str, np.dtype] = {"BF16": np.dtype(np.int16), "F8_E4M3": np.dtype(np.uint8),
                             "F8_E5M2": np.dtype(np.uint8)}
DTYPES.update(BITS)
# The name of every file a save writes (mwrt.save), which a sweep of older ones matches whole.
PART = re.compile(r"generation-(\d+)/node(\d+)-device(-?\d+)\.safetensors")
_GENERATION = re.compile(r"generation-(\d+)")
_PAIRS = "mwrt.complex128"  # __metadata__ key: tensors stored as float64 pairs
_CHUNK = 64 << 20  # CRC32 and write in pieces, so a GB tensor never needs a second GB
MAX_HEADER = 100_000_000  # the safetensors library's own bound on a header's length
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Non-blocking: a FIFO planted in the folder must not hang the reader in open().
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class TensorFileError(ValueError):
    """A checkpoint file that cannot give what its manifest promised."""


def write(folder: str, rel: str, arrays: dict, codes: dict | None = None) -> list[int]:
    """Write `arrays` (name -> host array) to file `rel` of `folder` atomically; returns each
    one's CRC32. `codes` names the dtype of arrays that hold the bits of one NumPy lacks
    (name -> "BF16", a key of BITS)."""
    pairs = [name for name, a in arrays.items() if a.dtype == np.complex128]
    stored = {name: _storable(a) for name, a in arrays.items()}
    header, offset = {}, 0
    for name, a in stored.items():
        code = (codes or {}).get(name) or CODES[a.dtype.name]
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    if pairs:
        header["__metadata__"] = {_PAIRS: ",".join(pairs)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format allows padding; aligned data reads faster
    os.makedirs(folder, exist_ok=True)
    with _parent(folder, rel, _of(arrays), create=True) as (fd, name):
        temporary = f"{name}.partial-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):  # a crashed save's, or a planted link:
            os.unlink(temporary, dir_fd=fd)           # unlinked, never written through
        crcs: list = []  # summed on a thread of their own while the bytes go to the file
        summing = threading.Thread(target=lambda: crcs.extend(map(_crc32, stored.values())),
                                   name="mwrt-crc32", daemon=True)
        summing.start()
        try:
            with open(os.open(temporary, _NEW, 0o666, dir_fd=fd), "wb", buffering=0) as f:
                f.write(struct.pack("<Q", len(text)) + text)
                for a in stored.values():
                    _write_bytes(f, a)
                os.fsync(f.fileno())
        finally:
            summing.join()
        os.replace(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)  # a link there is replaced
    return crcs


def read(folder: str, rel: str, expected: dict, admit=None) -> dict:
    """The arrays named in `expected` (name -> (dtype, shape, crc)) from file `rel` of
    `folder`, each checked; `admit(nbytes)` may refuse the header's length before it is read."""
    path, what = os.path.join(folder, rel), _of(expected)
    try:
        f = open_inside(folder, rel, what)
    except FileNotFoundError:
        raise TensorFileError(f"{path}: checkpoint file missing (a save that never finished, "
                              "or a path other hosts cannot see?)") from None
    with f:
        header, start = _header(f, path, admit)
        try:
            pairs = set(header.get("__metadata__", {}).get(_PAIRS, "").split(","))
            return {name: _read_one(f, path, start, header, name, want, name in pairs)
                    for name, want in expected.items()}
        except (KeyError, TypeError, AttributeError) as exc:  # a header of another shape
            raise TensorFileError(f"{path}: corrupted header ({type(exc).__name__}: {exc}, "
                                  "expected safetensors' layout)") from None


def open_inside(folder: str, rel: str, what: str):
    """File `rel` of `folder` opened for binary reading, reached without following a link
    (FileNotFoundError if it is not there)."""
    with _parent(folder, rel, what) as (fd, name):
        return _open_regular(fd, name, os.path.join(folder, rel), what)


def remove(folder: str, rel: str) -> None:
    """Remove file `rel` of `folder`, and the folder holding it once empty, following no link
    (a file already gone is no error)."""
    with contextlib.suppress(FileNotFoundError), _parent(folder, rel, "a stale file") as at:
        os.unlink(at[1], dir_fd=at[0])  # removes a link itself, never what it points to
    if "/" in rel:  # the older save's folder, once empty
        with contextlib.suppress(OSError), _parent(folder, rel.rpartition("/")[0], "") as at:
            os.rmdir(at[1], dir_fd=at[0])


def remove_older(folder: str, generation: int) -> None:
    """Remove the files of `folder` named as a save names them (PART) of generations older
    than `generation`, and their folders once empty; nothing else, and no link's target."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):  # no save of this worker's went there
        return
    for name in names:
        found = _GENERATION.fullmatch(name)
        if found is None or int(found[1]) >= generation:
            continue
        for part in _listing(folder, name):
            if PART.fullmatch(f"{name}/{part}"):
                with contextlib.suppress(OSError):  # (a folder of that name: not a save's)
                    remove(folder, f"{name}/{part}")


def _listing(folder: str, name: str) -> list[str]:
    """The names in folder `name` of `folder`; none where it is a link or not a folder."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        inner = os.open(name, _DIR, dir_fd=fd)
    except OSError:
        return []
    finally:
        os.close(fd)
    try:
        return os.listdir(inner)
    finally:
        os.close(inner)


def outside(rel) -> str:
    """Why `rel` is not a relative path inside a folder, or "" when it is one."""
    if not isinstance(rel, str) or not rel:
        return "not a path"
    if rel.startswith("/"):
        return "an absolute path"
    if "\0" in rel or any(part in ("", ".", "..") for part in rel.split("/")):
        return "a path with a '..', '.' or empty part"
    return ""


@contextlib.contextmanager
def _parent(folder: str, rel: str, what: str, create: bool = False):
    """(descriptor of the folder that holds `rel`, its last part): each folder on the way is
    opened from the one before without following a link, so nothing outside is reached."""
    reason = outside(rel)
    if reason:
        raise TensorFileError(f"{folder}: {what} is {reason} (got {rel!r}, expected a relative "
                              "path inside the checkpoint folder)")
    *dirs, name = rel.split("/")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in dirs:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                inner = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                raise _linked(exc, fd, part, os.path.join(folder, rel), what) from None
            os.close(fd)
            fd = inner
        yield fd, name
    finally:
        os.close(fd)


def _open_regular(fd: int, name: str, path: str, what: str):
    """File `name` of folder `fd`, opened for reading if it is a regular file (not a link)."""
    try:
        f = os.open(name, _READ, dir_fd=fd)
    except OSError as exc:
        raise _linked(exc, fd, name, path, what) from None
    if not stat.S_ISREG(os.fstat(f).st_mode):
        os.close(f)
        raise TensorFileError(f"{path}: {what} is not a regular file (expected the file "
                              "mwrt.save wrote)")
    os.set_blocking(f, True)
    return open(f, "rb")


def _linked(exc: OSError, fd: int, part: str, path: str, what: str) -> Exception:
    """`exc` of opening `part` in folder `fd`, named as a link where one stood in the way."""
    try:
        target = os.readlink(part, dir_fd=fd)
    except OSError:
        return exc
    return TensorFileError(f"{path}: {what} passes through a symbolic link (got {part!r} -> "
                           f"{target!r}, expected a file or folder of the checkpoint itself); a "
                           "checkpoint never follows links: put the file itself in its place")


def _of(names) -> str:
    listed = ", ".join(repr(n) for n in names)
    return f"the file of tensor{'s' if len(names) > 1 else ''} {listed}"


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


def _header(f, path: str, admit) -> tuple[dict, int]:
    head = f.read(8)
    if len(head) < 8:
        raise TensorFileError(f"{path}: truncated (no safetensors header)")
    (length,) = struct.unpack("<Q", head)
    if length > MAX_HEADER:
        raise TensorFileError(f"{path}: header of {length} bytes (expected at most "
                              f"{MAX_HEADER}, as safetensors allows): not a checkpoint file")
    if admit is not None:
        admit(length)
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
    if type(begin) is not int or begin < 0 or end - begin != flat.size:
        raise TensorFileError(f"{path}: tensor {name!r} has bytes [{begin}, {end}) (expected "
                              f"{flat.size} from an offset of 0 or more)")
    f.seek(start + begin)
    got, found = _read_summing(f, flat)
    if got != flat.size:
        raise TensorFileError(f"{path}: truncated in tensor {name!r} (read {got} of {flat.size} "
                              "bytes)")
    if crc is not None and found != crc:
        raise TensorFileError(f"{path}: tensor {name!r} fails its checksum (crc32 {found:#010x}, "
                              f"expected {crc:#010x}): the file was changed or damaged")
    return out

"""Key-value stores through which ranks find each other (torch.distributed's Store API).

Store is the contract; HashStore serves threads of one process, FileStore the processes
of one host (or a shared file system with working locks). TCPStore, served by rank 0,
lives in mwrt.store.tcp_store; the init methods and the rank rendezvous in mwrt.store.rendezvous.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import time

from .. import config
from ..errors import RendezvousError, RendezvousTimeoutError

log = logging.getLogger("mwrt.store")


def as_bytes(value) -> bytes:
    """Store values are bytes; str is UTF-8 encoded."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store value: expected bytes or str, got {type(value).__name__}")


class Store:
    """Contract: set/get (get waits for the key)/add/compare_set/wait/delete_key/check."""

    timeout: float = 300.0

    def set(self, key: str, value) -> None:
        """Set `key` to `value` (bytes, or a str stored as UTF-8), waking its waiters."""
        raise NotImplementedError

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return the value of `key`, waiting up to `timeout` seconds for it to be set."""
        raise NotImplementedError

    def add(self, key: str, amount: int) -> int:
        """Add `amount` to the integer at `key` (0 if absent) and return the new value."""
        raise NotImplementedError

    def compare_set(self, key: str, expected, desired) -> bytes:
        """Set `key` to `desired` if it holds `expected` (or is absent and expected is b'')."""
        raise NotImplementedError

    def wait(self, keys, timeout: float | None = None) -> None:
        """Wait until every key in `keys` is set; the error lists the missing ones."""
        raise NotImplementedError

    def delete_key(self, key: str) -> bool:
        """Remove `key`: True if it was set."""
        raise NotImplementedError

    def check(self, keys) -> bool:
        """True if every key in `keys` is set, without waiting."""
        raise NotImplementedError

    def num_keys(self) -> int:
        """The number of keys set (torch's Store.num_keys)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the store's connection or files (a server stops serving)."""


class PrefixStore(Store):
    """Every key of `store` under `prefix` + "/": groups of ranks sharing one store (torch's)."""

    def __init__(self, prefix: str, store: Store):
        self.prefix, self.store = f"{prefix}/", store
        self.timeout = store.timeout

    def set(self, key, value):
        self.store.set(self.prefix + key, value)

    def get(self, key, timeout=None):
        return self.store.get(self.prefix + key, timeout)

    def add(self, key, amount):
        return self.store.add(self.prefix + key, amount)

    def compare_set(self, key, expected, desired):
        return self.store.compare_set(self.prefix + key, expected, desired)

    def wait(self, keys, timeout=None):
        self.store.wait([self.prefix + k for k in keys], timeout)

    def delete_key(self, key):
        return self.store.delete_key(self.prefix + key)

    def check(self, keys):
        return self.store.check([self.prefix + k for k in keys])


class HashStore(Store):
    """An in-process store for ranks that are threads of one process."""

    def __init__(self, timeout: float | None = None):
        self.timeout = config.seconds(timeout, config.get("channel_timeout"),
                                      "HashStore: timeout")
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key, value):
        with self._cond:
            self._data[key] = as_bytes(value)
            self._cond.notify_all()

    def get(self, key, timeout=None):
        self.wait([key], timeout)
        with self._cond:
            return self._data[key]

    def add(self, key, amount):
        with self._cond:
            value = int(self._data.get(key, b"0")) + int(amount)
            self._data[key] = str(value).encode()
            self._cond.notify_all()
            return value

    def compare_set(self, key, expected, desired):
        with self._cond:
            current = self._data.get(key)
            if current == as_bytes(expected) or (current is None and as_bytes(expected) == b""):
                self._data[key] = as_bytes(desired)
                self._cond.notify_all()
            return self._data.get(key, as_bytes(expected))

    def wait(self, keys, timeout=None):
        timeout = config.seconds(timeout, self.timeout, "HashStore.wait: timeout")
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                missing = [k for k in keys if k not in self._data]
                if not missing:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RendezvousTimeoutError(
                        f"store: keys not set after {timeout} s (missing: {missing})"
                    )
                self._cond.wait(left)

    def delete_key(self, key):
        with self._cond:
            return self._data.pop(key, None) is not None

    def check(self, keys):
        with self._cond:
            return all(k in self._data for k in keys)

    def num_keys(self) -> int:
        with self._cond:
            return len(self._data)


# -- FileStore ---------------------------------------------------------------------------
#
# An append-only log of records (key, value) in one file, locked with flock for each
# operation, so processes on one host (or a shared file system with working locks) agree.
# Readers parse only what was appended since their last read. The last user to close it
# deletes the file, so the next init on the same path starts empty. File permissions are
# its only protection: it is created 0600 (its owner only), and a file others could
# write is reported, as anyone who can write it can rewrite a rank's address.

_REC = struct.Struct("<II")
_DELETED = 0xFFFFFFFF


class FileStore(Store):
    """A store in a file shared by processes on one host."""

    def __init__(self, path: str, world_size: int = -1, timeout: float | None = None):
        self.path, self.world_size = os.fspath(path), world_size
        self.timeout = config.seconds(timeout, config.get("rendezvous_timeout"))
        self._data: dict[str, bytes] = {}
        self._offset = 0
        self._fd, self._closed = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600), False
        if os.fstat(self._fd).st_mode & 0o022:
            log.warning("FileStore %s: others may write this file (so rewrite ranks' "
                        "addresses); chmod 600 it, or use a private directory", self.path)
        self._lock = threading.Lock()
        self.add("__users__", 1)

    def _locked(self, fn):
        with self._lock:
            if self._closed:
                raise RendezvousError(f"FileStore {self.path}: store is closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._refresh()
                return fn()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _refresh(self):
        size = os.fstat(self._fd).st_size
        if size < self._offset:  # the file was truncated or replaced: start over
            self._data, self._offset = {}, 0
        if size == self._offset:
            return
        raw = os.pread(self._fd, size - self._offset, self._offset)
        pos = 0
        while pos + _REC.size <= len(raw):
            klen, vlen = _REC.unpack_from(raw, pos)
            end = pos + _REC.size + klen + (0 if vlen == _DELETED else vlen)
            if end > len(raw):
                break  # a record still being written (cannot happen under the lock)
            key = raw[pos + _REC.size:pos + _REC.size + klen].decode()
            if vlen == _DELETED:
                self._data.pop(key, None)
            else:
                self._data[key] = raw[pos + _REC.size + klen:end]
            pos = end
        self._offset += pos

    def _append(self, key: str, value: bytes | None):
        k = key.encode()
        rec = _REC.pack(len(k), _DELETED if value is None else len(value)) + k + (value or b"")
        os.pwrite(self._fd, rec, os.fstat(self._fd).st_size)
        self._refresh()

    def set(self, key, value):
        self._locked(lambda: self._append(key, as_bytes(value)))

    def get(self, key, timeout=None):
        self.wait([key], timeout)
        return self._locked(lambda: self._data[key])

    def add(self, key, amount):
        def op():
            value = int(self._data.get(key, b"0")) + int(amount)
            self._append(key, str(value).encode())
            return value
        return self._locked(op)

    def compare_set(self, key, expected, desired):
        expected, desired = as_bytes(expected), as_bytes(desired)

        def op():
            current = self._data.get(key)
            if current == expected or (current is None and expected == b""):
                self._append(key, desired)
            return self._data.get(key, expected)
        return self._locked(op)

    def wait(self, keys, timeout=None):
        timeout = config.seconds(timeout, self.timeout, "FileStore.wait: timeout")
        deadline, pause = time.monotonic() + timeout, 0.001
        while True:
            missing = self._locked(lambda: [k for k in keys if k not in self._data])
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise RendezvousTimeoutError(
                    f"FileStore {self.path}: keys not set after {timeout} s (missing: {missing})")
            time.sleep(pause)
            pause = min(pause * 2, 0.05)  # a file has no wake-up: poll, backing off

    def check(self, keys):
        return self._locked(lambda: all(k in self._data for k in keys))

    def delete_key(self, key):
        def op():
            present = key in self._data
            if present:
                self._append(key, None)
            return present
        return self._locked(op)

    def num_keys(self):
        return self._locked(lambda: len(self._data) - 1)

    def close(self):
        if self._closed:
            return
        try:
            left = self.add("__users__", -1)
            if left <= 0:
                os.unlink(self.path)
        except (OSError, RendezvousError):
            pass
        with self._lock:
            if self._closed:  # by another thread meanwhile
                return
            self._closed = True
        os.close(self._fd)

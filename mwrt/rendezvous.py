"""Key-value stores through which ranks find each other (torch.distributed's Store API)."""

from __future__ import annotations

import threading
import time

from . import config
from .errors import RendezvousTimeoutError


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
        raise NotImplementedError

    def check(self, keys) -> bool:
        """True if every key in `keys` is set, without waiting."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class HashStore(Store):
    """An in-process store for ranks that are threads of one process."""

    def __init__(self, timeout: float | None = None):
        self.timeout = config.get("channel_timeout") if timeout is None else float(timeout)
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
        timeout = self.timeout if timeout is None else float(timeout)
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

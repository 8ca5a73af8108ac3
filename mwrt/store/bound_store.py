"""The TCPStore server's dict and the requests it answers: a key written with set or
compare_set belongs to its writer (another client cannot overwrite, add to or delete it),
counters made by add stay shared, and the store's keys and values stay within
MWRT_STORE_MAX_BYTES. A request is checked field by field; a bad one is answered with an
error, never raised in a server thread."""

from __future__ import annotations

import math
import threading

from .. import config
from ..errors import RendezvousTimeoutError, WireError
from .stores import HashStore


def who(claim: str) -> str:
    """'host H pid P' from a client's claim 'H:P:nonce'."""
    host, pid, _ = claim.rsplit(":", 2)
    return f"host {host} pid {pid}"


class BoundStore(HashStore):
    """The server's dict: keys written with set or compare_set belong to their writer."""

    def __init__(self):
        super().__init__(timeout=0.0)
        self.owners: dict[str, str] = {}
        self.max_bytes = int(config.get("store_max_bytes"))
        self.nbytes = 0  # of keys and values held

    def _size(self, key: str) -> int:
        value = self._data.get(key)
        return 0 if value is None else len(key) + len(value)

    def _over(self, key: str, value: bytes):
        """A refusal if writing `value` at `key` takes the store past MWRT_STORE_MAX_BYTES."""
        total = self.nbytes - self._size(key) + len(key) + len(value)
        if total <= self.max_bytes:
            return None
        return ["err", "quota", (f"TCPStore: {key!r} of {len(value)} bytes would take the "
                                 f"store to {total} bytes (got {self.nbytes} held, expected at "
                                 f"most MWRT_STORE_MAX_BYTES = {self.max_bytes}); delete keys "
                                 "you no longer need")]

    def _write(self, key: str, write):
        """Run `write()` (a change of `key`), keeping self.nbytes the store's size."""
        before = self._size(key)
        result = write()
        self.nbytes += self._size(key) - before
        return result

    def _refuse(self, key: str, op: str, client: str):
        owner = self.owners.get(key)
        if owner and owner != client:  # "": a counter made by add, anyone's
            why = (f"TCPStore: {op} {key!r} refused: the key belongs to {who(owner)}, which "
                   f"wrote it, not to {who(client)}; a value is bound to its writer: use keys "
                   "of your own, or add() for a shared counter")
            return ["err", "bound", why]
        return None

    def set_by(self, client: str, key: str, value: bytes):
        with self._cond:
            refusal = self._refuse(key, "set", client) or self._over(key, value)
            if refusal is None:
                self.owners.setdefault(key, client)
                self._write(key, lambda: self.set(key, value))
            return refusal or ["ok", None]

    def cas_by(self, client: str, key: str, expected: bytes, desired: bytes):
        with self._cond:
            current = self._data.get(key)
            if current != expected and not (current is None and expected == b""):
                return ["ok", current if current is not None else expected]  # no write
            refusal = self._refuse(key, "compare_set", client) or self._over(key, desired)
            if refusal is None:
                self.owners.setdefault(key, client)
            return refusal or ["ok", self._write(
                key, lambda: self.compare_set(key, expected, desired))]

    def add_by(self, client: str, key: str, amount: int):
        with self._cond:
            refusal = self._refuse(key, "add", client)
            if refusal is None:
                self.owners.setdefault(key, "")
            return refusal or ["ok", self._write(key, lambda: self.add(key, amount))]

    def delete_by(self, client: str, key: str):
        with self._cond:
            refusal = self._refuse(key, "delete_key", client)
            if refusal is None:
                self.owners.pop(key, None)
            return refusal or ["ok", self._write(key, lambda: self.delete_key(key))]


def _arg(value, kind: type, what: str):
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"TCPStore: {what} must be {kind.__name__} (got {type(value).__name__})")
    return value


def _keys(value) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise TypeError("TCPStore: keys must be a list of str")
    return value


def _wait_seconds(value) -> float:
    """A wait the server will do: finite and >= 0 (inf overflows a wait, NaN never ends one)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
            not math.isfinite(value) or value < 0:
        raise ValueError(f"TCPStore: timeout must be a finite number of seconds >= 0 "
                         f"(got {value!r})")
    return min(float(value), threading.TIMEOUT_MAX)


def handle(store: BoundStore, generation, client: str, req) -> list:
    """The reply to one request from `client`; WireError if it is not a request at all."""
    if not isinstance(req, list) or len(req) != 4 or not isinstance(req[0], str):
        raise WireError(f"malformed request {str(req)[:80]!r} (expected [op, key, arg, arg])")
    op, key, a, b = req
    try:
        if op == "hello":  # a client of another init (generation) on the same port: refuse it
            stale = None not in (a, generation) and a != generation
            return ["err", "stale", f"generation {generation}"] if stale else ["ok", None]
        if op in ("check", "wait"):
            keys = _keys(key)
            if op == "check":
                return ["ok", store.check(keys)]
            store.wait(keys, timeout=_wait_seconds(a))
            return ["ok", None]
        if op == "num":
            return ["ok", store.num_keys()]
        key = _arg(key, str, "key")
        if op == "set":
            return store.set_by(client, key, _arg(a, bytes, "value"))
        if op == "get":
            return ["ok", store.get(key, timeout=_wait_seconds(a))]
        if op == "add":
            return store.add_by(client, key, _arg(a, int, "amount"))
        if op == "cas":
            return store.cas_by(client, key, _arg(a, bytes, "expected"), _arg(b, bytes, "desired"))
        if op == "del":
            return store.delete_by(client, key)
    except RendezvousTimeoutError as e:
        return ["err", "timeout", str(e)]
    except (TypeError, ValueError, KeyError) as e:  # KeyError: deleted between wait and read
        return ["err", "value", str(e)]
    known = "set get add cas wait check del num"
    return ["err", "wire", f"TCPStore: unknown request {op!r} (known: {known})"]

"""mwrt's Store contract over a torch.distributed store: the one torch made for a group,
through which the "mwrt" backend's ranks find each other."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from ..errors import RendezvousError, RendezvousTimeoutError
from ..store.stores import Store


class TorchStore(Store):
    """mwrt's Store contract over a torch.distributed store (the one torch made for a group);
    its errors become mwrt's, so a failure report still names the peers when rank 0, which
    serves torch's store, is gone."""

    def __init__(self, store, timeout: float):
        self.store, self.timeout = store, timeout

    def _call(self, method: str, *args):
        try:
            return getattr(self.store, method)(*args)
        except dist.DistError as exc:
            raise RendezvousError(f"torch store: {method} failed ({exc}); rank 0 serves it: "
                                  "check that it still runs") from None

    def set(self, key, value):
        self._call("set", key, value)

    def get(self, key, timeout=None):
        self.wait([key], timeout)
        return self._call("get", key)

    def add(self, key, amount):
        return self._call("add", key, int(amount))

    def compare_set(self, key, expected, desired):
        return self._call("compare_set", key, expected, desired)

    def wait(self, keys, timeout=None):
        seconds = self.timeout if timeout is None else float(timeout)
        try:  # torch reads a zero timeout as "none": wait at least a millisecond
            self.store.wait(list(keys), timedelta(seconds=max(seconds, 1e-3)))
        except dist.DistStoreError as exc:  # a timeout; other errors end in _call's
            missing = [k for k in keys if not self.check([k])]
            if missing:
                raise RendezvousTimeoutError(f"store: keys not set after {seconds} s (missing: "
                                             f"{missing}): {exc}") from None
        except dist.DistError:
            self._call("check", list(keys))  # raises the error, worded as the others
            raise

    def delete_key(self, key):
        return self._call("delete_key", key)

    def check(self, keys):
        return self._call("check", list(keys))


__all__ = ["TorchStore"]

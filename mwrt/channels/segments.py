"""Named /dev/shm segments, mapped once and reused: the shm channel's slots, the staging
areas of its collectives. The creator names one mwrt-PID-HEX; whoever maps it last
unlinks the name, so nothing stays in /dev/shm whichever process dies later."""

from __future__ import annotations

import mmap
import os
import secrets

import numpy as np

DIR = "/dev/shm"
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in once, at map time


def new_name() -> str:
    """A fresh segment name carrying our pid, so a reaper can tell when its creator died."""
    return f"mwrt-{os.getpid()}-{secrets.token_hex(8)}"


class Segment:
    """A mapped /dev/shm segment; `slots` is an (n, slot_bytes) uint8 view of it."""

    def __init__(self, name: str, nslots: int, slot_bytes: int, create: bool):
        self.path = os.path.join(DIR, name)
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:  # reserve the pages now: a full /dev/shm fails here, not as SIGBUS later
                os.posix_fallocate(fd, 0, nslots * slot_bytes)
            self.mm = mmap.mmap(fd, nslots * slot_bytes, flags=mmap.MAP_SHARED | _POPULATE)
        except OSError:
            if create:
                self.unlink()
            raise
        finally:
            os.close(fd)
        self.slots = np.frombuffer(self.mm, np.uint8).reshape(nslots, slot_bytes)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass  # the other side unlinked it after mapping, as intended

    def close(self) -> None:
        self.slots = None  # drop our view first: mmap refuses to close while exported
        try:
            self.mm.close()
        except BufferError:
            pass  # a copy in flight still holds a view; the mapping goes with it

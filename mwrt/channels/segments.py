"""Named /dev/shm segments, mapped once and reused: the shm channel's slots, the staging
areas of its collectives. The creator names one mwrt-PID-HEX; whoever maps it last
unlinks the name, so nothing stays in /dev/shm whichever process dies later."""

from __future__ import annotations

import mmap
import os
import secrets
import socket
import stat
import struct

import numpy as np

DIR = "/dev/shm"
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in once, at map time


def new_name() -> str:
    """A fresh segment name carrying our pid, so a reaper can tell when its creator died."""
    return f"mwrt-{os.getpid()}-{secrets.token_hex(8)}"


def unlink_own(directory: str = DIR) -> list[str]:
    """Unlink the segments this process named that are still there (it is about to exit)."""
    prefix, left = f"mwrt-{os.getpid()}-", []
    try:
        names = [name for name in os.listdir(directory) if name.startswith(prefix)]
    except OSError:
        return []
    for name in names:  # made by a thread the exit cuts off before its own unlink
        try:
            os.unlink(os.path.join(directory, name))
            left.append(name)
        except OSError:
            pass  # its peer mapped it meanwhile, and unlinked it
    return left


def write_new(name: str, data: memoryview) -> str:
    """A new segment `name` holding `data`, written (not mapped): the kernel takes each page
    as the write fills it, where a mapped copy zeroes it first and then faults it in; its
    path. A full /dev/shm is an OSError here, and leaves no name behind."""
    path = os.path.join(DIR, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view, done = data.cast("B"), 0
        while done < len(view):
            done += os.write(fd, view[done:])
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path


class Segment:
    """A mapped /dev/shm segment; `slots` is an (n, slot_bytes) uint8 view of it."""

    def __init__(self, name: str, nslots: int, slot_bytes: int, create: bool,
                 owner: tuple[int, int] | None = None):
        self.path = os.path.join(DIR, name)
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:  # reserve the pages now: a full /dev/shm fails here, not as SIGBUS later
                os.posix_fallocate(fd, 0, nslots * slot_bytes)
            else:
                _check_mappable(name, fd, nslots * slot_bytes, owner)
            self.mm = mmap.mmap(fd, nslots * slot_bytes, flags=mmap.MAP_SHARED | _POPULATE)
        except OSError:
            if create:
                self.unlink()
            raise
        finally:
            os.close(fd)
        self.slots = np.frombuffer(self.mm, np.uint8).reshape(nslots, slot_bytes)

    @classmethod
    def of_peer(cls, name: str, nslots: int, slot_bytes: int, sock) -> Segment:
        """Map the segment a peer on the other end of unix socket `sock` named: only one
        that process made (its pid in the name, its uid owning the file), of the size said."""
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
        return cls(name, nslots, slot_bytes, create=False, owner=(pid, uid))

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass  # the other side unlinked it after mapping, as intended

    def close(self) -> None:
        # Drop our view first: mmap refuses to close while exported.
        self.slots = np.empty((0, 0), np.uint8)
        try:
            self.mm.close()
        except BufferError:
            pass  # a copy in flight still holds a view; the mapping goes with it


def _check_mappable(name: str, fd: int, nbytes: int, owner: tuple[int, int] | None) -> None:
    """ValueError unless the file is a regular file of at least `nbytes`, made by `owner`
    (pid, uid): a peer may not make us map, and unlink, someone else's segment."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size < nbytes:
        raise ValueError(f"segment {name}: {info.st_size} bytes, not the {nbytes} announced")
    if owner is not None:
        pid, uid = owner
        if not name.startswith(f"mwrt-{pid}-") or info.st_uid != uid:
            raise ValueError(f"segment {name} is not one the peer (pid {pid}, uid {uid}) made "
                             f"(owned by uid {info.st_uid})")

"""How a session begins and ends on a daemon: only its own connection opens it, and its end
frees everything off the socket thread.

A session is held by its master's connections (ZeroMQ identities SESSION/NONCE/role, the
nonce a master's own): a Hello must name that same session, once, so no other connection
can take over, replace or end a session by naming its id, nor keep it alive by pinging.
A named session passes to a new master only once its own has been silent past the lease.
Ending one (Bye, lease, daemon stop) may wait on data-channel peers and a collection, so it
runs on a thread of its own; the Bye is answered after.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from .. import config
from ..channels.shm import reap_orphan_segments
from ..protocol import wire
from . import quotas

log = logging.getLogger("mwrt.worker")

_MAX_NONCE = 64  # bytes of the part of a connection's name that tells one master from another


def session_of(sid: bytes) -> bytes:
    """The session a connection SESSION/NONCE belongs to (each master names its connections
    with a nonce of its own, so no other master can speak for it, even one holding the key)."""
    return sid.partition(b"/")[0]


def refuse_hello(daemon, sid: bytes, command) -> str:
    """Why a Hello on connection `sid` may not open a session ('' when it may)."""
    name, _, nonce = sid.partition(b"/")
    if not isinstance(command.session, str) or command.session.encode() != name \
            or len(nonce) > _MAX_NONCE:
        return (f"session: the Hello names session {command.session!r:.40} but comes from the "
                f"connection of session {name[:40]!r} (expected the same id); a master opens "
                "only its own session")
    if sid in daemon.sessions:
        return (f"session: {command.session} is already open on this connection (got a second "
                "Hello, expected one per master); a new master connects anew")
    held = named(daemon, name)
    if held is not None:
        return _held(held)
    if len(daemon.sessions) >= daemon.max_sessions and not _evict_orphan(daemon):
        return (f"session: this worker already holds {len(daemon.sessions)} sessions "
                f"(MWRT_MAX_SESSIONS = {daemon.max_sessions}); retry once a master has ended, "
                "or start the worker with a larger MWRT_MAX_SESSIONS")
    return ""


def named(daemon, name: bytes):
    """The session called `name`, whichever connection holds it (None if none)."""
    for session in daemon.sessions.values():
        if session.id.encode() == name:
            return session
    return None


def gone_after() -> float:
    """Seconds of silence after which a worker counts a master gone: its session is freed,
    or, if named, kept for its grace and may be re-attached (a live master is never cut off)."""
    return config.get("lease_timeout")


def may_reattach(session) -> bool:
    """True when a new master may take `session` over: it is kept for a grace, and its
    master has been silent past the lease, so is gone."""
    return session.grace > 0 and time.monotonic() - session.last_seen > gone_after()


def _held(session) -> str:
    """The refusal of a Hello for a session another master holds: when it may be re-attached."""
    silent, lease = time.monotonic() - session.last_seen, gone_after()
    when = (f"it may be re-attached once that master has been silent for {lease:g} s "
            f"(MWRT_LEASE_TIMEOUT), in {max(lease - silent, 0):.1f} s at the earliest"
            if session.grace > 0 else "it has no grace, so it ends with that master")
    return (f"session: {session.id} is held by master {session.master} (heard from "
            f"{silent:.1f} s ago; one master per session); {when}")


def _evict_orphan(daemon) -> bool:
    """Free the session silent the longest if its master is gone (kept only for its grace),
    so a live master is served before an orphan; False when every session has a master."""
    orphans = [s for s in daemon.sessions.values()
               if time.monotonic() - s.last_seen > gone_after()]
    if not orphans:
        return False
    oldest = min(orphans, key=lambda s: s.last_seen)
    log.warning("session %s of %s: freed for a new master (MWRT_MAX_SESSIONS = %d reached; "
                "it was kept only for its grace)", oldest.id, oldest.master, daemon.max_sessions)
    daemon.end_session(oldest)
    return True


def grace(daemon, command) -> float:
    """The grace a Hello asks for, within the worker's bound; none on an unkeyed worker (any
    local user could re-attach there, and what it keeps pins memory nobody answers for)."""
    value = float(command.grace)
    if daemon.keys is None or math.isnan(value):
        return 0.0
    return min(max(value, 0.0), config.get("max_session_grace"))


def end(daemon, session, answer=None) -> threading.Thread:
    """Forget `session` now; free what it holds on a thread of its own, then send `answer`."""
    if daemon.sessions.get(session.sid) is session:
        del daemon.sessions[session.sid]
        daemon.retire(session)  # its counters stay in the daemon's totals

    def free():
        session.close()
        quotas.give_back_memory()
        if answer is not None:
            sock = daemon.reply_socket()
            try:
                wire.send(sock, session.identity, answer)
            finally:
                sock.close(linger=1000)

    return off_thread(free, f"mwrt-end-{session.id[:8]}")


def off_thread(fn, name: str) -> threading.Thread:
    """Run `fn` on a thread of its own: the socket thread must never wait."""
    thread = threading.Thread(target=fn, daemon=True, name=name)
    thread.start()
    return thread


REAP_EVERY = 5.0  # seconds between looks at /dev/shm for dead processes' segments


def reap_segments(daemon) -> None:
    """Remove segments of this user's dead processes every REAP_EVERY seconds until the
    daemon stops, off the socket thread: a /dev/shm anyone can fill must not stall masters."""
    skip: set = set()
    while not daemon.stopping:
        reap_orphan_segments(skip=skip)
        for _ in range(int(REAP_EVERY / 0.2)):
            if daemon.stopping:
                return
            time.sleep(0.2)

"""How a session begins and ends on a daemon: only its own connection opens it, and its end
frees everything off the socket thread.

A session is named by its master's connection (ZeroMQ identity SESSION/role): a Hello
must name that same session, once, so no other connection can take over, replace or end
a session by naming its id. Ending one (Bye, lease, daemon stop) may wait on data-channel
peers and a collection, so it runs on a thread of its own; the Bye is answered after.
"""

from __future__ import annotations

import math
import threading
import time

from .. import config
from ..channels.shm import reap_orphan_segments
from ..protocol import wire
from . import quotas

MAX_GRACE = 7 * 86400.0  # a week: a named session's tensors are not kept forever
_GONE_AFTER_PINGS = 4  # heartbeat intervals of silence after which a master is gone


def refuse_hello(sessions: dict, sid: bytes, command) -> str:
    """Why a Hello on the connection of session `sid` may not open it ('' when it may)."""
    if not isinstance(command.session, str) or command.session.encode() != sid:
        return (f"session: the Hello names session {command.session!r:.40} but comes from the "
                f"connection of session {sid[:40]!r} (expected the same id); a master opens "
                "only its own session")
    if sid in sessions:
        return (f"session: {command.session} is already open on this worker (got a second "
                "Hello for it, expected one per master); a new master picks a new id, and a "
                "named session is re-attached only once its master is silent")
    return ""


def may_reattach(session, command) -> bool:
    """True when a Hello may take over `session`: it is named (kept for a grace) and its
    master has been silent for several heartbeats, so is gone (a live one is never cut off)."""
    silent = time.monotonic() - session.last_seen
    return session.grace > 0 and silent > _GONE_AFTER_PINGS * config.get("heartbeat_interval")


def grace(command) -> float:
    """The grace a Hello asks for, within the worker's bound."""
    value = float(command.grace)
    return 0.0 if math.isnan(value) else min(max(value, 0.0), MAX_GRACE)


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

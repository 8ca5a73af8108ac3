"""Hang reports: one thread per process looks at each group's current call every few seconds.

A collective marks itself on its group as it enters (`group.current`, with the time it
began) and as it ends (`group.finished`, `group.idle_since`); the facade's send/recv mark
`group.p2p`. Nothing else happens on the hot path: this thread notices a call that has
waited MWRT_HANG_WARNING seconds since it began and logs who it waits for (the members
whose last report, through the group's store, is behind this call), naming the call
(`all_reduce #12 on group [0, 1, 2]`). It also
publishes each group's state to the store when it changes (so the others can say what this
rank does), and, under mwrt-launch, to a file the launcher prints as a table
(MWRT_STATUS_DIR). The collectives a call of mwrt's own makes (init_process_group's) are
named as its, and leave the group as if it had made none (`internal`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import weakref

from .. import config

log = logging.getLogger("mwrt.collective")
_groups: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()
_thread: list[threading.Thread | None] = [None]


def watch(group) -> None:
    """Start watching `group` (from its constructor); the thread starts with the first."""
    group.current, group.finished, group.p2p = None, -1, None
    group.idle_since, group.caller = time.time(), None
    warning = config.get("hang_warning")
    if warning <= 0 and not config.get("status_dir"):
        return
    with _lock:
        _groups.add(group)
        if _thread[0] is None:
            thread = threading.Thread(target=_run, args=(max(warning, 0.0),),
                                      name="mwrt-hang-watchdog", daemon=True)
            thread.start()
            _thread[0] = thread


def forget(group) -> None:
    """Stop watching `group` (closed)."""
    with _lock:
        _groups.discard(group)


@contextlib.contextmanager
def internal(group, caller: str):
    """`with internal(g, "init_process_group")`: the reports name the collectives inside as
    `caller`'s, and after it say the group has made none yet (none was the user's)."""
    group.caller = caller
    try:
        yield
    finally:
        group.caller, group.current, group.finished = None, None, -1
        group.idle_since = time.time()


def group_label(g) -> str:
    """`the default group [0, 1]` or `group 3 [0, 2]`: how reports name a group."""
    return f"{'the default group' if not g.group_id else f'group {g.group_id}'} {g.ranks}"


def state_of(g) -> tuple:
    """(key, busy, text, since) of what `g` does now: the key changes whenever the call does;
    `since` is the time.time() its call began, or the group went idle."""
    call, finished, p2p, idle_since = g.current, g.finished, g.p2p, g.idle_since
    if call is not None and call.seq > finished:
        name = f"{call.kind} #{call.seq}"
        name = name if g.caller is None else f"{g.caller}'s {name}"
        return ("call", call.seq), True, f"{name} on {group_label(g)}", call.started
    if p2p is not None:
        return ("p2p", p2p[0]), True, f"{p2p[1]} on {group_label(g)}", p2p[3]
    if call is None:
        return ("idle", -1), False, f"idle on {group_label(g)} (no collective yet)", idle_since
    text = f"idle after {call.kind} #{finished} on {group_label(g)}"
    return ("idle", finished), False, text, idle_since


class _Seen:
    """What the watchdog last saw of one group: the state, since when, last warned when."""

    __slots__ = ("busy", "key", "published", "since", "warned")

    def __init__(self, key, busy, since):
        self.key, self.busy, self.since, self.warned = key, busy, since, since
        self.published = False


def _run(warning: float) -> None:
    """The watchdog's loop: never raises, so a broken store cannot end the reports."""
    tick = min(max(warning / 4, 0.05), 5.0) if warning > 0 else 1.0
    seen: dict = {}
    while True:
        time.sleep(tick)
        try:
            _tick(seen, warning)
        except Exception as e:  # noqa: BLE001 - the reports are best effort
            log.debug("hang watchdog: %s", e)


def _tick(seen: dict, warning: float) -> None:
    now, changed = time.time(), False  # wall time: the others compare it with theirs
    with _lock:
        groups = list(_groups)
    for g in groups:
        key, busy, text, since = state_of(g)
        s = seen.get(id(g))
        if s is None or s.key != key:
            s = seen[id(g)] = _Seen(key, busy, since)
            changed = True
        if not s.published:
            s.published = _publish(g, key, busy, text, s.since)
        if busy and warning > 0 and now - s.warned >= warning:
            s.warned = now
            log.warning("%s", report(g, key, text, now - s.since))
    for gone in set(seen) - {id(g) for g in groups}:
        del seen[gone]
    if changed:
        _write_status(groups, seen)


def _key(g, rank: int) -> str:
    return f"{g.prefix}/now/{g.group_id}/{rank}"


def _publish(g, key, busy: bool, text: str, wall: float) -> bool:
    """Leave this rank's state of `g` in its store for the others' reports."""
    if g.store is None:
        return True
    record = {"seq": key[1] if key[0] != "p2p" else None, "busy": busy, "what": text,
              "since": wall}
    try:
        g.store.set(_key(g, g.channel.rank), json.dumps(record).encode())
    except Exception:  # noqa: BLE001 - retried next tick
        return False
    return True


def others(g, ranks) -> dict:
    """Each of `ranks`' last published record on `g` (None where it left none)."""
    got = {}
    for rank in ranks:
        try:
            if g.store.check([_key(g, rank)]):
                got[rank] = json.loads(g.store.get(_key(g, rank), timeout=1.0))
            else:
                got[rank] = None
        except Exception:  # noqa: BLE001 - the store may be gone with rank 0
            got[rank] = None
    return got


def _line(rank: int, rec) -> str:
    if rec is None:
        return f"rank {rank}: no report"
    state = "in " if rec["busy"] else ""
    return f"rank {rank}: {state}{rec['what']} (for {time.time() - rec['since']:.0f} s)"


def report(g, key, text: str, waited: float) -> str:
    """The hang report of this rank's call `text` on `g`, waiting `waited` seconds."""
    me, tail = g.channel.rank, f"fails after the group's timeout, {g.timeout:g} s"
    head = f"mwrt: rank {me} has waited {waited:.0f} s in {text}"
    p2p = g.p2p if key[0] == "p2p" else None
    peers = [p2p[2]] if p2p is not None and p2p[2] is not None else \
        [r for r in g.ranks if r != me]
    if g.store is None:
        return f"{head}, waiting for ranks {peers} (no store to ask them; {tail})"
    records = others(g, peers)
    if key[0] == "p2p":
        behind = peers
    else:
        behind = [r for r, rec in records.items() if rec is None or rec["seq"] is None
                  or rec["seq"] < key[1] or not rec["busy"]]
    who = f"waiting for ranks {behind}" if behind else "every member has entered it"
    lines = "; ".join(_line(r, rec) for r, rec in records.items())
    return f"{head}, {who}; they last reported: {lines or 'nothing'} ({tail})"


def _write_status(groups, seen: dict) -> None:
    """Replace this process's status file (for mwrt-launch's table), if asked for one."""
    where = config.get("status_dir")
    if not where or not groups:
        return
    rank = groups[0].channel.rank
    rows = []
    for g in groups:
        s = seen.get(id(g))
        if s is not None:
            rows.append({"busy": s.busy, "what": state_of(g)[2], "since": s.since,
                         "group": g.group_id})
    tmp = os.path.join(where, f".rank-{rank}.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"rank": rank, "pid": os.getpid(), "calls": rows}, f)
    os.replace(tmp, os.path.join(where, f"rank-{rank}.json"))


def read_status(where: str) -> dict:
    """{rank: its status record} from the files in `where` (for mwrt-launch)."""
    out = {}
    for name in os.listdir(where):
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(where, name)) as f:
                    rec = json.load(f)
                out[int(rec["rank"])] = rec
            except (OSError, ValueError, KeyError):
                continue  # being replaced: the next look finds it
    return out


def table(records: dict, ranks) -> str:
    """One line per rank: its busiest call (the longest wait) or what it did last."""
    now, lines = time.time(), [f"{'rank':>4}  {'state':<8} {'for':>7}  call"]
    for rank in ranks:
        rec = records.get(rank)
        if rec is None or not rec["calls"]:
            lines.append(f"{rank:>4}  {'-':<8} {'':>7}  no collective yet")
            continue
        busy = [c for c in rec["calls"] if c["busy"]]
        c = min(busy, key=lambda c: c["since"]) if busy else max(rec["calls"],
                                                                   key=lambda c: c["since"])
        state = "waiting" if c["busy"] else "idle"
        what = c["what"].removeprefix("idle ")
        lines.append(f"{rank:>4}  {state:<8} {now - c['since']:>6.1f}s  {what}")
    return "\n".join(lines)


__all__ = ["watch", "forget", "internal", "state_of", "report", "read_status", "table",
           "group_label"]

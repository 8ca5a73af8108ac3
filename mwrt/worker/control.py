"""Session commands the daemon's socket thread answers itself, one function per command.

A command whose trait `on_stream` is false lands here, in order with the stream work
before and after it in its batch (daemon._dispatch); each function is named like the
command's `handler`. None of them runs an op or waits on one: stream work goes to the
executors, and whatever could block (freeing a session, closing a channel) runs off
this thread.
"""

from __future__ import annotations

from ..errors import QuotaError
from ..protocol import wire
from . import lifecycle, quotas
from .graphs import NotDecoded


def bye(daemon, session, cmd) -> None:
    # Answered once all is freed, off this thread: the master may exit at the answer.
    daemon.end_session(session, wire.Done(token=cmd.id, value=None))


def name(daemon, session, cmd) -> None:
    try:
        session.name_tensor(cmd.ref, cmd.name)
    except QuotaError as exc:
        daemon.refuse(session, "quota", str(exc))


def new_stream(daemon, session, cmd) -> None:
    try:
        session.stream(cmd.stream, cmd.device)
    except QuotaError as exc:
        daemon.refuse(session, "quota", str(exc))


def define_graph(daemon, session, cmd) -> None:
    try:
        pending = session.graphs.define(cmd, daemon.max_frame)
    except QuotaError as exc:  # reported at the master's next wait on this node
        daemon.refuse(session, "quota", str(exc))
        return
    daemon.decoder.put(pending)  # decoded off this thread


def replay(daemon, session, cmd) -> None:
    try:
        groups, nbytes = session.graphs.replay(cmd)
    except NotDecoded as exc:  # this session's commands wait for it, in order
        daemon.park(session, exc.args[0], cmd)
        return
    except KeyError as exc:  # reported at the master's next wait on this node
        daemon.refuse(session, "graph", exc.args[0])
        return
    # A replay queues its graph's commands again: counted as their bytes, like a batch,
    # until every stream has run them (a flood of Replays is bounded as one of batches is).
    held = quotas.Frames()
    try:
        session.inflight.admit(nbytes)
    except QuotaError as exc:
        daemon.refuse(session, "quota", str(exc))
        return
    session.inflight.track(held, nbytes)
    daemon.submit(session, groups, held)


def drop_graph(daemon, session, cmd) -> None:
    session.graphs.drop(cmd.graph)


def query(daemon, session, cmd) -> None:
    executor = session.streams.get(cmd.stream)
    daemon.send(session.identity, wire.Done(token=cmd.token,
                                            value=executor is None or executor.idle()))


def profile(daemon, session, cmd) -> None:
    trace, session.trace = session.trace, ([] if cmd.on else None)
    if not cmd.on:
        daemon.send(session.identity, wire.Done(token=cmd.token, value=trace or []))


def join(daemon, session, cmd) -> None:
    from .data import SessionData

    refusal = _join_refusal(daemon, session, cmd)
    if refusal:
        daemon.send(session.identity, wire.Failed(cmd.token, {"kind": "quota",
                                                              "message": refusal}))
        return
    if session.data is not None:  # closing a channel may wait on its peers: not here
        lifecycle.off_thread(session.data.close, f"mwrt-rejoin-{session.node}")
    # Publish this node's channel address now: a peer must never wait on the store for a
    # node that died before its first transfer, only fail to connect to it.
    session.data = SessionData(session, cmd)
    session.data.start()


def _join_refusal(daemon, session, cmd) -> str:
    """Why a Join may not start ('' if it may): its world is too large, this master's last
    Join is still under way, or the daemon already runs MWRT_MAX_JOINS of them (a thread
    each); the last takes a slot from daemon.joins, which the Join's thread gives back."""
    world, limit = cmd.world, daemon.max_world
    if type(world) is not int or not session.node < world <= limit:
        return (f"Join: a world of {world!r:.20} ranks (expected node {session.node} < world <= "
                f"{limit}, MWRT_MAX_WORLD); a master joins with its nodes and itself")
    if session.data is not None and not session.data.ready.is_set():
        return (f"Join: node {session.node} is still joining this master's previous data "
                "channel (one Join at a time per master); wait for its answer")
    if not daemon.joins.acquire(blocking=False):
        return (f"Join: node {session.node} already runs {daemon.max_joins} Joins for its "
                "masters (MWRT_MAX_JOINS); retry once one has finished")
    return ""


def cancel(daemon, session, cmd) -> None:
    for executor in list(session.streams.values()):
        executor.cancel()
    daemon.send(session.identity, wire.Done(token=cmd.token, value=None))


def stats(daemon, session, cmd) -> None:
    value = dict(session.stats(), worker=daemon.report())
    daemon.send(session.identity, wire.Done(token=cmd.token, value=value))


def event_query(daemon, session, cmd) -> None:
    try:
        if cmd.wait and session.add_waiter(cmd.event, cmd.token):
            return  # answered when it fires
        when = session.fired_time(cmd.event)
        state = session.event(cmd.event) if when is None else None
    except QuotaError as exc:
        daemon.send(session.identity, wire.Failed(cmd.token, {"kind": "quota",
                                                              "message": str(exc)}))
        return
    done = state is None or state.fired.is_set()  # None: fired for good, at `when`
    daemon.send(session.identity, wire.Done(token=cmd.token, value={
        "done": done, "time": when if state is None else state.time}))


def event_done(daemon, session, cmd) -> None:
    session.fire_event(cmd.event, None, daemon.send, cmd.error)


def peer_lost(daemon, session, cmd) -> None:
    session.peer_lost(cmd.rank, cmd.reason)

"""Every command's handler, in one table keyed by its message class.

A stream command runs on its stream's executor as `handler(executor, command, frames)`; a
session command runs on the daemon's socket thread as `handler(daemon, session, command)`.
Hello and Ping come before any session, so the daemon answers those two itself. A command
class with no handler here, or a handler named unlike its command, fails the daemon's start,
not a command at run time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..protocol import wire
from . import calls, checkpoint_files, control, data_commands, handlers

Handler = Callable[..., Any]

STREAM: dict[type[wire.Command], Handler] = {
    wire.Create: handlers.create, wire.Put: handlers.put, wire.Call: calls.call,
    wire.CallGet: calls.call_get,
    wire.Remote: handlers.remote, wire.Free: handlers.free, wire.Get: handlers.get,
    wire.Meta: handlers.meta, wire.Layout: handlers.layout, wire.Share: handlers.share,
    wire.Lend: handlers.lend, wire.Unlend: handlers.unlend, wire.Sync: handlers.sync,
    wire.Record: handlers.record,
    wire.WaitEvent: handlers.wait_event, wire.Expect: handlers.expect,
    wire.SendTo: data_commands.send_to, wire.RecvFrom: data_commands.recv_from,
    wire.Collective: data_commands.collective,
    wire.SaveTensors: checkpoint_files.save_tensors,
    wire.LoadTensors: checkpoint_files.load_tensors,
}

SESSION: dict[type[wire.Command], Handler] = {
    wire.Bye: control.bye, wire.Query: control.query, wire.NewStream: control.new_stream,
    wire.EventQuery: control.event_query, wire.EventDone: control.event_done,
    wire.Profile: control.profile, wire.Join: control.join, wire.Stats: control.stats,
    wire.PeerLost: control.peer_lost, wire.DefineGraph: control.define_graph,
    wire.Replay: control.replay, wire.DropGraph: control.drop_graph, wire.Name: control.name,
    wire.Cancel: control.cancel,
}

BEFORE_SESSION = (wire.Hello, wire.Ping)  # the daemon answers these itself


def _keyed(handler: Handler) -> Handler:
    """`handler` of a needs_key stream command: refused by a daemon without a key (any local
    user could send it code), before anything is unpickled."""

    @functools.wraps(handler)
    def run(ex, cmd, frames):
        if ex.session.daemon.keys is None:
            raise PermissionError(
                f"{cmd.handler}: this worker has no key, so it does not run shipped code (any "
                "local user could send it); start it with --key-file (see `mwrt-worker keygen`)")
        return handler(ex, cmd, frames)
    return run


def _checked() -> None:
    """Every command class has one handler, in the table of where it runs, named like it."""
    for cls in wire.MESSAGES:
        if not cls.socket or cls in BEFORE_SESSION:
            continue
        table, where = (STREAM, "STREAM") if cls.on_stream else (SESSION, "SESSION")
        handler = table.get(cls)
        if handler is None or handler.__name__ != cls.handler:
            raise ImportError(f"worker: {cls.__name__} has no handler {cls.handler}() in "
                              f"mwrt/worker/routes.py's {where} table (got {handler!r})")
    for cls in STREAM:
        if cls.needs_key:
            STREAM[cls] = _keyed(STREAM[cls])


_checked()

"""How a session's commands reach its streams, on the daemon's socket thread.

A batch from a master is dispatched at once when nobody waits, else queued in slices that
the sessions take in turn (round-robin), so one master's flood delays another's command by
a few slices, never by the whole flood. A session's commands behind a Replay whose graph is
being decoded are parked until it is. Session-level commands are answered here in order with
the streams' work; a sync point on an idle stream, or a short op, is answered or run here
(no thread hand-off); the rest queue on their stream's executor, a shape question (Meta)
answered as soon as its tensor is made.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from ..errors import QuotaError, WireError
from ..protocol import wire
from . import quotas, routes
from .calls import quick_call
from .session import RX, Session
from .tensors import early_answer, meta_answer

log = logging.getLogger("mwrt.worker")

_RESUME_STEP = 4  # parked batches a session dispatches per turn of the socket loop
_TURN_COMMANDS = 256  # a session's commands dispatched per turn while others wait


class Dispatcher:
    """The Daemon's scheduling of its sessions' commands (see the module's doc)."""

    sessions: dict[bytes, Session]
    _turns: deque[Session]  # sessions with commands in their inbox, in turn
    _decoded: bool  # the graph decoder finished a graph since the last _resume()
    _more_parked: bool  # sessions have parked batches left for the next turn
    inline_bytes: int
    inline_op_elements: int
    incarnation: str
    address: str
    if TYPE_CHECKING:  # the Daemon's
        def _log_rejection(self, message: str, *args) -> None: ...

        def send(self, identity: bytes, message, frames=()) -> None: ...

        def refuse(self, session, kind: str, message: str) -> None: ...

    def _on_batch(self, sid, seq, commands, body, data) -> None:
        session = self.sessions.get(sid)
        if session is None:
            self.send(sid + b"/" + RX, wire.Failed(token=-1, info={
                "kind": "unknown_session", "incarnation": self.incarnation,
                "message": f"worker {self.address} has no session for this master (it "
                           "restarted, or freed the session after a silence)"}))
            return
        if seq <= session.last_seq:
            log.info("dropped a resent batch %d from %s", seq, session.master)
            return
        session.last_seq, session.last_seen = seq, time.monotonic()
        session.max_id = max(session.max_id, commands[-1].id) if commands else session.max_id
        try:
            data = quotas.admit(session, commands, data, len(body))
        except (QuotaError, WireError) as exc:
            self._log_rejection("refused a batch of session %s: %s", session.id, exc)
            kind = "quota" if isinstance(exc, QuotaError) else "wire"
            self.refuse(session, kind, str(exc))
            return
        if session.parked is not None:  # behind a Replay whose graph is being decoded
            session.parked.append((commands, data))
        elif not self._turns and len(commands) <= _TURN_COMMANDS:
            self._dispatch(session, commands, data)  # nobody waits: no queue
        else:
            if not session.inbox:
                self._turns.append(session)
            session.inbox.extend((commands[i:i + _TURN_COMMANDS], data)
                                 for i in range(0, len(commands), _TURN_COMMANDS))

    def _take_turns(self) -> None:
        """Dispatch one slice of each waiting session's inbox, in turn (round-robin)."""
        for _ in range(len(self._turns)):
            session = self._turns.popleft()
            if self.sessions.get(session.sid) is not session or session.closed:
                session.inbox.clear()  # it ended
                continue
            commands, data = session.inbox.popleft()
            self._dispatch(session, commands, data)
            time.sleep(0)  # the GIL, to threads that wait for it (a Join, another's stream)
            if session.parked is not None:  # a Replay waits for its graph: so does the rest
                session.parked.extend(session.inbox)
                session.inbox.clear()
            elif session.inbox and self.sessions.get(session.sid) is session:
                self._turns.append(session)

    def park(self, session, pending, replay) -> None:
        """Hold `session`'s commands from `replay` on until `pending` is decoded."""
        session.parked, session.waiting = [([replay], ())], pending

    def _resume(self) -> None:
        """Dispatch, in order, what sessions parked behind graphs now decoded: a few batches
        a session per turn of the loop, so a master that parked thousands (a flood of
        Replays) does not keep the others' messages waiting."""
        self._decoded = self._more_parked = False
        for session in list(self.sessions.values()):
            waiting = session.waiting
            if session.parked is None or waiting is None or not waiting.ready.is_set():
                continue
            parked, session.parked = session.parked, None
            for i, (commands, data) in enumerate(parked):
                if i == _RESUME_STEP:  # the rest next turn; new batches queue behind them
                    session.parked, self._more_parked = parked[i:], True
                    break
                self._dispatch(session, commands, data)
                if self.sessions.get(session.sid) is not session:
                    break
                if session.parked is not None:  # another graph to wait for
                    session.parked.extend(parked[i + 1:])
                    break

    def _dispatch(self, session: Session, commands, data) -> None:
        groups: dict[int, list] = {}
        for i, command in enumerate(commands):
            if not command.on_stream:  # answered here, in order with the streams' work
                self.submit(session, groups, data)
                groups = {}
                routes.SESSION[type(command)](self, session, command)
                if self.sessions.get(session.sid) is not session:  # it ended (Bye)
                    return
                if session.parked is not None:  # a Replay waits for its graph: so does the rest
                    if i + 1 < len(commands):
                        session.parked.append((commands[i + 1:], data))
                    return
            elif not (command.stream not in groups and (  # (a CallGet is both: quick first)
                    (command.quick and self._run_now(session, command, data))
                    or (command.sync_point and self._answer_now(session, command)))):
                if command.posts_receive and session.data is not None:
                    refusal = session.data.refusal(command)
                    if refusal:  # answered now: the sender never sends, the stream never waits
                        self.send(session.identity, wire.Failed(command.token, {
                            "kind": "quota", "message": refusal}))
                        continue
                    session.data.post(command)
                    if command.token >= 0:
                        self.send(session.identity, wire.Done(token=command.token, value=None))
                elif type(command) is wire.Meta:  # answered once its tensor is made
                    self._answer_when_made(session, command)
                groups.setdefault(command.stream, []).append(command)
        if groups:  # (a sync loop's batch ran here whole: nothing to queue)
            self.submit(session, groups, data)

    def _answer_now(self, session, command) -> bool:
        """Answer a sync point on an idle stream here: saves two thread hand-offs.

        Only when the stream has run everything before it and the answer is small, so the
        socket thread never waits on an op nor copies much.
        """
        if command.quick:  # a CallGet runs an op: _run_now's bound decides
            return False
        executor = session.streams.get(command.stream)
        # GPU streams run asynchronously on the device: only their own thread may answer.
        if executor is None or executor.device != -1 or executor.pending:
            return False
        if type(command) is wire.Get or type(command) is wire.Share:  # they copy bytes
            found = session.tensors.get(command.ref)
            if not hasattr(found, "nbytes") or found.nbytes > self.inline_bytes:
                return False
        session.inline += 1
        executor.execute(command, ())
        return True

    def _answer_when_made(self, session, command) -> None:
        """Answer a shape question now if its tensor is made, else when it is: a shape does
        not wait for the later commands of its stream (the stream, reaching it, skips it)."""
        value = session.tensors.watch(command.ref, command.token)
        if value is not None and early_answer(value, self.inline_bytes):
            session.tensors.answering(command.token)
            self.send(session.identity, meta_answer(value, command.token))

    def _run_now(self, session, command, data) -> bool:
        """Run a short command (a Free, a Call or CallGet on small arrays) on an idle host
        stream here: a sync loop's op then costs no thread hand-off.

        Bounded by MWRT_INLINE_OP_ELEMENTS, so this thread, which serves every master,
        spends microseconds on it; never a remote() function, a collective or a transfer.
        """
        executor = session.streams.get(command.stream)
        if executor is None or executor.device != -1 or executor.pending:
            return False
        if type(command) is wire.Free:
            if session.trace is None and not executor.stopped:  # (a Free cannot fail)
                session.inline += 1
                executor.ops += 1
                session.free(command.ids, command.uses)
                return True
        elif not (self.inline_op_elements and quick_call(executor, command,
                                                        self.inline_op_elements)):
            return False
        session.inline += 1
        executor.execute_safely(command, data)
        executor.prepared = None  # (a command that failed before its op ran left it)
        return True

    def submit(self, session, groups, data) -> None:
        """Queue each stream's commands (by stream id) on its executor, started if new."""
        for stream_id, commands in groups.items():
            try:
                executor = session.stream(stream_id)
            except Exception as exc:  # noqa: BLE001 - any refusal is answered; the loop goes on
                self.refuse(session, "quota" if isinstance(exc, QuotaError) else "remote", str(exc))
                continue
            executor.submit(commands, data)

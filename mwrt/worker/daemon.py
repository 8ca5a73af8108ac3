"""The daemon's socket loop: receives batches, hands commands to stream executors, forwards replies.

The socket thread never runs an op. It decodes each batch, checks that every command
belongs on the socket it came by, answers session-level commands itself (Hello and Ping
here, the rest in control.py, each a function named like it) and queues stream commands
on their stream's executor (dispatcher.py: in turns between masters). A command's traits
(mwrt.protocol.messages) say which is which. Executors reply through an inproc PUSH socket
that this loop forwards to the master, because a ZeroMQ socket belongs to one thread.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections import deque

import zmq

from .. import config
from ..errors import ConfigError, WireError
from ..netaddr import is_loopback, join_host_port, resolve, split_host_port
from ..netio import Waker
from ..procs import process_alive
from ..protocol import auth, wire
from ..protocol.refusals import RefusalLog, recv_monitor_message
from . import fperrors, lifecycle, quotas, report, routes
from .dispatcher import Dispatcher
from .graphs import GraphDecoder
from .lanes import Lanes
from .session import HB, RX, TX, Session
from .slots import OpSlots
from .wakes import Wakes

log = logging.getLogger("mwrt.worker")

_REJECTION_WINDOW, _REJECTIONS_LOGGED = 10.0, 20  # seconds, log lines per window
_ROLES = {TX: "tx", RX: "rx", HB: "hb"}
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: no enum made per call


def _recv_frames(sock) -> list:
    """A reply a stream thread queued (zmq.Again if none), as Frames: forwarded uncopied."""
    return sock.recv_multipart(zmq.NOBLOCK, copy=False)


def _check_socket(role: bytes, commands: list) -> None:
    """Every command must be one a master sends on this socket; a WireError names the first
    that is not (a reply, or a command of another socket), so its batch does not run."""
    expected = _ROLES.get(role)
    if expected is None:
        raise WireError(f"wire: unknown socket role {role[:20]!r} (expected SESSION/tx, rx or hb)")
    if _SENT_ON[expected].issuperset(map(type, commands)):  # (one test in C per batch)
        return
    for command in commands:
        if command.socket != expected:
            where = (f"a command for SESSION/{command.socket}" if command.socket
                     else "a reply, not a command")
            raise WireError(f"wire: unknown command {type(command).__name__} on SESSION/"
                            f"{expected} (it is {where}); the batch did not run")


# The message classes a master sends on each socket (a stream id's type is the decoder's
# to check: wire.decode_body gives a stream an int, never a bool or a float).
_SENT_ON = {name: frozenset(cls for cls in wire.MESSAGES if cls.socket == name)
            for name in _ROLES.values()}


# A turn of the loop reads at most _READ_COMMANDS commands, then dispatches a slice of each
# session's (dispatcher.py): one master's flood delays another's command by a few turns.
_READ_COMMANDS = 4096


class Daemon(Dispatcher):
    """A worker daemon: one ROUTER socket for masters, a session per master."""

    def __init__(self, listen: str = "127.0.0.1:0", *, keys=None, parent_pid: int | None = None,
                 ipc: bool = False):
        host, port = split_host_port(listen, "mwrt-worker --listen")
        if host not in ("*", "0.0.0.0", "::"):
            host = resolve(host, "mwrt-worker --listen")
        if keys is None and not is_loopback(host):
            raise ConfigError(f"--listen: refusing to listen on {host} without a key "
                              "(a worker runs what masters send); pass --key-file (make one "
                              "with `mwrt-worker keygen DIR`), or listen on 127.0.0.1")
        self.keys = keys
        self._more_parked = False  # sessions have parked batches left for the next turn
        self._turns: deque[Session] = deque()  # sessions with commands in their inbox, in turn
        self._read = 0  # commands read in this turn of the loop
        self.incarnation = uuid.uuid4().hex
        self.started = time.monotonic()
        self.context = zmq.Context()
        self.authenticator = auth.start_authenticator(self.context, keys) if keys else None
        self.router = self.context.socket(zmq.ROUTER)
        if keys is not None:
            auth.serve_curve(self.router, keys)
        # No frame larger than one tensor, nor than what a session may queue, is read in.
        self.router.setsockopt(zmq.MAXMSGSIZE, min(config.get("max_tensor_bytes"),
                                                   config.get("session_inflight_bytes")) + 4096)
        self.router.setsockopt(zmq.LINGER, 0)
        try:
            self.router.bind(f"tcp://{join_host_port(host, port or '*')}")
        except zmq.ZMQError as exc:
            self.router.close(linger=0)
            if self.authenticator is not None:
                self.authenticator.stop()
            self.context.term()
            raise ConfigError(f"--listen: cannot listen on {join_host_port(host, port)} "
                              f"({exc}); pick another port with --listen HOST:PORT (port 0 "
                              "takes a free one)") from None
        self.address = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.lanes: Lanes | None = None  # the parent master's sessions' lanes (_bind_ipc)
        self._router_sent = True  # a send on the router since its last ask (serve())
        self.ipc_address, self._ipc_folder = self._bind_ipc(parent_pid) if ipc else ("", None)
        self._reply_address = f"inproc://mwrt-replies-{self.incarnation}"
        self.replies = self.context.socket(zmq.PULL)
        self.replies.bind(self._reply_address)
        self.sessions: dict[bytes, Session] = {}
        self.decoder = GraphDecoder(self.context, self._reply_address)
        self._decoded = False  # the decoder finished a graph since the last _resume()
        self.errors: deque = deque(maxlen=report.ERRORS_KEPT)  # the last ops that failed
        self.streams = quotas.StreamPool()
        self.op_slots = OpSlots(config.get("worker_slots"), config.get("turn_wait"))
        self.lease_timeout = config.get("lease_timeout")
        self.max_frame = config.get("max_frame_bytes")
        self.inline_bytes = config.get("inline_bytes")
        self.inline_op_elements = config.get("inline_op_elements")
        self.parent_pid = parent_pid
        self.stopping = False
        # stop() wakes the loop's poll: a SIGTERM alone only set the flag, which the poll
        # (retrying after the signal) saw up to 200 ms later, in every stop.
        self.waker = Waker()
        self.max_functions = max(config.get("session_functions"), 1)
        self.max_world, self.max_joins = config.get("max_world"), config.get("max_joins")
        self.max_sessions = max(config.get("max_sessions"), 1)
        self.joins = threading.BoundedSemaphore(self.max_joins)  # Joins under way (a thread each)
        self._rejections = [0.0, 0, 0]  # window start, rejections in it, not logged
        self.refusals = RefusalLog(keys is not None, self._log_rejection, _REJECTION_WINDOW)
        self._ending: list[threading.Thread] = []  # sessions being freed off the socket thread
        self.retired = dict.fromkeys(report.COUNTERS, 0)  # of sessions that ended

    def _bind_ipc(self, parent_pid: int | None) -> tuple[str, str | None]:
        """Serve masters of this host on a Unix socket too: (its address, its folder).

        The folder is mkdtemp's, mode 0700: only this user (and root) may connect. Given
        the master's pid (a local worker's --parent-pid), the kernel's word on the peer
        (SO_PEERCRED) admits that process alone, and the socket skips CURVE: that process
        is the one the session's key was made for. Else the key applies as on tcp.
        """
        folder = tempfile.mkdtemp(prefix="mwrt-worker-")
        address = f"ipc://{folder}/router"
        try:
            if parent_pid is not None:  # options are the listener's as at its bind
                self.router.setsockopt(zmq.IPC_FILTER_PID, parent_pid)
                self.router.curve_server = False
            self.router.bind(address)
        except zmq.ZMQError as exc:  # (a path too long for a Unix socket): tcp alone serves
            log.warning("not serving on %s (%s); masters reach this daemon by tcp", address, exc)
            shutil.rmtree(folder, ignore_errors=True)
            return "", None
        if parent_pid is not None and config.get("lanes"):
            try:
                self.lanes = Lanes(folder, parent_pid, int(self.router.getsockopt(
                    zmq.MAXMSGSIZE)))
            except OSError as exc:  # the master keeps to the ZeroMQ socket
                log.warning("no lane in %s (%s); the master's commands go by ZeroMQ", folder,
                            exc)
        return address, folder

    # -- the loop -------------------------------------------------------------------------

    def serve(self) -> None:
        """Run until stop() (or SIGTERM/SIGINT in the CLI)."""
        fperrors.note_in_this_thread()  # short ops run here too
        monitor = self.router.get_monitor_socket(RefusalLog.EVENTS)
        wakes = Wakes((self.router, self.replies, monitor), config.get("worker_spin_us") * 1e-6,
                      fds=(self.waker.fd,),  # stop() writes to the waker
                      unasked=(self.router, self.replies))  # _drain reads them NOBLOCK
        self.decoder.start()
        if self.lanes is not None:
            self.lanes.wakes = wakes
            wakes.watch(self.lanes)
        next_reap = time.monotonic() + 1.0
        lifecycle.off_thread(lambda: lifecycle.reap_segments(self), "mwrt-shm-reaper")
        ready: list = []
        while not self.stopping:
            if self._router_sent:  # a send on it may have taken a coming message's signal
                wakes.unsettled.add(self.router)
                self._router_sent = False
            # After a message, a short spin: waking a sleeping thread costs more than the
            # rest of a round trip on a VM, and a sync loop's next request comes within it.
            # Only while no stream runs an op: one would contend with the spin for the GIL.
            ready = wakes.spin(self._streams_idle) if ready else []
            if not ready:
                ready = wakes.wait(0 if self._more_parked or self._turns or (
                    self.lanes is not None and self.lanes.waiting) else 200)
            if self.replies in ready and self._drain(self.replies, _recv_frames, self._forward):
                wakes.unsettled.discard(self.replies)
            if self._turns:
                self._take_turns()
            if monitor in ready:  # one event read: asked again before the next sleep
                self.refusals.note(recv_monitor_message(monitor))
            if self._decoded or self._more_parked:
                self._resume()
            if time.monotonic() >= next_reap:
                self._reap()
                self.refusals.flush()
                next_reap = time.monotonic() + 1.0
            if self.lanes is not None and (ready or self.lanes.waiting):
                self._read = 0  # a bound per turn, as _drain's
                self.lanes.serve(ready, self.sessions, self._on_message, self._turn_left)
            if self.router in ready:  # last: a drain that reads it empty leaves it settled
                self._read = 0  # commands read: _on_message counts them, _drain stops past a bound
                if self._drain(self.router, wire.recv_routed, self._on_message):
                    wakes.unsettled.discard(self.router)
        self.refusals.drain(monitor)
        self.refusals.flush()
        self.router.disable_monitor()
        monitor.close(linger=0)
        self.close()
        self.waker.close()

    def _turn_left(self) -> bool:
        """Whether this turn may read more commands (_drain's bound)."""
        return self._read <= _READ_COMMANDS

    def _streams_idle(self) -> bool:
        """True when no stream of any session has an op queued or running."""
        return all(executor.idle() for session in self.sessions.values()
                   for executor in session.streams.values())

    def _log_rejection(self, message: str, *args) -> None:
        """Log a refused frame or connection: a flood of them must not flood the log."""
        now = time.monotonic()
        if now - self._rejections[0] > _REJECTION_WINDOW:
            if self._rejections[2]:
                log.warning("(%d more rejections in the last %.0f s were not logged)",
                            self._rejections[2], _REJECTION_WINDOW)
            self._rejections = [now, 0, 0]
        self._rejections[1] += 1
        if self._rejections[1] <= _REJECTIONS_LOGGED:
            log.warning(message, *args)
        else:
            self._rejections[2] += 1

    def stop(self) -> None:
        """End serve() at once (from a signal handler or another thread)."""
        self.stopping = True
        self.waker.wake()

    def close(self, grace: float = 2.0) -> None:
        """Close every session and socket; streams get `grace` seconds to finish their op."""
        for thread in self._ending:  # sessions being freed: their segments must go too
            thread.join(grace)
        threads = [ex.thread for session in self.sessions.values()
                   for ex in session.streams.values()]
        for session in list(self.sessions.values()):
            session.close()
        self.sessions.clear()
        self.router.close(linger=0)
        if self.lanes is not None:
            self.lanes.close_all()
        self.decoder.stop()
        if self.authenticator is not None:
            self.authenticator.stop()
        deadline = time.monotonic() + grace
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0))
        # Only now: an op finishing as we stop sends its (unread) reply here, and a PUSH
        # with no PULL left to take it would block that stream until the grace ran out.
        self.replies.close(linger=0)
        if self._ipc_folder is not None:
            shutil.rmtree(self._ipc_folder, ignore_errors=True)
        busy = [t.name for t in threads if t.is_alive()]
        if busy:  # a user function still running: context.term() would wait for it
            log.warning("stopping with %d stream(s) still running an op (%s); not waiting",
                        len(busy), ", ".join(busy))
            return
        self.context.term()

    def _drain(self, sock, read, handle) -> bool:
        """Read and handle `sock`'s messages; True if it was read empty, False if a bound
        ended the turn with messages left."""
        # Bounded, so replies and requests take turns. The wait (or the spin) found the first
        # message: it is read at once (NOBLOCK, a wait of none), the next ones after EVENTS
        # says they are there, which costs a system call but avoids a zmq.Again per wake-up.
        # Requests are read as bytes (recv_routed): commands and inline frames are small, and
        # a Frame object costs more than copying them.
        for _ in range(1000):
            try:
                frames = read(sock)
            except zmq.Again:  # read empty (the wait saw the descriptor fire, or another call)
                return True
            handle(frames)
            # A turn ends after so many commands or so long (a Replay is one command that
            # runs many): the replies, and the other masters' slices, come next.
            if self._read > _READ_COMMANDS:
                self._read = 0
                return False
            if not sock.getsockopt(_EVENTS) & _POLLIN:
                return True
        return False

    def _forward(self, frames) -> None:
        if len(frames) == 1:  # not a reply (identity, message): the graph decoder's wake
            self._decoded = True
            return
        lanes = self.lanes
        if lanes is None or not lanes.send(frames[0].bytes, frames[1:]):
            self.router.send_multipart(frames, copy=False)
            self._router_sent = True

    # -- requests -------------------------------------------------------------------------

    def _on_message(self, frames) -> None:
        identity = frames[0]
        sid, _, role = identity.rpartition(b"/")
        try:
            seq, body, data = wire.open_envelope(frames[1:], self.max_frame)
            commands = wire.decode_body(body)
            self._read += len(commands)
            _check_socket(role, commands)
        except WireError as exc:
            self._log_rejection("rejected a message from %r: %s", identity[:40], exc)
            # A master reads replies on its rx socket only.
            reply_to = sid + b"/" + RX if role == TX else identity
            self.send(reply_to, wire.Failed(token=-1, info={"kind": "wire",
                                                            "message": str(exc)}))
            return
        try:
            self._route(identity, sid, role, seq, commands, body, data)
        except Exception as exc:  # noqa: BLE001 - ill-typed fields: the loop must outlive them
            self._log_rejection("rejected a message from %r: %s: %s", identity[:40],
                        type(exc).__name__, exc)
            reply_to = sid + b"/" + RX if role == TX else identity
            self.send(reply_to, wire.Failed(token=-1, info={
                "kind": "wire", "message": f"wire: a command has a field of the wrong type "
                f"({type(exc).__name__}: {exc}); it and the rest of its batch did not run"}))

    def _route(self, identity, sid, role, seq, commands, body, data) -> None:
        if role == HB:
            self._on_heartbeat(identity, sid, commands)
        elif role == RX and len(commands) == 1:
            self._hello(sid, commands[0])
        elif role == TX:
            self._on_batch(sid, seq, commands, body, data)
        else:
            self._log_rejection("rejected a message from %r: expected one Hello on rx",
                                identity[:40])
            self.send(identity, wire.Failed(token=-1, info={
                "kind": "wire", "message": "wire: expected one Hello on SESSION/rx (got "
                f"{len(commands)} commands)"}))

    def _on_heartbeat(self, identity, sid, commands) -> None:
        session = self.sessions.get(sid)
        if session is not None:
            session.last_seen = time.monotonic()
        for command in commands:
            if isinstance(command, wire.Ping):  # answered even to a master without a session
                self.send(identity, wire.Pong(token=command.id, incarnation=self.incarnation))
            elif session is not None:
                routes.SESSION[type(command)](self, session, command)

    # -- the daemon, as session commands see it ------------------------------------------

    def report(self) -> dict:
        """The daemon as `mwrt status` shows it (mwrt.worker.report)."""
        return report.worker(self)

    def retire(self, session) -> None:
        """Keep the counters of a session that ends (socket thread, as report())."""
        report.add_counters(self.retired, session)

    def _hello(self, sid, command) -> Session | None:
        identity = sid + b"/" + RX
        session, resumed = lifecycle.named(self, lifecycle.session_of(sid)), None
        if session is not None and session.sid != sid and lifecycle.may_reattach(session):
            del self.sessions[session.sid]
            self.sessions[sid] = session
            session.attach(sid, command.master)
            resumed = session.resumed()
            log.info("session %s re-attached by %s as node %d", command.session,
                     command.master, command.node)
        else:
            refusal = lifecycle.refuse_hello(self, sid, command)
            if refusal:
                self._log_rejection("refused a Hello from %r: %s", identity[:40], refusal)
                self.send(identity, wire.Failed(command.id, {"kind": "session",
                                                             "message": refusal}))
                return None
            session = Session(self, sid, command.session, command.master, command.node)
            self.sessions[sid] = session
            log.info("session %s opened by %s as node %d", command.session, command.master,
                     command.node)
        session.grace = lifecycle.grace(self, command)
        from .. import arrays

        gpus = arrays.devices()
        self.send(identity, wire.Welcome(token=command.id, incarnation=self.incarnation,
                                         hostname=socket.gethostname(), pid=os.getpid(),
                                         devices=len(gpus), data_address="", gpus=tuple(gpus),
                                         resumed=resumed or {},
                                         streams=self.streams.per_session))
        return session

    def end_session(self, session, answer=None) -> None:
        """Forget `session` and free it off the socket thread (lifecycle.end)."""
        self._ending = [t for t in self._ending if t.is_alive()]
        self._ending.append(lifecycle.end(self, session, answer))

    # -- helpers --------------------------------------------------------------------------

    def send(self, identity: bytes, message, frames=()) -> None:
        """Send one reply from the socket thread: on its session's lane if it has one."""
        lanes = self.lanes
        if lanes is None or identity not in lanes.by_identity:
            wire.send(self.router, identity, message, frames)
            self._router_sent = True
        else:
            lanes.send(identity, wire.parts(message, frames))

    def refuse(self, session, kind: str, message: str) -> None:
        """Report a failure no waiter owns: the master raises it at its next wait on the node."""
        self.send(session.identity, wire.Failed(token=-1, info={"kind": kind, "message": message}))

    def reply_socket(self) -> zmq.Socket:
        """A PUSH socket into the reply queue, for one executor thread."""
        sock = self.context.socket(zmq.PUSH)
        sock.connect(self._reply_address)
        return sock

    def _reap(self) -> None:
        now = time.monotonic()
        for session in list(self.sessions.values()):
            if now - session.last_seen > self.lease_timeout + session.grace:
                log.warning("session %s of %s: no word for %.1f s, freeing it", session.id,
                            session.master, now - session.last_seen)
                self.end_session(session)
        if self.parent_pid is not None and not process_alive(self.parent_pid):
            log.warning("parent process %d is gone; stopping", self.parent_pid)
            self.stopping = True

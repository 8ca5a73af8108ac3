"""A stream's executor: one thread running that stream's commands in order.

Errors are sticky per stream, as in CUDA: after a command fails, the stream skips its
commands (their results are poisoned with the same error) until a sync point reports
the error to the master; then the stream runs again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback

import zmq

from .. import arrays
from ..protocol import wire
from . import calls, fperrors, handlers, report, routes, tensors
from .compiled import Prepared

log = logging.getLogger("mwrt.worker")
_get_ident = threading.get_ident


class StreamExecutor:
    """Runs one stream's commands on its own thread, in issue order."""

    def __init__(self, session, stream_id: int, device: int):
        self.session, self.id, self.device = session, stream_id, device
        self.xp = arrays.namespace(device)
        self.error: dict | None = None
        self.warned: list = []  # (command id, text) NumPy warned of, for the next answer
        self.stopped = False
        self.pending = 0  # batches queued and not finished; changed under _lock
        # Batches queued, batches taken, and the last one mwrt.cancel() dropped (the rest of
        # the one running then included): under _lock.
        self.submitted = self.taken = self.drop_through = 0
        # (command, monotonic start) running now: what a wait waits on
        self.running: tuple[wire.Command, float] | None = None
        # (Call, args, kwargs, result Specs) that the socket thread's quick_call worked out
        # for the Call it runs next: resolved and checked once, not twice.
        self.prepared: tuple | None = None
        # For `mwrt status`: commands run and bytes moved (inline frames and data channel).
        # Plain ints, written by the thread running the stream's commands: no lock.
        self.ops = self.bytes_in = self.bytes_out = 0
        self.torch_stream = None  # on a GPU: torch's stream over this one's, once torch runs
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._reply_socket = None
        # Ops take a turn at the daemon's slots (mwrt.worker.slots): a remote() function
        # anywhere, and a Call on the host (on a GPU it only launches kernels).
        self._turned = ((wire.Remote,) if device != arrays.HOST
                        else (wire.Remote, wire.Call, wire.CallGet))
        self.in_turn = False  # this stream holds a slot (a replay's commands take no other)
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"mwrt-stream-{session.node}-{stream_id}")
        self.thread.start()
        self.ident = self.thread.ident  # (Thread.ident is a property: read once)

    def submit(self, commands: list, frames: list) -> None:
        """Queue a list of commands (with the batch's data frames) for this stream."""
        with self._lock:
            self.pending += 1
            self.submitted += 1
        self._queue.put((commands, frames))

    def cancel(self) -> None:
        """Drop the commands queued now (mwrt.cancel()), those of the batch running now that
        have not started included: what they would make is poisoned as cancelled; frees,
        events and answers still run. The command running now runs to its end."""
        with self._lock:
            self.drop_through = self.submitted

    def idle(self) -> bool:
        """True when everything submitted so far has run."""
        return self.pending == 0

    def stop(self) -> None:
        """Finish the current command, drop the queued ones, and end the thread."""
        self.stopped = True
        self._queue.put(None)

    def reply(self, message, frames=()) -> None:
        """Send a reply to the session's master through the daemon's socket thread."""
        self.send(self.session.identity, message, frames)

    def send(self, identity: bytes, message, frames=()) -> None:
        """Send a message to `identity`: directly when called on the socket thread."""
        if _get_ident() != self.ident:  # the socket thread's own socket
            self.session.daemon.send(identity, message, frames)
            return
        wire.send(self._reply_socket, identity, message, frames)

    def _run(self) -> None:
        sock = self._reply_socket = self.session.daemon.reply_socket()
        fperrors.note_in_this_thread()
        try:
            with arrays.use_device(self.device), self._device_stream():
                while True:
                    item = self._queue.get()
                    if item is None:
                        break
                    commands, frames = item
                    with self._lock:
                        self.taken += 1
                        number = self.taken
                    try:
                        if type(commands) is Prepared:  # a graph's replay
                            self._replay(commands)
                        else:
                            for command in commands:
                                if number <= self.drop_through and not command.always_runs:
                                    self._drop(command)
                                else:
                                    self.execute_safely(command, frames)
                    finally:
                        with self._lock:
                            self.pending -= 1
        finally:
            sock.close(linger=1000)

    def _replay(self, prepared: Prepared) -> None:
        """Run a graph's share of this stream: in one turn on the host, unless it waits on
        other streams (then its remote() functions take theirs, its ops none)."""
        if not (prepared.computes_only and self.device == arrays.HOST):
            prepared.run(self)
            return
        if self._take_turn():
            try:
                prepared.run(self)
            finally:
                self._give_turn()

    def _take_turn(self) -> bool:
        """Wait for a slot to run an op in; False once the session ended meanwhile."""
        slots = self.session.daemon.op_slots
        slots.take(self.session)
        if self.stopped:
            slots.give()
            return False
        self.in_turn = True
        return True

    def _give_turn(self) -> None:
        self.in_turn = False
        self.session.daemon.op_slots.give()

    def _drop(self, command) -> None:
        """Skip a cancelled command: what it would make is poisoned, naming mwrt.cancel()."""
        self.skip(command, {
            "kind": "remote", "type": "Cancelled", "node": self.session.node,
            "device": self.device, "stream": self.id, "op": handlers.op_name(command),
            "shapes": (), "command": command.id, "traceback": "",
            "message": "dropped by mwrt.cancel() before it ran"})

    def _device_stream(self):
        """On a GPU, this stream's kernels go to a CuPy stream of its own (CUDA semantics)."""
        if self.device == arrays.HOST:
            import contextlib

            return contextlib.nullcontext()
        self.cuda_stream = self.xp.cuda.Stream(non_blocking=True)
        return self.cuda_stream

    def use_torch_stream(self) -> None:
        """On a GPU, torch's kernels go to this stream's CUDA stream, as CuPy's do: a torch
        stream over it (torch.cuda.ExternalStream), made torch's current stream of this
        thread, so the stream's events and synchronize() order torch's work too."""
        if self.device == arrays.HOST or self.torch_stream is not None:
            return
        import torch

        if not torch.cuda.is_available() or self.device >= torch.cuda.device_count():
            raise RuntimeError(
                f"torch: node {self.session.node} device {self.device}: torch sees "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 'no'} CUDA "
                "devices (a GPU mwrt fakes holds NumPy arrays, not torch's); keep torch tensors "
                "in host memory (device=-1), or install torch built with CUDA on this worker")
        device = torch.device("cuda", self.device)
        self.torch_stream = torch.cuda.ExternalStream(self.cuda_stream.ptr, device=device)
        torch.cuda.set_stream(self.torch_stream)

    def synchronize_device(self) -> None:
        """Wait until the GPU has run every kernel this stream launched (no-op on the host)."""
        if self.device != arrays.HOST:
            self.cuda_stream.synchronize()

    def execute_safely(self, command, frames) -> None:
        """execute(), but a command too malformed even to report on must not end the stream."""
        try:
            self.execute(command, frames)
        except zmq.ContextTerminated:  # the daemon is stopping (Ctrl-C): no one to answer
            return
        except Exception as exc:  # noqa: BLE001 - logged; the stream must outlive any command
            log.warning("node %s stream %s: dropped a malformed %s (%s: %s)", self.session.node,
                        self.id, type(command).__name__, type(exc).__name__, exc)

    def execute(self, command, frames) -> None:
        """Run one command, turning its failure into this stream's sticky error."""
        if self.stopped:  # the session ended: its queued work has no one to answer to
            return
        if self.error is not None and not command.always_runs:
            self.skip(command, self.error)
            return
        own = _get_ident() == self.ident  # else the socket thread runs it inline
        # Not on the socket thread (its inline ops are short), nor twice in a replay's turn.
        turn = own and type(command) in self._turned and not self.in_turn
        if turn and not self._take_turn():
            return
        trace = self.session.trace
        start = time.time() if trace is not None else 0.0
        self.ops += 1
        if own:  # (what status says a stream runs: an inline run ends before it can ask)
            self.running = (command, time.monotonic())
        try:
            routes.STREAM[type(command)](self, command, frames)
        except tensors.PoisonedInput as exc:
            self.fail(command, exc.info)
        except Exception as exc:  # noqa: BLE001 - the op's error, sent to the master
            self.fail(command, self.describe(command, exc))
        except BaseException as exc:  # a function's sys.exit(): uncaught, it ended the stream's
            if not own:  # thread, whose queue no one ran again (the master waited for ever);
                raise  # on the socket thread, the daemon's own Ctrl-C: it stops the daemon
            self.fail(command, self.describe(command, exc))
        finally:
            self.running = None
            if turn:
                self._give_turn()
            if fperrors.NOTED:  # a remote() function's, a collective's: as an op's
                fperrors.claim(self.warned, command.id, handlers.op_name(command),
                               calls.KEPT_WARNINGS)
        if trace is not None:
            trace.append((self.device, self.id, handlers.op_name(command), start, time.time(),
                          handlers.arg_shapes(self, command)))

    def skip(self, command, info: dict) -> None:
        """Skip a command (its stream failed, or mwrt.cancel() dropped it): what it would
        make is poisoned with `info`. A CallGet's read still answers, as a Get after its
        Call would: with the stream's sticky error, else with `info`."""
        handlers.poison(self, command, info)
        if type(command) is wire.CallGet and not self.raise_sticky(command.token):
            self.fail(command, info)

    def fail(self, command, info: dict) -> None:
        """Report `command`'s failure: as its answer if the master waits, else as sticky.
        Either way what it would have made is poisoned (a CallGet's result, read again,
        raises the same error)."""
        token = command.token if command.answered else -1
        report.note_error(self.session, info)
        handlers.poison(self, command, info)
        if token >= 0:  # the master waits on this command's result: the error is its answer
            self.send_warnings()
            self.reply(wire.Failed(token=token, info=info))
            return
        self.error = info

    def describe(self, command, exc: BaseException) -> dict:
        """The error report: what failed, where, on which arguments, and the traceback."""
        kind, message = handlers.explain(self, exc)
        return {
            "kind": "remote", "type": kind, "message": message,
            "node": self.session.node, "device": self.device, "stream": self.id,
            "op": handlers.op_name(command), "shapes": handlers.arg_shapes(self, command),
            "command": command.id, "traceback": traceback.format_exc(),
        }

    def raise_sticky(self, token: int) -> bool:
        """At a sync point: report and clear the sticky error; True if there was one."""
        if self.warned:
            self.send_warnings()
        if self.error is None:
            return False
        info, self.error = self.error, None
        self.reply(wire.Failed(token=token, info=info))
        return True


    def send_warnings(self) -> None:
        """Send the warnings NumPy gave on this stream's ops, ahead of the answer that follows."""
        if self.warned:
            warned, self.warned = self.warned, []
            self.reply(wire.Warned(token=-2, warnings=tuple(warned)))

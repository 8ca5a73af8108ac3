"""The master's background thread: heartbeats, event relays between nodes, straggler batches.

Each worker gets a third socket (SESSION/hb) owned by this thread alone. A worker is
declared lost when its connection drops (a socket monitor sees it at once), when it
stays silent past the heartbeat timeout, or when it answers with a new incarnation
(it was restarted). Events recorded on one node and awaited on another are relayed
here, so the master's own thread never has to be waiting for them to fire.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

import zmq

from .. import config
from ..netio import Waker
from ..protocol import wire
from ..protocol.lane import CONNECTION_CLOSED
from ..protocol.refusals import recv_monitor_message
from .client import dealer

log = logging.getLogger("mwrt")

_STRAGGLER_AGE = 2e-3  # seconds a batch may wait for more rows before this thread sends it


class Heartbeat(threading.Thread):
    """Pings workers, relays events, flushes stale batches; marks silent workers lost."""

    def __init__(self, cluster):
        super().__init__(name="mwrt-heartbeat", daemon=True)
        self.cluster = cluster
        self.interval = config.get("heartbeat_interval")
        self.timeout = config.get("heartbeat_timeout")
        self.relays: dict[int, tuple[int, list[int]]] = {}  # event -> (its node, waiting nodes)
        # Recorded events by id, held weakly: the master learns when each fires, and forgets
        # events the program dropped, so a long run does not accumulate them. (streams.Event,
        # a layer above: read here by its _id and _fired only.)
        self.recorded: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.lock = threading.Lock()
        self._stop_event = threading.Event()
        self._waker = Waker()  # stop() ends the poll's 50 ms wait: shutdown waits on it
        self._outbox: list = []  # (node index, message), sent by this thread
        sid = cluster.connection_id.encode()
        self.sockets = [dealer(cluster.context, sid + b"/hb", n.route, n.route_keys)
                        for n in cluster.nodes]
        self.monitors = [s.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
                         for s in self.sockets]
        self.connected = [False] * len(self.sockets)
        self.announced: set[int] = set()  # lost nodes the others were told about
        self.last_pong = [time.monotonic()] * len(self.sockets)

    def age(self, index: int) -> float:
        """Seconds since node `index` last answered a ping."""
        return time.monotonic() - self.last_pong[index]

    def stop(self) -> None:
        self._stop_event.set()
        self._waker.wake()
        self.join(timeout=2.0)
        if not self.is_alive():
            self._waker.close()

    def watch(self, event) -> None:
        """Note a recorded event, so its firing can be seen here."""
        with self.lock:
            self.recorded[event._id] = event

    def relay(self, event, from_node: int, to_node: int) -> bool:
        """Ask for `event` of `from_node` to be relayed to `to_node`; False if it fired."""
        with self.lock:
            if event._fired:
                return False
            self.relays.setdefault(event._id, (from_node, []))[1].append(to_node)
            return True

    def run(self) -> None:
        poller = zmq.Poller()
        for sock, monitor in zip(self.sockets, self.monitors):
            poller.register(sock, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        next_ping = 0.0
        try:
            while not self._stop_event.is_set():
                now = time.monotonic()
                if now >= next_ping:
                    self._ping_all(now)
                    next_ping = now + self.interval
                for sock in dict(poller.poll(50)):
                    if sock != self._waker.fd:
                        self._on_readable(sock)
                for node in self.cluster.nodes:
                    node.flush_stale(time.monotonic(), _STRAGGLER_AGE)
                self._fail_relays_of_lost_nodes()
                self._announce_lost_nodes()
        except Exception:  # the master must learn why its heartbeat stopped
            log.exception("mwrt heartbeat thread failed")
        finally:
            for sock, monitor in zip(self.sockets, self.monitors):
                sock.disable_monitor()
                monitor.close(linger=0)
                sock.close(linger=0)

    def _ping_all(self, now: float) -> None:
        for index, node in enumerate(self.cluster.nodes):
            if node.lost is not None or node.closed:
                continue
            silent = now - self.last_pong[index]
            if silent > self.timeout and now > node.quiet_until:
                node.mark_lost(f"no heartbeat for {silent:.1f} s (MWRT_HEARTBEAT_TIMEOUT="
                               f"{self.timeout})")
                continue
            self._send(index, wire.Ping(id=0))

    def _send(self, index: int, message) -> None:
        wire.send(self.sockets[index], None, message)

    def _on_readable(self, sock) -> None:
        if sock in self.monitors:
            index = self.monitors.index(sock)
            event = recv_monitor_message(sock)["event"]
            if event == zmq.EVENT_CONNECTED:
                self.connected[index] = True
            elif event == zmq.EVENT_DISCONNECTED and self.connected[index]:
                self.cluster.nodes[index].mark_lost(CONNECTION_CLOSED)
            return
        index = self.sockets.index(sock)
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                (message,) = wire.decode(frames)[1]
            except Exception as exc:  # noqa: BLE001 - logged; the heartbeat goes on
                log.error("node %d: undecodable heartbeat reply: %s", index, exc)
                continue
            self._on_message(index, message)

    def _on_message(self, index: int, message) -> None:
        node = self.cluster.nodes[index]
        if isinstance(message, wire.Pong):
            self.last_pong[index] = time.monotonic()
            # A pong proves a connection: the monitor may have missed EVENT_CONNECTED (it is
            # attached after connect), and without it a disconnect would go unnoticed.
            self.connected[index] = True
            if node.info is not None and message.incarnation != node.info.incarnation:
                node.mark_lost("the worker restarted (new incarnation); its tensors are gone")
        elif isinstance(message, wire.Fired):
            with self.lock:
                event = self.recorded.get(message.event)
                if event is not None and event._id == message.event:
                    event._fired = True
                _, waiting = self.relays.pop(message.event, (index, []))
            for to_node in waiting:
                self._send(to_node, wire.EventDone(id=0, event=message.event, error=""))

    def _announce_lost_nodes(self) -> None:
        """Tell every surviving worker once that a node is gone, so whatever waits on it over
        the data channel (a transfer, a collective) fails now, naming it."""
        for index, node in enumerate(self.cluster.nodes):
            if node.lost is None or index in self.announced:
                continue
            self.announced.add(index)
            channel = self.cluster._channel  # the master's own transfers to it fail now too
            if channel is not None:
                channel.fail_peer(index, f"node {index} is lost ({node.lost})")
            for other, peer in enumerate(self.cluster.nodes):
                if peer.lost is None and not peer.closed:
                    self._send(other, wire.PeerLost(id=0, rank=index, reason=node.lost))

    def _fail_relays_of_lost_nodes(self) -> None:
        """Waiters on events of a lost node get an error instead of waiting forever."""
        if not self.relays:
            return
        with self.lock:
            doomed = [(event, entry) for event, entry in self.relays.items()
                      if self.cluster.nodes[entry[0]].lost is not None]
            for event, _ in doomed:
                del self.relays[event]
        for event, (from_node, waiting) in doomed:
            reason = f"node {from_node}, which records it, is lost"
            for to_node in waiting:
                if self.cluster.nodes[to_node].lost is None:
                    self._send(to_node, wire.EventDone(id=0, event=event, error=reason))

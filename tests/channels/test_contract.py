"""The channel contract's rules: capabilities declared with defaults, registration checked,
native collectives found by name, attachments that leave and close with their channel."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mwrt import channels, config
from mwrt.channels import DataChannel
from mwrt.channels.inproc import InprocChannel
from mwrt.collective import api as C
from mwrt.collective import native
from mwrt.collective.group import ProcessGroup
from mwrt.errors import ConfigError
from mwrt.store import HashStore

pytestmark = pytest.mark.timeout(60)


class _Minimal(DataChannel):
    """A third-party channel that declares no capability: only _send and _recv (over an
    inproc channel it keeps inside)."""

    name = "minimal"

    def __init__(self, rank, world_size, *, store, **kwargs):
        super().__init__(rank, world_size, store=store, **kwargs)
        self.inner = InprocChannel(rank, world_size, store=store, prefix="minimal")

    def _send(self, view, peer, tag, timeout, desc):
        self.inner.send(view, peer, tag, timeout)

    def _recv(self, view, peer, tag, timeout, desc):
        self.inner.recv(view, peer, tag, timeout)

    def _close(self):
        self.inner.close()


def test_a_channel_that_declares_nothing_gets_the_defaults():
    ch = _Minimal(0, 1, store=HashStore(timeout=5))
    try:
        assert (ch.buffered_sends, ch.any_size_recv, ch.posted_receives, ch.device_buffers,
                ch.eager_bytes, ch.native_collectives) == (False, False, False, False, None,
                                                           None)
        assert ch.gone(0) is None and ch.shares_host(0)
        g = ProcessGroup(ch)
        assert g.eager_bytes == config.get("eager_bytes")
        assert not (g.speculates or g.carries_checks or g.posted_receives or g.device_buffers)
        assert g.natives is None and g.turns is None
    finally:
        ch.close()


def test_collectives_run_over_a_channel_that_declares_nothing():
    """The generic algorithms, with the agreement check as a round of its own."""
    store, n = HashStore(timeout=10), 3
    chans = [_Minimal(r, n, store=store, timeout=10) for r in range(n)]
    out, errors = [None] * n, []

    def rank(r):
        try:
            a = np.arange(10, dtype=np.float64) + r
            C.all_reduce(ProcessGroup(chans[r]), a)
            out[r] = a
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for ch in chans:
        ch.close()
    assert not errors, errors
    for a in out:
        np.testing.assert_array_equal(a, np.arange(10) * n + 3)


@pytest.fixture
def registry(monkeypatch):
    """The channel registry, restored after the test."""
    monkeypatch.setattr(channels, "_REGISTRY", dict(channels._REGISTRY))


class _NotAChannel:
    name = "fake"

    def send(self, buf, peer, tag=0, timeout=None):
        pass


class _Abstract(DataChannel):
    def _send(self, view, peer, tag, timeout, desc):
        pass


def test_a_class_that_is_not_a_data_channel_is_refused_naming_what_it_lacks(registry):
    with pytest.raises(TypeError, match=r"not a DataChannel subclass \(it lacks recv, isend"):
        channels.register("fake", _NotAChannel)
    with pytest.raises(TypeError, match="register the class, not an instance"):
        channels.register("fake", _Minimal(0, 1, store=HashStore(timeout=1)))
    with pytest.raises(TypeError, match=r"_Abstract does not implement _recv"):
        channels.register("fake", _Abstract)
    assert "fake" not in channels.known()


def test_a_data_channel_subclass_registers_and_is_found(registry):
    channels.register("minimal", _Minimal)
    assert channels.get("minimal") is _Minimal
    ch = channels.create("minimal", 0, 1, store=HashStore(timeout=1))
    ch.close()


def test_native_collectives_are_found_by_name_or_refused(monkeypatch):
    class Unknown(InprocChannel):
        native_collectives = "no-such-natives"

    ch = Unknown(0, 1, store=HashStore(timeout=1))
    try:
        with pytest.raises(ConfigError, match=r"unknown native collectives 'no-such-natives' "
                                              r"\(known: cma"):
            ProcessGroup(ch)
        with pytest.raises(TypeError, match="expected a NativeCollectives subclass"):
            native.register("mine", object)

        class Barrier(native.NativeCollectives):
            kinds = frozenset({"barrier"})

        monkeypatch.setattr(native, "_REGISTRY", dict(native._REGISTRY))
        native.register("mine", Barrier)
        monkeypatch.setattr(Unknown, "native_collectives", "mine")
        g = ProcessGroup(ch)
        assert type(g.natives) is Barrier and g.natives.group is g and g.turns is None
    finally:
        ch.close()


class _Attached:
    def __init__(self, log):
        self.log = log

    def leave(self):
        self.log.append("leave")

    def close(self):
        self.log.append("close")


def test_attachments_are_made_once_and_leave_and_close_with_the_channel():
    ch, log = InprocChannel(0, 1, store=HashStore(timeout=1)), []
    made = [ch.attachment("k", lambda: _Attached(log)) for _ in range(3)]
    assert made[0] is made[1] is made[2]
    assert ch.attachment("none", lambda: None) is None  # "tried, not possible" is kept too
    assert ch.attachment("none", lambda: _Attached(log)) is None
    ch.leave()
    assert log == ["leave"]
    ch.close()
    assert log == ["leave", "leave", "close"]  # a closing channel leaves first


class _InOrder(native.NativeCollectives):
    """A native barrier that must run in sequence order (as CMA's collectives)."""

    kinds, checks_calls, in_order = frozenset({"barrier"}), True, True

    def run(self, kind, call, *args):
        call.take_check()
        return True


class _InOrderChannel(InprocChannel):
    native_collectives = _InOrder


def test_a_call_that_fails_to_start_does_not_hold_up_the_next():
    ch = _InOrderChannel(0, 2, store=HashStore(timeout=2), timeout=2)
    try:
        g = ProcessGroup(ch)
        with pytest.raises(ValueError):
            with g.collective("no-such-kind"):
                pass
        C.barrier(g)  # call #1 waits for #0 to end: it did, though it never started
        assert g.turns.low == 2
    finally:
        ch.close()

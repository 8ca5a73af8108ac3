"""Bad inputs (issue 6): replayed batches run once; decoders raise only WireError and never run
code; thousands of malformed frames leave a live daemon and a live data channel serving."""

from __future__ import annotations

import os
import pickle
import random
import socket
import threading
import time

import msgspec
import numpy as np
import pytest
import zmq
from tests.support.daemons import stop_worker
from tests.support.faultkit import TALLY, fd_count, start_logged_worker, still_talks, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

import mwrt
from mwrt import channels
from mwrt.channels import sockets
from mwrt.errors import WireError
from mwrt.ops import numpy_allowlist
from mwrt.protocol import auth, wire
from mwrt.store import HashStore

pytestmark = pytest.mark.timeout(120)

# A daemon under fuzzing: small limits, so hostile commands cannot hold it for long.
FUZZ_ENV = {"MWRT_MAX_TENSOR_BYTES": str(16 << 20), "MWRT_SYNC_TIMEOUT": "2",
            "MWRT_CHANNEL_TIMEOUT": "2", "MWRT_RENDEZVOUS_TIMEOUT": "2",
            "MWRT_LEASE_TIMEOUT": "30"}


class RawMaster:
    """A master made of bare DEALER sockets (SESSION/rx, /tx, /hb): sends what it is told."""

    def __init__(self, address: str, session: str = "raw"):
        self.context = zmq.Context()
        self.sid = session.encode()
        self.socks = {}
        for role in (b"rx", b"tx", b"hb"):
            sock = self.socks[role] = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, self.sid + b"/" + role)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
        self.socks[b"rx"].send_multipart(wire.encode(0, [wire.Hello(1, session, "raw-master",
                                                                     0)]))
        assert isinstance(self.recv(b"rx", 10), wire.Welcome)

    def batch(self, seq: int, commands, frames=()) -> None:
        self.socks[b"tx"].send_multipart([wire.envelope(seq, wire.encode_body(commands)),
                                          *frames])

    def recv(self, role=b"rx", timeout: float = 5.0):
        sock = self.socks[role]
        if not sock.poll(timeout * 1000):
            return None
        return wire.decode(sock.recv_multipart())[1][0]

    def alive(self, timeout: float = 5.0) -> bool:
        """Ping on hb: True once a Pong comes back (other replies are skipped)."""
        hb = self.socks[b"hb"]
        hb.send_multipart(wire.encode(0, [wire.Ping(0)]))
        deadline = time.monotonic() + timeout
        while hb.poll(max(deadline - time.monotonic(), 0) * 1000):
            if isinstance(wire.decode(hb.recv_multipart())[1][0], wire.Pong):
                return True
        return False

    def drain(self) -> None:
        for sock in self.socks.values():
            while sock.poll(0):
                sock.recv_multipart()

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close(0)
        self.context.term()


@pytest.fixture
def daemon(tmp_path):
    """An unkeyed daemon (raw ZeroMQ clients get in) with fuzzing limits: (process, address)."""
    mwrt.shutdown()
    process, address = start_logged_worker(tmp_path / "worker.log", env=FUZZ_ENV)
    process.log = tmp_path / "worker.log"
    yield process, address
    mwrt.shutdown()
    stop_worker(process)


def _ask(master: RawMaster, seq: int, ref: int, token: int):
    master.batch(seq, [wire.Get(seq * 100, -1, ref, token)])
    reply = master.recv()
    assert isinstance(reply, wire.Data), reply
    return reply


@pytest.mark.quick
def test_a_resent_batch_is_not_run_twice(daemon):
    _, address = daemon
    master = RawMaster(address)
    try:
        master.batch(1, [wire.Create(10, -1, 5, "zeros", (4,), "<i8", -1, ())])
        add = [wire.Call(20, -1, (), "add_", (wire.Ref(5), 1), {})]
        master.batch(2, add)
        master.batch(2, add)  # resent
        master.batch(1, [wire.Create(11, -1, 5, "zeros", (4,), "<i8", -1, ())])  # an old one
        master.batch(3, [wire.Call(30, -1, (), "add_", (wire.Ref(5), 10), {})])
        master.batch(3, add)  # a new command under an old number is dropped too
        master.batch(0, add)
        master.socks[b"tx"].send_multipart(wire.encode(4, [wire.Get(40, -1, 5, 7)]))
        reply = master.recv()
        assert isinstance(reply, wire.Data), reply
        assert reply.token == 7
        # Every resend above would have changed the sum: 1 + 10 proves each ran once.
        master.socks[b"tx"].send_multipart(wire.encode(4, [wire.Get(41, -1, 5, 8)]))  # resent
        assert master.recv(timeout=1.0) is None
        master.batch(5, [wire.Get(50, -1, 5, 9)])
        frames = master.socks[b"rx"].recv_multipart() if master.socks[b"rx"].poll(5000) else None
        assert frames is not None
        np.testing.assert_array_equal(np.frombuffer(wire.decode(frames)[2][0], np.int64), [11] * 4)
    finally:
        master.close()


# -- the command decoder, fuzzed in-process ------------------------------------------------

EXTS = st.builds(msgspec.msgpack.Ext, st.integers(0, 127), st.binary(max_size=64))
ARRAY_EXTS = st.builds(
    lambda dtype, shape, raw: msgspec.msgpack.Ext(wire.EXT_ARRAY, msgspec.msgpack.encode(
        [dtype, shape, raw])),
    st.one_of(st.sampled_from(["<f4", "|O", "O", "V8", "<U3", "i8,O", "(2,3)f4", "M8[s]", "zz",
                               "S0", "<f4\x00"]), st.text(max_size=8)),
    st.lists(st.integers(-(1 << 62), 1 << 62), max_size=4),
    st.binary(max_size=64))
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1),
                   st.floats(), st.text(max_size=16), st.binary(max_size=32), EXTS, ARRAY_EXTS)
KEYS = st.one_of(st.text(max_size=4), st.integers(-(1 << 63), (1 << 63) - 1))
VALUES = st.recursive(LEAVES, lambda kids: st.one_of(
    st.lists(kids, max_size=6), st.dictionaries(KEYS, kids, max_size=4)), max_leaves=12)
ROWS = st.lists(st.tuples(st.integers(-2, len(wire.MESSAGES) + 2), st.lists(VALUES, max_size=8))
                .map(lambda row: [row[0], *row[1]]), max_size=4)


def _only_wire_errors(fn, data):
    TALLY.fuzz_cases += 1
    try:
        fn(data)
    except WireError:
        pass


FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
FUZZ_STRUCTURED = settings(max_examples=300, deadline=None,
                           suppress_health_check=list(HealthCheck))


@FUZZ
@given(st.binary(max_size=256))
def test_decoders_raise_only_wire_errors_on_any_bytes(data):
    _only_wire_errors(_decode_envelope, data)
    _only_wire_errors(wire.decode_body, data)
    _only_wire_errors(lambda d: wire.decode_body(d, 64), data)


@FUZZ_STRUCTURED
@given(VALUES)
def test_decoders_raise_only_wire_errors_on_any_msgpack_value(value):
    data = msgspec.msgpack.encode(value)
    _only_wire_errors(_decode_envelope, data)
    _only_wire_errors(_decode_envelope, wire.envelope(1, data))
    _only_wire_errors(wire.decode_body, data)


@FUZZ_STRUCTURED
@given(ROWS, st.integers(0, 64), st.integers(0, 7))
def test_decoders_raise_only_wire_errors_on_mutated_batches(rows, cut, flip):
    data = bytearray(msgspec.msgpack.encode(rows))
    _only_wire_errors(wire.decode_body, bytes(data))
    if data:
        data[cut % len(data)] ^= 1 << flip
        _only_wire_errors(wire.decode_body, bytes(data))
        _only_wire_errors(wire.decode_body, bytes(data[:cut % len(data)]))
    envelope = bytearray(wire.envelope(cut, bytes(data), [b"\x01" * cut]))
    envelope[cut % len(envelope)] ^= 1 << flip
    _only_wire_errors(_decode_envelope, bytes(envelope))
    _only_wire_errors(_decode_envelope, bytes(envelope[:cut % len(envelope)]))


def _decode_envelope(data: bytes):
    return wire.decode([data])


class Canary:
    """Unpickling this touches a file: proof that a decoder ran code it was sent."""

    path = ""

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.quick
@pytest.mark.parametrize("dtype", ["a", "O", "|O", "V8", "i8,O", "(2,3)f4", "f", "int32", 7])
def test_inline_arrays_need_a_canonical_dtype(dtype):
    ext = msgspec.msgpack.Ext(wire.EXT_ARRAY, msgspec.msgpack.encode([dtype, [0], b""]))
    with pytest.raises(wire.WireError, match="arrays need a dtype like"):
        wire._unpack(msgspec.msgpack.encode(ext))


@pytest.mark.quick
def test_decoding_never_unpickles(tmp_path):
    Canary.path = str(tmp_path / "canary")
    blob = pickle.dumps(Canary())
    packed = msgspec.msgpack.encode([[wire.code(wire.Call), 1, -1, (), "add", (blob,), {}]])
    for data in (blob, packed, msgspec.msgpack.encode([msgspec.msgpack.Ext(wire.EXT_ARRAY, blob)]),
                 msgspec.msgpack.encode([[wire.code(wire.Remote), 1, -1, (), blob, (), {}]])):
        for decode in (_decode_envelope, wire.decode_body):
            try:
                decode(data)
            except WireError:
                pass
    assert not os.path.exists(Canary.path)


# -- a live daemon under thousands of bad frames -------------------------------------------

def _valid_batch(rng: random.Random) -> list:
    ref = wire.Ref(rng.randrange(1, 50))
    return [wire.Create(1, -1, rng.randrange(1, 50), "ones", (rng.randrange(0, 64),), "<f4",
                        -1, ()),
            wire.Call(2, -1, (rng.randrange(1, 50),), "add", (ref, ref), {}),
            wire.Get(3, -1, ref.id, rng.randrange(1000)),
            wire.Free(4, -1, (ref.id,), 1),
            wire.Sync(5, -1, rng.randrange(1000))]


def _junk(rng: random.Random):
    """A value of a random, mostly wrong, type for a command field."""
    return rng.choice([None, -1, 0, 1, 7, 1 << 40, -(1 << 62), 2.5, float("nan"), "x", "",
                       "add", "<f4", "|O", b"\x00", (), (1,), (-1, 2), ((1,),), {}, {"a": 1},
                       {1: 2}, [1, 2], wire.Ref(rng.randrange(1, 50)), (wire.Ref(3),)])


def _confused_rows(rng: random.Random) -> bytes:
    """Well-formed batches of real command codes whose fields have the wrong types."""
    rows = []
    for _ in range(rng.randrange(1, 6)):
        cls = rng.choice(wire.MESSAGES)
        if cls in (wire.Join, wire.Bye, wire.Hello):
            cls = wire.Call  # a Bye would end the session the fuzzer uses; Join dials out
        fields = [rng.randrange(1, 1 << 20)] + [_junk(rng) for _ in cls.__struct_fields__[1:]]
        rows.append([wire.code(cls), *fields])
    return wire.encode_body(rows)  # packs plain rows too


def bad_message(rng: random.Random, seq: int) -> list:
    """One malformed multipart message: garbage, mutation, type confusion or oversize."""
    kind = rng.random()
    if kind < 0.15:
        return [os.urandom(rng.randrange(0, 40)) for _ in range(rng.randrange(1, 4))]
    if kind < 0.45:
        body = bytearray(wire.encode_body(_valid_batch(rng)))
        for _ in range(rng.randrange(1, 4)):
            body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
        if rng.random() < 0.5:
            body = body[:rng.randrange(len(body))]
        return [wire.envelope(seq, bytes(body))]
    if kind < 0.9:
        return [wire.envelope(seq, _confused_rows(rng)), *([b"\x00" * rng.randrange(64)]
                                                           if rng.random() < 0.3 else [])]
    if kind < 0.97:
        body = wire.encode_body(_valid_batch(rng))
        good = wire.envelope(seq, body, [b"\x00" * 8])
        bad = rng.choice([
            good[:4] + bytes([wire.VERSION + 1]) + good[5:],  # another version
            b"mwrT" + good[4:], good[:-1], good + b"x",  # wrong magic; lengths that disagree
            good[:6] + (1 << 31).to_bytes(4, "little") + good[10:], good[:12], b""])
        return rng.choice([[bad], [msgspec.msgpack.encode([b"mwrt", 1, seq]), body]])
    return [wire.envelope(seq, b"\x91" + b"\xda\xff\xff" + b"x" * 65535 * rng.randrange(1, 40))]


STRANGERS = [b"other/tx", b"", b"/", b"x" * 200, b"fuzzer/zz"]


def _burst(ctx, address, master: RawMaster, rng, count, first_seq) -> None:
    """Send `count` bad messages: most on the session's own sockets (so they reach its
    executors), the rest from strangers' DEALERs."""
    strangers = []
    try:
        for identity in STRANGERS:
            sock = ctx.socket(zmq.DEALER)
            if identity:
                sock.setsockopt(zmq.IDENTITY, identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(address)
            strangers.append(sock)
        for i in range(count):
            pick = rng.random()
            if pick < 0.7:
                sock = master.socks[b"tx"]
            elif pick < 0.8:
                sock = master.socks[rng.choice([b"rx", b"hb"])]
            else:
                sock = rng.choice(strangers)
            sock.send_multipart(bad_message(rng, first_seq + i))
    finally:
        for sock in strangers:
            sock.close(linger=500)  # deliver what is queued, then drop


def test_daemon_survives_thousands_of_bad_frames_and_serves_a_real_master(daemon):
    process, address = daemon
    total = int(os.environ.get("MWRT_FUZZ_FRAMES", "20000"))
    rng = random.Random(int(os.environ.get("MWRT_FUZZ_SEED", "6")))
    master = RawMaster(address, "fuzzer")
    ctx = zmq.Context()
    sent, crashes = 0, 0
    try:
        while sent < total:
            count = min(1000, total - sent)
            _burst(ctx, address, master, rng, count, first_seq=sent + 1)
            sent += count
            master.drain()
            if process.poll() is not None or not master.alive(timeout=20):
                crashes += 1
                break
        TALLY.frames(sent, crashes)
        log = process.log.read_text()
        assert process.poll() is None, log[-3000:]
        assert crashes == 0, "the daemon stopped answering pings"
        # An exception that escaped a handler (and killed a thread) is a crash too.
        assert "Traceback" not in log, log[log.index("Traceback") - 200:][:3000]
        master.batch(1 << 40, [wire.Bye(1)])  # frees the fuzzed session
    finally:
        master.close()
        ctx.term()
    mwrt.init_master_worker([address], timeout=10)
    x = mwrt.dist_send(np.arange(100_000, dtype=np.float64))  # over the data channel
    np.testing.assert_array_equal((x * 2).numpy(), np.arange(100_000) * 2.0)
    mwrt.shutdown()
    process.terminate()
    assert process.wait(15) == 0, "the fuzzed daemon did not stop cleanly on SIGTERM"


def test_oversized_and_many_framed_messages_do_not_stop_the_daemon(daemon):
    process, address = daemon
    master = RawMaster(address, "big")
    try:
        huge = b"\x00" * (4 << 20)  # over MWRT_MAX_FRAME_BYTES (1 MiB)
        master.batch(1, [wire.Sync(1, -1, 1)], frames=[huge] * 3)
        master.socks[b"tx"].send_multipart([wire.envelope(2, huge)])
        master.socks[b"tx"].send_multipart([wire.envelope(3, b"\x90"), *[b""] * 5000])
        reply = master.recv()
        assert reply is not None  # the Sync's answer or the refusal, not silence
        assert master.alive()
        TALLY.frames(3)
    finally:
        master.close()
    assert process.poll() is None


# -- the data channel's frames ---------------------------------------------------------------

@pytest.fixture
def channel_trio():
    """tcp channel ranks 0 and 2 in this process, keyed; the fuzzer plays rank 1."""
    key = auth.generate_hmac_key()
    store = HashStore(timeout=10)
    ranks = {}
    threads = [threading.Thread(target=lambda r: ranks.__setitem__(r, channels.create(
        "tcp", r, 3, store=store, prefix="fz", key=key, timeout=5)), args=(r,)) for r in (0, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    yield ranks[0], ranks[2], store, key
    for chan in ranks.values():
        chan.close()


def _rank1_socket(store, key) -> socket.socket:
    host, _, port = store.get("fz/tcp/0", timeout=5).decode().rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    auth.client_handshake(sock, key, 5, b"fz/tcp/1")
    return sock


HEADERS = st.tuples(
    st.sampled_from([sockets.MAGIC, 0, 0x54525744, (1 << 32) - 1]), st.integers(0, 255),
    st.integers(0, 255), st.integers(0, 2048), st.integers(0, (1 << 32) - 1),
    st.integers(0, (1 << 64) - 1),
    st.one_of(st.integers(0, 1 << 16), st.sampled_from([1 << 60, (1 << 64) - 1])),
    st.one_of(st.integers(0, 1 << 16), st.integers(0, (1 << 64) - 1)),
    st.one_of(st.integers(0, 1 << 16), st.integers(0, (1 << 64) - 1)))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(header=HEADERS, tail=st.binary(max_size=300), cut=st.integers(0, sockets.HEADER.size))
def test_data_channel_frames_fuzzed_after_the_handshake(channel_trio, header, tail, cut):
    rank0, rank2, store, key = channel_trio
    TALLY.fuzz_cases += 1
    frame = sockets.HEADER.pack(*header) + tail
    if cut:
        frame = frame[:cut]
    with _rank1_socket(store, key) as sock:
        try:
            sock.sendall(frame)
        except OSError:
            pass  # rank 0 already dropped the connection: what we want
    assert rank0._listeners and not rank0.closed


def test_data_channel_survives_fuzzed_frames_and_strangers(channel_trio, monkeypatch):
    """Authenticated garbage and unauthenticated strangers: rank 0's threads never die."""
    rank0, rank2, store, key = channel_trio
    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args))
    rng = random.Random(7)
    host, _, port = store.get("fz/tcp/0", timeout=5).decode().rpartition(":")
    for i in range(300):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            try:
                if i % 3 == 0:  # a stranger: garbage instead of the handshake
                    sock.sendall(os.urandom(rng.randrange(0, 200)))
                elif i % 3 == 1:  # the handshake with a wrong key
                    auth.client_handshake(sock, b"w" * 32, 5, b"fz/tcp/1")
                else:  # the right key, then a truncated or lying frame
                    auth.client_handshake(sock, key, 5, b"fz/tcp/1")
                    head = sockets.HEADER.pack(sockets.MAGIC, sockets.DATA, 0, 0, 0, i,
                                               rng.randrange(1, 1 << 20), 0,
                                               rng.randrange(1, 1 << 20))
                    sock.sendall(head[:rng.randrange(1, len(head) + 1)] + os.urandom(100))
            except (OSError, mwrt.errors.AuthError):
                pass
    TALLY.frames(300)
    still_talks(rank0, rank2)
    time.sleep(0.2)
    assert not died, [f"{a.thread.name}: {a.exc_type.__name__}: {a.exc_value}" for a in died]


def test_live_data_channel_port_refuses_strangers_and_keeps_serving(monkeypatch):
    """Raw sockets at a worker's tcp data-channel port: no effect on the session, no fd leak."""
    monkeypatch.setenv("MWRT_CHANNEL", "tcp")
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=1, timeout=30)
    try:
        from mwrt.master.cluster import current

        cluster = current()
        data = np.random.default_rng(1).standard_normal(300_000)
        np.testing.assert_array_equal(mwrt.dist_send(data).numpy(), data)
        pid = cluster.local[0].process.pid
        before = fd_count(pid)
        address = cluster.store.get(f"{cluster.session_id}/tcp/0", timeout=5).decode()
        host, _, port = address.rpartition(":")
        rng = random.Random(8)
        for i in range(500):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                try:
                    if i % 2:
                        sock.sendall(os.urandom(rng.randrange(0, 300)))
                    else:
                        auth.client_handshake(sock, os.urandom(32), 5,
                                              f"{cluster.session_id}/tcp/1".encode())
                except (OSError, mwrt.errors.AuthError):
                    pass
        TALLY.frames(500)
        t = mwrt.dist_send(data)
        np.testing.assert_array_equal((t + 1).numpy(), data + 1)
        # The worker closed every refused connection (a little slack for its own sockets).
        assert wait_until(lambda: fd_count(pid) <= before + 2, 10) is not None, \
            f"worker fds: {fd_count(pid)} (were {before})"
    finally:
        mwrt.shutdown()


# -- the generic NumPy op: its paths and argument shapes (issue 27) -------------------------

_NP_PATHS = [*sorted(numpy_allowlist.ALLOWED)[::7], *numpy_allowlist.DANGEROUS, "zeros_like", "full_like",
             "histogram", "fft.fft", "fft.irfftn", "vander", "diag", "diagflat", "lib.stride_tricks.as_strided",
             "ctypeslib.as_ctypes", "lib.format.open_memmap", "fromstring", "save", "loadtxt",
             "memmap", "ndarray.__new__", "__class__", "", ".", "linalg", "fft", "_core",
             "random.default_rng", "testing.assert_equal", "frompyfunc", "x" * 300]
_NP_KWARGS = ["shape", "n", "s", "bins", "k", "axis", "axes", "dtype", "out", "N", "q",
              "window_shape", "buffer", "offset", "strides", "like", "file"]


def _np_value(rng: random.Random):
    """An argument of the shapes a NumPy function takes, often past any size limit."""
    return rng.choice([wire.Ref(rng.randrange(1, 8)), rng.randrange(-3, 4), 10**8, 10**12,
                       -(10**9), 2.5, float("inf"), "V1048576", "<f8", "|O", "ij,jk->ik",
                       "...i->i", "auto", (10**4, 10**4), (2, 2), (10**8,), (), (-1,),
                       (wire.Ref(1), wire.Ref(2)), tuple(range(50)), b"\x00" * 32,
                       {"a": wire.Ref(1)}, None, True])


def numpy_call(rng: random.Random, seq: int) -> list:
    """A batch making a few small tensors, then one numpy (or numpy_) op on fuzzed arguments,
    then reading its result."""
    made = [wire.Create(seq * 100 + i, -1, i, rng.choice(["ones", "arange", "zeros"]),
                        rng.choice([(4,), (2, 3), (3, 3), (0,), (1, 1, 2)]), rng.choice(
                            ["<f8", "<i4", "<c16", "|u1"]), -1, ()) for i in range(1, 8)]
    made = [replace(c, kind="ones") if c.kind == "arange" else c for c in made]
    path = rng.choice(_NP_PATHS)
    args = tuple(_np_value(rng) for _ in range(rng.randrange(0, 4)))
    if rng.random() < 0.7:  # most functions take an array first
        args = (wire.Ref(rng.randrange(1, 8)), *args)
    kwargs = {rng.choice(_NP_KWARGS): _np_value(rng) for _ in range(rng.randrange(0, 3))}
    if rng.random() < 0.3:  # an argument that sizes the result, far past the limit
        kwargs[rng.choice(["shape", "n", "bins", "k", "N", "s", "window_shape"])] = rng.choice(
            [10**8, (10**8,), (10**4, 10**4)])
    if rng.random() < 0.15:
        call = wire.Call(seq * 100 + 50, -1, (), "numpy_", (wire.Ref(1), path, *args), kwargs)
    else:
        call = wire.Call(seq * 100 + 50, -1, (20,), "numpy", (path, rng.choice([0, -1, 2]),
                                                              *args), kwargs)
    return [*made, call, wire.Get(seq * 100 + 60, -1, 20, seq), wire.Free(seq * 100 + 70, -1,
                                                                          (20,), 1)]


def test_numpy_op_fuzzed_paths_and_arguments_stay_inside_the_session(daemon):
    """Thousands of numpy ops on listed and unlisted paths with arguments that would read
    memory, open files or allocate past the limit: each is refused or computes, the daemon
    answers pings, its peak memory stays near MWRT_MAX_TENSOR_BYTES, no file appears."""
    from tests.worker.test_quotas import status

    process, address = daemon
    total = int(os.environ.get("MWRT_FUZZ_NUMPY", "3000"))
    rng = random.Random(int(os.environ.get("MWRT_FUZZ_SEED", "6")))
    master = RawMaster(address, "numpy-fuzzer")
    before, files = status(process.pid, "VmHWM"), set(os.listdir("."))  # the daemon's cwd
    try:
        for seq in range(1, total + 1):
            master.batch(seq, numpy_call(rng, seq))
            if seq % 200 == 0:
                master.drain()
                assert process.poll() is None and master.alive(timeout=20), seq
        master.drain()
        log = process.log.read_text()
        assert "Traceback" not in log, log[log.index("Traceback") - 200:][:3000]
        growth = status(process.pid, "VmHWM") - before
        assert growth < 8 * int(FUZZ_ENV["MWRT_MAX_TENSOR_BYTES"]), growth
        assert set(os.listdir(".")) == files
        TALLY.frames(total, 0)
    finally:
        master.close()

"""A daemon no master can freeze or starve, and memory that comes back (issue 19, worker side).

Each test runs a real daemon on loopback, one greedy or careless master (a subprocess, or
bare sockets) and one ordinary master (this process), and checks that the ordinary one is
served and the greedy one gets an error naming the bound. Memory is read from
/proc/PID/status of the daemon; the figures are printed (pytest -s) for the closing note.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq
from tests.support.daemons import start_worker, stop_worker
from tests.faults.test_faults_wire import RawMaster

import mwrt
from mwrt.protocol import wire

MiB = 1 << 20


def status(pid: int, field: str) -> int:
    """A memory figure of process `pid` from /proc/PID/status, in bytes (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(f"/proc/{pid}/status: no {field}")


def figure(name: str, **values) -> None:
    """Print one line of figures for the closing note (MB)."""
    print(f"\n[figure] {name}: " + ", ".join(f"{k} {v / MiB:.0f} MB" for k, v in values.items()))


@pytest.fixture
def daemon(request):
    """A daemon with the settings a test passes as its parameter: (process, address)."""
    mwrt.shutdown()
    process, address = start_worker(env=getattr(request, "param", None))
    yield process, address
    mwrt.shutdown()
    stop_worker(process)


def master_process(address: str, body: str, env: dict | None = None) -> subprocess.Popen:
    """Another master: a Python process running `body` after connecting to `address`."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
    child_env = dict(os.environ, **(env or {}))
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, child_env.get("PYTHONPATH")]))
    prelude = ("import sys, numpy as np, mwrt\n"
               f"mwrt.init_master_worker([{address!r}], timeout=30)\n")
    return subprocess.Popen([sys.executable, "-c", prelude + body], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=child_env)


def finish(process: subprocess.Popen, timeout: float = 120) -> str:
    """Wait for a master process and return its output."""
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        pytest.fail(f"master process still running after {timeout} s:\n{out[-3000:]}")
    return out


def served(address: str) -> None:
    """This process's master gets an answer from the daemon (connects if it has not)."""
    if not mwrt.is_initialized():
        mwrt.init_master_worker([address], timeout=30)
    x = mwrt.dist_send(np.arange(1000, dtype=np.float64))
    np.testing.assert_array_equal((x * 2).numpy(), np.arange(1000) * 2.0)


# -- no command blocks the socket thread ---------------------------------------------------

def test_a_stuck_join_leaves_other_masters_served(daemon):
    _, address = daemon
    silent = socket.socket()  # a "store" that takes connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    stuck = RawMaster(address, "stuck")
    try:
        store = f"127.0.0.1:{silent.getsockname()[1]}"
        stuck.batch(1, [wire.Join(1, store, "stuck", 2, "tcp", 120.0, 7)])
        # The Join waits on the silent store for up to 120 s; meanwhile everyone is served,
        # well within the heartbeat timeout that would declare the worker lost.
        assert stuck.alive(timeout=5), "the stuck master's own pings went unanswered"
        served(address)
        assert stuck.alive(timeout=5)
        stuck.batch(2, [wire.Create(2, -1, 5, "ones", (4,), "<f4", -1, ()),
                        wire.Get(3, -1, 5, 8)])
        reply = stuck.recv(timeout=10)
        assert isinstance(reply, wire.Data), reply  # its streams run too: only the Join waits
        assert stuck.recv(timeout=0.5) is None  # and the Join is not answered yet
        # A Join to a dead address fails that master alone, naming the address.
        dead = RawMaster(address, "dead")
        dead.batch(1, [wire.Join(1, store.replace(str(silent.getsockname()[1]), "1"), "dead",
                                 2, "tcp", 2.0, 9)])
        reply = dead.recv(timeout=30)
        dead.close()
        assert isinstance(reply, wire.Failed) and "127.0.0.1:1" in reply.info["message"], reply
        served(address)
    finally:
        stuck.close()
        silent.close()


# -- quotas ------------------------------------------------------------------------------

GREEDY_STREAMS = """
try:
    streams = [mwrt.Stream() for _ in range(2000)]
    mwrt.synchronize()
except mwrt.QuotaError as exc:
    print("QUOTA", exc)
"""


def test_two_thousand_streams_get_a_named_error_while_another_master_works(daemon):
    process, address = daemon
    served(address)
    mine = [mwrt.Stream() for _ in range(4)]
    before = status(process.pid, "VmRSS")
    greedy = master_process(address, GREEDY_STREAMS)
    out = finish(greedy)
    assert "QUOTA" in out and "MWRT_SESSION_STREAMS" in out, out[-3000:]
    figure("2,000 streams asked for", before=before, peak=status(process.pid, "VmHWM"),
           after=status(process.pid, "VmRSS"))
    for s in mine:  # streams made before and after the greedy master are served
        with mwrt.stream(s):
            served(address)
    with mwrt.stream(mwrt.Stream()):
        served(address)
    assert process.poll() is None


def test_a_stream_past_the_quota_is_refused_at_its_line_and_a_collective_goes_on():
    # The worker refused it, and a collective on it left node 0's part waiting out
    # MWRT_SYNC_TIMEOUT: the master learns the quota in the worker's Welcome.
    mwrt.shutdown()
    workers = [start_worker(env={"MWRT_SESSION_STREAMS": "3"}) for _ in range(2)]
    try:
        mwrt.init_master_worker([address for _, address in workers], timeout=30)
        made: list = []
        with pytest.raises(mwrt.QuotaError, match=r"Stream: node 1 has no room for another "
                                                  r"stream .* MWRT_SESSION_STREAMS = 3"):
            for _ in range(3):
                made.append(mwrt.Stream(node=1))
        assert len(made) == 2  # the host's default stream is the third
        with mwrt.node(1), mwrt.stream(made[-1]):
            t1 = mwrt.ones(4)
        t0 = mwrt.ones(4)
        mwrt.all_reduce([t0, t1])
        np.testing.assert_array_equal(t0.numpy(), np.full(4, 2.0, np.float32))
        np.testing.assert_array_equal(t1.numpy(), np.full(4, 2.0, np.float32))
    finally:
        mwrt.shutdown()
        for process, _ in workers:
            stop_worker(process)


@pytest.mark.parametrize("daemon", [{"MWRT_SESSION_BYTES": str(8 * MiB),
                                     "MWRT_SESSION_TENSORS": "100"}], indirect=True)
def test_tensor_and_byte_quotas_are_named_errors_for_that_master_alone(daemon):
    process, address = daemon
    before = status(process.pid, "VmRSS")
    greedy = master_process(address, """
for make in (lambda: [mwrt.zeros(MiB, dtype=np.float32) for _ in range(3)],
             lambda: [mwrt.zeros(1) for _ in range(200)]):
    try:
        kept = make()
        kept[-1].numpy()
    except mwrt.RemoteError as exc:
        print("REFUSED", str(exc).splitlines()[0])
    del kept
    mwrt.synchronize()
""".replace("MiB", str(MiB)))
    out = finish(greedy)
    assert "MWRT_SESSION_BYTES" in out and "MWRT_SESSION_TENSORS" in out, out[-3000:]
    served(address)
    figure("8 MiB session quota, 12 MiB asked for", before=before,
           after=status(process.pid, "VmRSS"))


@pytest.mark.parametrize("daemon", [{"MWRT_SESSION_BYTES": str(8 * MiB), "MWRT_FAKE_GPUS": "1",
                                     "MWRT_FAKE_GPU_BYTES": str(96 * MiB)}], indirect=True)
def test_the_byte_quota_is_the_hosts_and_a_gpu_is_bounded_by_its_own_memory(daemon):
    _, address = daemon
    mwrt.init_master_worker([address], timeout=30)
    on_gpu = [mwrt.zeros(4 * MiB, device=0) for _ in range(3)]  # 48 MiB: past the host quota
    on_gpu.append(on_gpu[0] + on_gpu[1])  # 64 MiB: nor is an op's result on the GPU
    assert float(on_gpu[-1].sum()) == 0.0
    with pytest.raises(mwrt.RemoteError, match="MWRT_SESSION_BYTES"):
        mwrt.zeros(3 * MiB).numpy()  # 12 MiB of host memory: over the 8 MiB quota
    with pytest.raises(mwrt.RemoteError, match="GPU 0: out of memory"):
        mwrt.zeros(16 * MiB, device=0).numpy()  # 64 MiB more: past the (fake) GPU's 96 MiB
    assert float(mwrt.ones(MiB).sum()) == MiB  # the session goes on


@pytest.mark.parametrize("daemon", [{"MWRT_SESSION_INFLIGHT_BYTES": str(2 * MiB)}], indirect=True)
def test_queued_commands_past_the_inflight_quota_and_unread_frames_are_refused(daemon):
    process, address = daemon
    before = status(process.pid, "VmRSS")
    raw = RawMaster(address, "flood")
    try:
        # The stream waits on an event nobody records: every Put queues behind it.
        raw.batch(1, [wire.WaitEvent(1, -1, 99)])
        frame = b"\x00" * (MiB // 2)
        for seq in range(2, 8):
            raw.batch(seq, [wire.Put(seq, -1, seq, (len(frame),), "|u1", -1, 0)], [frame])
        refused = [r for r in replies(raw) if isinstance(r, wire.Failed)]
        assert refused and all(r.info["kind"] == "quota" for r in refused), refused
        assert "MWRT_SESSION_INFLIGHT_BYTES" in refused[0].info["message"]
        raw.batch(9, [wire.Sync(9, 5, 1)], [b"\x00"])  # a frame that no Put reads
        assert any("no Put reads" in r.info.get("message", "") for r in replies(raw)
                   if isinstance(r, wire.Failed))
        served(address)
        figure("2 MiB queue quota, 3 MiB queued", before=before,
               after=status(process.pid, "VmRSS"))
        raw.batch(10, [wire.Bye(10)])
    finally:
        raw.close()


def replies(raw: RawMaster, quiet: float = 1.0) -> list:
    """What a raw master receives on rx until it has been quiet for `quiet` seconds."""
    got = []
    for _ in range(1000):
        reply = raw.recv(timeout=quiet)
        if reply is None:
            break
        got.append(reply)
    return got


# -- limits that hold ----------------------------------------------------------------------

@pytest.mark.parametrize("daemon", [{"MWRT_MAX_TENSOR_BYTES": str(MiB)}], indirect=True)
def test_op_results_over_the_limit_are_refused_before_they_are_made(daemon, monkeypatch):
    process, address = daemon
    served(address)
    peak = status(process.pid, "VmHWM")
    a = mwrt.arange(2048, dtype=np.float32)
    outer = a.reshape(2048, 1) * a.reshape(1, 2048)  # 16 MiB from two 8 KiB operands
    with pytest.raises(mwrt.RemoteError, match="MWRT_MAX_TENSOR_BYTES"):
        outer.numpy()
    wide = mwrt.zeros(1000, dtype=np.float32).astype("S100000")  # 100 MB
    with pytest.raises(mwrt.RemoteError, match="MWRT_MAX_TENSOR_BYTES"):
        wide.numpy()
    grown = status(process.pid, "VmHWM") - peak
    figure("op-result limit (worker peak RSS growth)", grown=grown)
    assert grown < 50 * MiB, f"the refused results were made: the peak grew by {grown} bytes"
    served(address)
    mwrt.shutdown()
    monkeypatch.setenv("MWRT_MAX_TENSOR_BYTES", str(MiB))  # the master refuses them itself
    mwrt.init_master_worker([address], timeout=30)
    a = mwrt.arange(2048, dtype=np.float32)
    with pytest.raises(MemoryError, match="MWRT_MAX_TENSOR_BYTES"):
        a.reshape(2048, 1) * a.reshape(1, 2048)


BUSY_PUTS = 20_000


def test_backpressure_bounds_the_memory_of_a_busy_worker(daemon, monkeypatch):
    process, address = daemon
    monkeypatch.setenv("MWRT_MAX_BACKLOG_BYTES", str(8 * MiB))
    served(address)
    before = status(process.pid, "VmRSS")
    chunk = np.ones(60_000 // 8, dtype=np.float64)  # 60 kB: rides inline, in the command
    busy = mwrt.rand(2500, 2500, dtype=np.float64)  # 50 MB, and 50 MB more for the product
    product = busy @ busy  # keeps the stream busy while the puts arrive
    for _ in range(BUSY_PUTS):
        mwrt.dist_send(chunk)  # dropped at once: the worker frees it after the put
    product.sum().numpy()
    node = mwrt.master.cluster.current().node(0)
    peak = status(process.pid, "VmHWM")
    figure("backpressure, 20,000 x 60 kB puts (1.2 GB) to a busy worker", before=before,
           peak=peak, after=status(process.pid, "VmRSS"))
    assert node.limits.checkpoints > 0, "the master never checked how far behind it was"
    # Unbounded, the queued puts took this worker 510-540 MB over `before` (the same run,
    # MWRT_MAX_BACKLOG_BYTES=0); bounded, ~110 MB, 100 MB of it the two matrices.
    assert peak - before < 250 * MiB, f"worker RSS peaked {peak - before} bytes over {before}"


# -- sessions end by their own connection ---------------------------------------------------

def test_hello_or_bye_naming_a_foreign_session_is_refused(daemon):
    _, address = daemon
    served(address)
    victim = mwrt.master.cluster.current().session_id
    ctx = zmq.Context()
    try:
        evil = ctx.socket(zmq.DEALER)
        evil.setsockopt(zmq.IDENTITY, b"evil/rx")
        evil.setsockopt(zmq.LINGER, 0)
        evil.connect(address)
        evil.send_multipart(wire.encode(0, [wire.Hello(1, victim, "evil", 0)]))
        assert evil.poll(5000)
        reply = wire.decode(evil.recv_multipart())[1][0]
        assert isinstance(reply, wire.Failed) and "opens only its own session" in \
            reply.info["message"], reply
        evil.close(0)
        other = RawMaster(address, "other")  # a session of its own, then a second Hello
        other.socks[b"rx"].send_multipart(wire.encode(0, [wire.Hello(2, "other", "evil", 0)]))
        reply = other.recv(timeout=5)
        assert isinstance(reply, wire.Failed) and "already open" in reply.info["message"]
        other.batch(1, [wire.Bye(3)])  # ends "other" alone
        assert isinstance(other.recv(timeout=10), wire.Done)
        other.close()
    finally:
        ctx.term()
    served(address)  # the victim's session, tensors and streams are intact
    assert mwrt.master.cluster.current().nodes[0].lost is None


# -- resources come back ------------------------------------------------------------------

EMPTY_SIZES = (1000, 100_000, 3_000_000)
SPILL = """
kept = [mwrt.full((n,), 7.0, dtype=np.float64) for n in {sizes} for _ in range(4)]
mwrt.synchronize()
del kept
mwrt.synchronize()
print("SPILLED")
""".format(sizes=EMPTY_SIZES)


@pytest.mark.parametrize("keyed", [False, True])
def test_empty_never_shows_another_sessions_bytes(keyed, tmp_path):
    from mwrt.protocol.auth import keygen

    mwrt.shutdown()
    extra, env = (), {}
    if keyed:
        worker_key, master_key = keygen(str(tmp_path / "keys"))
        extra, env = ("--key-file", worker_key), {"MWRT_KEY_FILE": master_key}
    process, address = start_worker(*extra)
    try:
        for _ in range(3):
            assert "SPILLED" in finish(master_process(address, SPILL, env))
            mwrt.init_master_worker([address], timeout=30, **(
                {"key": env["MWRT_KEY_FILE"]} if keyed else {}))
            for n in EMPTY_SIZES:
                got = mwrt.empty(n, dtype=np.float64).numpy()
                assert not got.any(), f"empty({n}) held {np.count_nonzero(got)} foreign values"
            mwrt.shutdown()
    finally:
        mwrt.shutdown()
        stop_worker(process)


HOLD = """
kept = [mwrt.rand(4 * {MiB}, dtype=np.float64) for _ in range(2)]    # 64 MiB, mapped
kept += [mwrt.rand({MiB} // 8 * 3 // 2, dtype=np.float64) for _ in range(64)]  # 96 MiB, heap
kept += [k + 1 for k in kept[2:34]]                                    # 48 MiB of results
x = mwrt.dist_send(np.ones(8 * {MiB}, dtype=np.uint8))               # over the data channel
kept.append(x)
float(kept[-2].sum().numpy())
print("READY", flush=True)
import time; time.sleep(600)  # until killed
""".format(MiB=MiB)


@pytest.mark.parametrize("daemon", [{"MWRT_LEASE_TIMEOUT": "2"}], indirect=True)
def test_worker_rss_returns_near_baseline_after_masters_are_killed(daemon):
    process, address = daemon
    warm = master_process(address, HOLD.replace("time.sleep(600)", "pass"))
    assert "READY" in finish(warm)  # modules and pools a first session brings stay loaded
    baseline = settle(process.pid, 0, 30)
    peaks = []
    for _ in range(4):
        master = master_process(address, HOLD)
        line = ""
        deadline = time.monotonic() + 120
        while "READY" not in line and time.monotonic() < deadline and master.poll() is None:
            line = master.stdout.readline()
        assert "READY" in line, line
        peaks.append(status(process.pid, "VmRSS"))
        master.send_signal(signal.SIGKILL)
        master.wait(10)
        master.stdout.close()
    after = settle(process.pid, baseline + 64 * MiB, 60)
    figure("RSS after 4 killed masters (each held ~216 MB)", baseline=baseline,
           peak=max(peaks), after=after)
    assert after < baseline + 64 * MiB, (
        f"worker RSS {after} did not return near its baseline {baseline} (peaks {peaks})")
    served(address)


def settle(pid: int, below: int, timeout: float) -> int:
    """The RSS of `pid` once it is below `below` (or stops falling), polled up to `timeout`."""
    deadline = time.monotonic() + timeout
    last = status(pid, "VmRSS")
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = status(pid, "VmRSS")
        if now < below or (below == 0 and abs(now - last) < MiB):
            return now
        last = now
    return last


# -- every per-session table is bounded (issue 27, item 5) ---------------------------------

def _stats(master: RawMaster, seq: int) -> dict:
    master.batch(seq, [wire.Stats(seq, 9000 + seq)])
    while True:
        reply = master.recv(timeout=10)
        if isinstance(reply, wire.Done) and reply.token == 9000 + seq:
            return reply.value
        assert reply is not None, "no answer to Stats"


@pytest.mark.parametrize("daemon", [{"MWRT_SESSION_EVENTS": "500"}], indirect=True)
def test_events_and_waits_on_them_are_bounded_and_counted(daemon):
    process, address = daemon
    greedy = RawMaster(address, "greedy")
    try:
        before = status(process.pid, "VmRSS")
        for seq in range(1, 11):  # 1,000 waits on events nobody records (fewer refusals than
            # the reply queue's high-water mark, which would drop the rest unread)
            greedy.batch(seq, [wire.EventQuery(seq * 1000 + i, 10**6 + seq * 1000 + i, True,
                                               seq * 1000 + i) for i in range(100)])
        refusals = []
        while (reply := greedy.recv(timeout=5)) is not None:
            if isinstance(reply, wire.Failed):
                refusals.append(reply.info["message"])
        assert len(refusals) == 500 and "MWRT_SESSION_EVENTS = 500" in refusals[0], \
            refusals[:2]
        stats = _stats(greedy, 100)
        assert stats["events"] == 500 and stats["waits"] == 500, stats
        figure("1,000 waits on unrecorded events, 500 allowed", before=before,
               after=status(process.pid, "VmRSS"))
        served(address)  # another master is served meanwhile
        # Recorded events fire, and are kept as their time alone: they never fill the table.
        greedy.batch(101, [wire.Record(200000 + i, -1, 5 * 10**6 + i, False)
                           for i in range(2000)] + [wire.Sync(300000, -1, 300000)])
        assert isinstance(greedy.recv(timeout=30), wire.Done)
        stats = _stats(greedy, 102)
        assert stats["events"] == 500 and stats["events_fired"] == 2000, stats
        greedy.batch(103, [wire.EventQuery(400000, 5 * 10**6 + 7, True, 400000)])
        reply = greedy.recv(timeout=10)
        assert isinstance(reply, wire.Done) and reply.value["done"], reply
    finally:
        greedy.close()
    assert process.poll() is None


@pytest.mark.parametrize("daemon", [{"MWRT_MAX_JOINS": "3", "MWRT_MAX_WORLD": "64"}],
                         indirect=True)
def test_joins_are_bounded_in_world_size_in_number_and_in_threads(daemon):
    process, address = daemon
    silent = socket.socket()  # a store whose accept queue is full: connecting hangs
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    store = f"127.0.0.1:{silent.getsockname()[1]}"
    queued = [socket.socket() for _ in range(3)]
    for sock in queued:  # fill the queue (a connection past it hangs: no wait here)
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", silent.getsockname()[1]))
    masters = [RawMaster(address, f"joiner{i}") for i in range(5)]
    try:
        first = masters[0]
        first.batch(1, [wire.Join(1, store, "j", 20_000_000, "tcp", 60.0, 11)])
        reply = first.recv(timeout=10)
        assert isinstance(reply, wire.Failed) and "MWRT_MAX_WORLD" in reply.info["message"], reply
        threads = status_threads(process.pid)
        first.batch(2, [wire.Join(2, store, "j", 2, "tcp", 8.0, 12)])  # waits on the store
        first.batch(3, [wire.Join(3 + i, store, "j", 2, "tcp", 60.0, 13 + i) for i in range(300)])
        refused = [first.recv(timeout=10) for _ in range(300)]
        assert all(isinstance(r, wire.Failed) and "one Join at a time" in r.info["message"]
                   for r in refused), refused[:2]
        for i, master in enumerate(masters[1:3]):  # the daemon's other two Join slots
            master.batch(1, [wire.Join(1, store, "j", 2, "tcp", 8.0, 20 + i)])
            _stats(master, 2)  # answered after the Join started
        masters[3].batch(1, [wire.Join(1, store, "j", 2, "tcp", 60.0, 30)])
        reply = masters[3].recv(timeout=10)
        assert isinstance(reply, wire.Failed) and "MWRT_MAX_JOINS" in reply.info["message"], reply
        assert status_threads(process.pid) <= threads + 3
        # The three Joins give up on the silent store within their 8 s, and their slots back.
        for master in masters[:3]:
            reply = master.recv(timeout=30)
            assert isinstance(reply, wire.Failed) and store in reply.info["message"], reply
        served(address)  # this master's own Join gets a slot
    finally:
        for master in masters:
            master.close()
        for sock in (silent, *queued):
            sock.close()
    assert process.poll() is None


def status_threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def test_a_stores_values_are_bounded_in_all(monkeypatch):
    from mwrt.store import TCPStore

    monkeypatch.setenv("MWRT_STORE_MAX_BYTES", str(2 * MiB))
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, key=b"k" * 32)
    client = TCPStore("127.0.0.1", store.port, timeout=5, key=b"k" * 32)
    try:
        client.set("a", b"x" * (MiB - 100))
        client.set("b", b"x" * (MiB - 100))
        with pytest.raises(mwrt.QuotaError, match="MWRT_STORE_MAX_BYTES"):
            client.set("c", b"x" * (MiB - 100))
        client.set("a", b"y" * (MiB - 100))  # a replacement takes no more room
        client.delete_key("b")
        client.set("c", b"x" * (MiB - 100))
        assert client.get("c") == b"x" * (MiB - 100)
    finally:
        client.close()
        store.close()


def _graph(ops: int) -> bytes:
    """A definition of `ops` additions on the default stream."""
    return wire.encode_body([wire.Call(i, -1, (10**6 + i,), "add", (wire.Ref(1), 1.0), {})
                             for i in range(ops)])


@pytest.mark.parametrize("daemon", [{"MWRT_SESSION_GRAPH_BYTES": str(4 * MiB),
                                     "MWRT_SESSION_GRAPHS": "64"}], indirect=True)
def test_graph_definitions_are_bounded_and_decoded_off_the_socket_thread(daemon):
    process, address = daemon
    served(address)
    greedy = RawMaster(address, "greedy")
    try:
        body = _graph(5000)  # ~190 KB: ~0.2 s of Python to decode on this machine
        before = status(process.pid, "VmRSS")
        greedy.batch(1, [wire.DefineGraph(1 + i, i, body, ()) for i in range(3)])
        worst = 0.0
        for seq in range(2, 42):  # 120 definitions (~23 MB), 4 MiB allowed
            greedy.batch(seq, [wire.DefineGraph(seq * 10 + i, seq * 10 + i, body, ())
                               for i in range(3)])
            start = time.perf_counter()
            served(address)  # another master's round trips meanwhile
            worst = max(worst, time.perf_counter() - start)
        refusals = []
        while (reply := greedy.recv(timeout=5)) is not None:
            if isinstance(reply, wire.Failed):
                refusals.append(reply.info["message"])
        assert refusals and "MWRT_SESSION_GRAPH_BYTES" in refusals[0], refusals[:1]
        stats = _stats(greedy, 100)
        assert stats["graph_bytes"] <= 4 * MiB and stats["graphs"] == 4 * MiB // len(body), stats
        figure(f"120 graph definitions of {len(body) // 1000} KB, 4 MiB allowed (worst "
               f"round trip of another master {worst * 1e3:.0f} ms)", before=before,
               peak=status(process.pid, "VmHWM"), after=status(process.pid, "VmRSS"))
        # A replay right after its definition waits for the decoding, in order.
        greedy.drain()
        greedy.batch(101, [wire.Create(5, -1, 1, "zeros", (4,), "<f8", -1, ()),
                           wire.DropGraph(6, 0), wire.DefineGraph(7, 0, _graph(3), ()),
                           wire.Replay(8, 0, ()), wire.Get(9, -1, 10**6 + 2, 77)])
        reply = greedy.recv(timeout=30)
        assert isinstance(reply, wire.Data) and reply.token == 77, reply
    finally:
        greedy.close()
    assert process.poll() is None


@pytest.mark.parametrize("daemon", [{"MWRT_SESSION_INFLIGHT_BYTES": str(4 * MiB)}],
                         indirect=True)
def test_a_flood_of_replays_is_bounded_like_a_flood_of_batches(daemon):
    process, address = daemon
    greedy = RawMaster(address, "greedy")
    try:
        body = _graph(1000)
        greedy.batch(1, [wire.Create(1, -1, 1, "zeros", (4,), "<f8", -1, ()),
                         wire.DefineGraph(2, 0, body, ())])
        before = status(process.pid, "VmRSS")
        for seq in range(2, 202):  # 20,000 replays of 1,000 ops: 20 M ops queued, unbounded
            greedy.batch(seq, [wire.Replay(seq * 1000 + i, 0, ()) for i in range(100)])
        served(address)
        refusals = []
        while (reply := greedy.recv(timeout=5)) is not None:
            if isinstance(reply, wire.Failed):
                refusals.append(reply.info["message"])
        assert refusals and "MWRT_SESSION_INFLIGHT_BYTES" in refusals[0], refusals[:1]
        figure("20,000 replays of a 1,000-op graph, 4 MiB of queue allowed", before=before,
               peak=status(process.pid, "VmHWM"), after=status(process.pid, "VmRSS"))
    finally:
        greedy.close()
    assert process.poll() is None

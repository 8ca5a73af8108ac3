"""GPU paths: tensors on devices, moves in every direction, streams and events on a GPU,
out-of-memory. Every test body runs twice: on workers posing as GPU hosts (mwrt.testing.fakegpu,
MWRT_FAKE_GPUS: always) and on CuPy with CUDA (where this machine has it, else skipped with
the reason). The same worker code runs both: the fake fits CuPy's API.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tests.master.test_streams import _rendezvous_signal, _rendezvous_wait

import mwrt
from mwrt import arrays

FAKE_GPUS = 2
FAKE_GPU_BYTES = 128 << 20  # small enough that the out-of-memory test is cheap


def _real_gpus() -> int:
    saved = os.environ.pop("MWRT_FAKE_GPUS", None)
    try:
        return arrays.device_count()
    finally:
        if saved is not None:
            os.environ["MWRT_FAKE_GPUS"] = saved


@pytest.fixture(scope="module", params=["fake", "cupy"])
def gpu(request):
    """Two workers with GPUs: fake ones (host memory posing as 2 GPUs each) or CuPy's."""
    env = {"MWRT_FAKE_GPUS": str(FAKE_GPUS), "MWRT_FAKE_GPU_BYTES": str(FAKE_GPU_BYTES)}
    if request.param == "cupy":
        if _real_gpus() == 0:
            pytest.skip("no CUDA device with CuPy on this machine (the fake GPU runs these)")
        env = {"MWRT_FAKE_GPUS": "0"}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the local workers inherit it
    mwrt.shutdown()
    try:
        mwrt.init_master_worker(local_workers=2, timeout=30)
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.update({name: value})
    if mwrt.device_count(0) == 0:
        pytest.skip("the local worker sees no GPU")
    yield request.param
    mwrt.shutdown()


def _two_gpus():
    if mwrt.device_count(0) < 2:
        pytest.skip("node 0 has one GPU; this test needs two")


def test_devices_are_reported(gpu):
    found = mwrt.devices(0)
    assert len(found) == mwrt.device_count(0) >= 1
    for index, info in enumerate(found):
        assert info["index"] == index and info["name"]
        assert 0 <= info["free_memory"] <= info["total_memory"]
        assert info["compute_capability"].count(".") == 1
    if gpu == "fake":
        assert [d["name"] for d in found] == ["mwrt fake GPU 0", "mwrt fake GPU 1"]


def test_the_proposals_cuda_example(gpu):
    x = mwrt.FloatTensor(20, 20).fill_(4)
    y = mwrt.dist_send(np.ones((20, 20), np.float32))
    z = x + y
    assert (z.get_node(), z.get_device()) == (0, -1)
    cuda_x = x.cuda()
    assert (cuda_x.get_node(), cuda_x.get_device()) == (0, 0) and cuda_x.is_cuda
    with mwrt.node(1):
        a = mwrt.FloatTensor(10, device=mwrt.device_count(1) - 1)
        cuda_y = y.cuda()
        q = cuda_x + cuda_y
    assert a.get_node() == 1 and a.is_cuda
    assert (cuda_y.get_node(), q.get_node(), q.get_device()) == (0, 0, 0)
    np.testing.assert_array_equal(q.cpu().numpy(), np.full((20, 20), 5, np.float32))
    np.testing.assert_array_equal(z.numpy(), q.numpy())


def test_ops_on_two_gpus_of_one_worker(gpu):
    _two_gpus()
    a = mwrt.arange(6, dtype=np.float32, device=0)
    b = mwrt.ones(6, device=1) * 2
    assert (a.get_device(), b.get_device()) == (0, 1)
    with pytest.raises(ValueError, match="device 0.*device 1"):
        a + b
    c = a.to(device=1) * b  # a device-to-device copy, then an op on GPU 1
    assert c.get_device() == 1
    np.testing.assert_array_equal(c.numpy(), np.arange(6) * 2.0)
    np.testing.assert_array_equal((c.cuda(0) + a).numpy(), np.arange(6) * 3.0)


# Each applies to a DistributedTensor on a GPU and to the same NumPy array alike.
OPS = {
    "arithmetic": lambda a: (a * 2 - 1) / 4, "matmul": lambda a: a @ a.T,
    "ufunc": lambda a: np.exp(a / 10), "sum": lambda a: a.sum(axis=1),
    "mean": lambda a: a.mean(), "argmax": lambda a: a.argmax(axis=0),
    "reshape": lambda a: a.reshape(6, 4).T, "index": lambda a: a[1:3, ::2],
    "compare": lambda a: a > 0, "where": lambda a: np.where(a > 0, a, 0),
    "clip": lambda a: np.clip(a, -2, 2), "concatenate": lambda a: np.concatenate([a, a]),
    "astype": lambda a: a.astype(np.int32),
}


def test_ops_on_a_gpu_match_numpy(gpu):
    host = np.arange(24, dtype=np.float32).reshape(4, 6) - 10
    t = mwrt.dist_send(host, device=0)
    for name, op in OPS.items():
        value = op(t)
        assert value.get_device() == 0, name
        np.testing.assert_allclose(value.numpy(), op(host), rtol=1e-6, err_msg=name)
    u = t.clone()
    u += 1
    u[0] = 7
    expected = host + 1
    expected[0] = 7
    np.testing.assert_array_equal(u.numpy(), expected)
    assert float(t.sum()) == float(host.sum())


def test_collectives_over_gpu_tensors_of_two_nodes(gpu):
    tensors = [mwrt.full((1000,), float(i + 1), node=i, device=0) for i in range(2)]
    mwrt.all_reduce(tensors)
    for t in tensors:
        assert t.get_device() == 0
        np.testing.assert_array_equal(t.numpy(), np.full(1000, 3.0, np.float32))
    gathered = mwrt.all_gather([mwrt.arange(4, node=i, device=0) + i for i in range(2)])
    np.testing.assert_array_equal(gathered[1].numpy(), [np.arange(4), np.arange(4) + 1])


def test_gpu_streams_overlap(gpu):
    """Checked by ordering, not time: stream A's op waits for stream B's to signal."""
    x = mwrt.ones(3, device=0)
    mwrt.synchronize()  # x exists before the other streams use it
    with mwrt.stream(mwrt.Stream(device=0)):
        waiting = mwrt.remote(_rendezvous_wait)(x)
    with mwrt.stream(mwrt.Stream(device=0)):
        mwrt.remote(_rendezvous_signal)(x)
    assert bool(waiting.numpy()), "GPU stream B's op did not run while stream A's was running"


def _cuda_stream_of(a):
    """The CUDA stream (and device) this op's kernels go to, in the worker."""
    from mwrt import arrays

    xp = arrays.gpu_module()
    return np.array([xp.cuda.get_current_stream().ptr, a.device.id], np.int64)


def test_each_gpu_stream_is_a_cuda_stream_of_its_own(gpu):
    x = mwrt.ones(3, device=0)
    mwrt.synchronize()  # x exists before the other streams use it
    a, b = mwrt.Stream(device=0), mwrt.Stream(device=0)
    seen = []
    for s in (a, b, a):
        with mwrt.stream(s):
            seen.append(tuple(mwrt.remote(_cuda_stream_of)(x).numpy()))
    assert seen[0] == seen[2] != seen[1]
    assert all(ptr != 0 and device == 0 for ptr, device in seen)  # never the null stream


def test_gpu_events_order_streams(gpu):
    a, b = mwrt.Stream(device=0), mwrt.Stream(device=0)
    with mwrt.stream(a):
        x = mwrt.rand(1024, 1024, device=0)
        y = x @ x
    b.wait_event(a.record_event())
    with mwrt.stream(b):
        z = y + 1
    np.testing.assert_allclose(z.numpy(), y.numpy() + 1, rtol=1e-5)


def test_gpu_streams_are_ordered_automatically(gpu):
    """No event named: a tensor made on GPU stream a and used on GPU stream b (and freed
    after) is ordered by the master, read after write and write after read."""
    a, b = mwrt.Stream(device=0), mwrt.Stream(device=0)
    with mwrt.stream(a):
        x = mwrt.rand(256, 256, device=0)
        y = x @ x
    with mwrt.stream(b):
        z = y * 2
        y.fill_(0)  # after b's own read of y above
    with mwrt.stream(a):
        w = z + 1
    np.testing.assert_allclose(w.numpy(), (x.numpy() @ x.numpy()) * 2 + 1, rtol=1e-4)
    np.testing.assert_array_equal(y.numpy(), np.zeros((256, 256), np.float32))


def _stream_waits(a):
    """What the fake CUDA stream of this op's mwrt stream saw: host waits, GPU-side waits."""
    from mwrt import arrays

    stream = arrays.gpu_module().cuda.get_current_stream()
    return np.array([getattr(stream, "synchronized", -1), len(getattr(stream, "waited", ()))])


def test_gpu_events_are_cuda_events(gpu):
    """A record on a GPU stream does not wait for the GPU, and a GPU stream of the same worker
    waits on it with stream.wait_event, for an explicit event and an automatic order alike;
    the master's query and synchronize still see it fire once the GPU passed it."""
    a, b = mwrt.Stream(device=0), mwrt.Stream(device=0)
    with mwrt.stream(a):
        x = mwrt.rand(256, 256, device=0)
        y = x @ x
        before = mwrt.remote(_stream_waits)(x)
        # a holds its record back a while: b's wait must find the event unfired (a worker
        # keeps only the time of an event fired for good, and a wait on one needs no GPU)
        mwrt.remote(lambda t: time.sleep(0.3), outputs=0)(y)
    done = a.record_event(mwrt.Event(enable_timing=True))
    with mwrt.stream(a):
        after = mwrt.remote(_stream_waits)(x)
    with mwrt.stream(b):  # on a tensor of b's own: a remote() on x would wait for a's `after`
        seen = mwrt.remote(_stream_waits)(mwrt.zeros(1, device=0))
    b.wait_event(done)
    with mwrt.stream(b):
        z = y + 1  # also ordered after a's write of y, automatically
        waited = mwrt.remote(_stream_waits)(x)
    done.synchronize()
    assert done.query()
    np.testing.assert_allclose(z.numpy(), y.numpy() + 1, rtol=1e-5)
    if gpu == "fake":  # CuPy's streams do not count these
        assert after.numpy()[0] == before.numpy()[0], "the record made the executor wait"
        assert waited.numpy()[1] >= seen.numpy()[1] + 1, "b did not wait on the GPU"
    end = a.record_event(mwrt.Event(enable_timing=True))
    assert done.elapsed_time(end) >= 0


def test_events_between_a_gpu_stream_and_a_host_stream(gpu):
    gpu_stream, host_stream = mwrt.Stream(device=0), mwrt.Stream(device=-1)
    with mwrt.stream(gpu_stream):
        x = mwrt.full((64, 64), 3.0, device=0) * 2
        done = gpu_stream.record_event()
    host_stream.wait_event(done)
    with mwrt.stream(host_stream):
        y = x.cpu() + 1  # made on the host stream, after the GPU's kernels ran
    back = host_stream.record_event()
    gpu_stream.wait_event(back)
    with mwrt.stream(gpu_stream):
        z = y.cuda(0) - x
    np.testing.assert_array_equal(z.numpy(), np.ones((64, 64), np.float32))
    assert done.query() and back.query()


def test_events_between_gpu_streams_of_two_nodes(gpu):
    first, second = mwrt.Stream(node=0, device=0), mwrt.Stream(node=1, device=0)
    with mwrt.stream(first):
        x = mwrt.arange(1000, dtype=np.float32, device=0) + 1
        ready = first.record_event(mwrt.Event(enable_timing=True))
    second.wait_event(ready)
    with mwrt.stream(second):
        y = x.to(node=1, device=0) * 2
    ready_there = second.record_event(mwrt.Event(enable_timing=True))
    ready_there.synchronize()
    np.testing.assert_array_equal(y.numpy(), (np.arange(1000) + 1) * 2.0)
    assert ready.elapsed_time(ready_there) >= 0  # one host's clock: node 1 ran after


# Size classes: inline beside a command, one data-channel message, several segments.
SIZES = {"inline": 16, "message": 100_000, "segmented": (9 << 20) // 4}


@pytest.mark.parametrize("size", list(SIZES))
def test_transfers_in_every_direction(gpu, size):
    n = SIZES[size]
    host = np.random.default_rng(n).random(n, dtype=np.float32)
    on_gpu = mwrt.dist_send(host, device=0)  # master -> GPU
    assert on_gpu.get_device() == 0
    np.testing.assert_array_equal(on_gpu.numpy(), host)  # GPU -> master
    moves = [(0, -1), (1, 0), (1, -1), (0, 0)]  # GPU->host, ->remote GPU, ->remote host, back
    if mwrt.device_count(0) > 1:
        moves.insert(1, (0, 1))  # GPU -> GPU on one worker
    here = on_gpu
    for node, device in moves:
        there = here.to(node=node, device=device)
        assert (there.get_node(), there.get_device()) == (node, device)
        here = there if device == -1 else there + 0  # a kernel runs on every GPU it reaches
        np.testing.assert_array_equal(here.numpy(), host, err_msg=f"to node {node} dev {device}")
    remote_host = mwrt.dist_send(host, node=1)
    np.testing.assert_array_equal(remote_host.to(node=0, device=0).numpy(), host)


def test_gpu_out_of_memory_is_named_and_the_session_goes_on(gpu):
    free = mwrt.devices(0)[0]["free_memory"]
    count = int(free * 0.45) // 4
    held = [mwrt.empty(count, device=0) for _ in range(3)]  # the third cannot fit
    named = (r"node 0 GPU 0: out of memory allocating [\d.]+ [KMG]iB \(free [\d.]+ [KMG]?i?B "
             r"of [\d.]+ [KMG]iB\); free tensors or use another device")
    with pytest.raises(mwrt.RemoteError, match=named) as caught:
        held[2].numpy()
    assert caught.value.device == 0 and caught.value.node == 0
    del held
    x = mwrt.ones(count, device=0)  # the memory came back, the stream runs again
    assert float(x.sum().numpy()) == count
    np.testing.assert_array_equal((mwrt.ones(4, device=0) * 3).numpy(), np.full(4, 3.0))


def test_every_constructor_takes_a_device(gpu):
    last = mwrt.device_count(0) - 1
    made = [mwrt.empty(3, device=last), mwrt.zeros(3, device=last), mwrt.ones(3, device=last),
            mwrt.full((3,), 2.0, device=last), mwrt.arange(3, device=last),
            mwrt.rand(3, device=last), mwrt.randn(3, device=last),
            mwrt.FloatTensor(3, device=last), mwrt.LongTensor(3, device=last),
            mwrt.dist_send(np.ones(3, np.float32), device=last),
            mwrt.dist_send(np.ones(3, np.float32), node=1, device=0)]
    for tensor in made:
        assert tensor.is_cuda and tensor.get_device() in (last, 0)
        assert tensor.numpy().shape == (3,)
    np.testing.assert_array_equal(made[0].numpy(), np.zeros(3))  # never another's bytes
    moved = made[2].cpu().cuda(device=last).to(device=0).to(device=-1)
    assert moved.get_device() == -1 and not moved.is_cuda
    np.testing.assert_array_equal(moved.numpy(), np.ones(3))


def test_mixed_host_and_gpu_operands_are_an_error_naming_both(gpu):
    host, device = mwrt.ones(3), mwrt.ones(3, device=0)
    with pytest.raises(ValueError, match=r"device -1.*device 0|device 0.*device -1") as caught:
        host + device
    assert "node 0" in str(caught.value) and ".to(" in str(caught.value)
    np.testing.assert_array_equal((host.cuda() + device).numpy(), np.full(3, 2.0))


def _peers_enabled(a):
    """The (device, peer) pairs of this worker with peer access turned on."""
    from mwrt import arrays

    return np.array(sorted(arrays.peers_enabled()) or np.zeros((0, 2)), np.int64)


def _can_access_peer(a):
    from mwrt import arrays

    runtime = arrays.gpu_module().cuda.runtime
    return np.array([runtime.deviceCanAccessPeer(1, 0), runtime.deviceCanAccessPeer(0, 1)])


def test_a_copy_between_gpus_of_one_worker_stays_on_the_worker(gpu):
    _two_gpus()
    a = mwrt.arange(100_000, dtype=np.float32, device=0)  # past the inline size
    b = a.to(device=1)
    assert (b.get_node(), b.get_device()) == (0, 1)
    np.testing.assert_array_equal((b + 0).numpy(), np.arange(100_000, dtype=np.float32))
    np.testing.assert_array_equal(b.to(device=0).numpy(), a.numpy())
    enabled = {tuple(p) for p in mwrt.remote(_peers_enabled)(a).numpy()}
    can = mwrt.remote(_can_access_peer)(a).numpy()
    assert ((1, 0) in enabled) == bool(can[0]) and ((0, 1) in enabled) == bool(can[1])


def _staging_statistics(a):
    """This worker's pinned pool: buffers allocated so far, and those taken and not given back."""
    from mwrt import staging

    stats = staging.pool().statistics()
    return np.array([stats["allocations"], stats["in_use"]], np.int64)


# Sizes against a 64 KiB chunk: one chunk, exactly two, a ragged tail, and many.
CHUNKED = {"one": 10_000, "two": 32_768, "ragged": 70_001, "many": 400_003}


@pytest.mark.parametrize("size", list(CHUNKED))
def test_staged_transfers_in_chunks_in_every_direction(gpu, size, monkeypatch):
    """The master picks the chunk size (the tag carries it), so a small one here reaches the
    multi-chunk paths of master and workers alike with small arrays."""
    monkeypatch.setenv("MWRT_STAGING_CHUNK_BYTES", str(64 << 10))
    n = CHUNKED[size]
    host = np.random.default_rng(n).random(n, dtype=np.float32)
    here = mwrt.dist_send(host, device=0)  # master -> GPU
    np.testing.assert_array_equal(here.numpy(), host)  # GPU -> master
    for node, device in [(1, 0), (1, -1), (0, 0), (0, -1), (1, 0), (0, 0)]:
        here = here.to(node=node, device=device)
        assert (here.get_node(), here.get_device()) == (node, device)
        np.testing.assert_array_equal(here.numpy(), host, err_msg=f"to node {node} dev {device}")
    first = mwrt.remote(_staging_statistics)(here).numpy()
    rounds = 5
    for _ in range(rounds):  # each stages 3 transfers or more on node 0, in pool buffers
        back = mwrt.dist_send(host, device=0).to(node=1, device=0).to(node=0, device=0)
        np.testing.assert_array_equal(back.numpy(), host)
    again = mwrt.remote(_staging_statistics)(here).numpy()
    assert again[0] - first[0] < rounds and again[1] == 0, (first, again)  # reused


def test_a_failed_op_on_a_gpu_reaches_the_receivers_of_its_chunks(gpu, monkeypatch):
    """A tensor whose op failed (here: out of GPU memory) is moved: its receivers, a GPU of
    another node and the master, get the error instead of waiting for chunks."""
    monkeypatch.setenv("MWRT_STAGING_CHUNK_BYTES", str(64 << 10))
    count = int(mwrt.devices(0)[0]["total_memory"] * 1.1) // 4
    bad = mwrt.ones(count, device=0)
    moved = bad.to(node=1, device=0)
    with pytest.raises(mwrt.RemoteError, match="sent nothing|out of memory|too large"):
        moved.numpy()
    with pytest.raises(mwrt.RemoteError, match="out of memory"):
        bad.numpy()
    good = mwrt.ones(100_000, device=0).to(node=1, device=0)  # both nodes go on
    np.testing.assert_array_equal(good.numpy(), np.ones(100_000))


def test_a_cpu_only_worker_says_it_has_no_gpu():
    saved = os.environ.pop("MWRT_FAKE_GPUS", None)
    mwrt.shutdown()
    try:
        mwrt.init_master_worker(local_workers=1, timeout=30)
        if mwrt.device_count(0) > 0:
            pytest.skip("this machine's worker has a GPU")
        assert mwrt.devices(0) == []
        fix = r"node 0 has no GPU 0 \(it has no GPU: .*pip install mwrt\[cuda12\]"
        with pytest.raises(ValueError, match=fix):
            mwrt.ones(3, device=0)
        with pytest.raises(ValueError, match="node 0 has no GPU") as caught:
            mwrt.dist_send(np.ones(3)).cuda()
        assert "below" not in str(caught.value)
    finally:
        mwrt.shutdown()
        if saved is not None:
            os.environ["MWRT_FAKE_GPUS"] = saved


@pytest.fixture(params=["fake", "cupy"])
def xp(request, monkeypatch):
    """The GPU module itself, in this process: mwrt.testing.fakegpu, or CuPy where CUDA exists."""
    if request.param == "cupy":
        monkeypatch.delenv("MWRT_FAKE_GPUS", raising=False)
        if _real_gpus() == 0:
            pytest.skip("no CUDA device with CuPy on this machine (the fake GPU runs these)")
    else:
        monkeypatch.setenv("MWRT_FAKE_GPUS", str(FAKE_GPUS))
        monkeypatch.setenv("MWRT_FAKE_GPU_BYTES", str(FAKE_GPU_BYTES))
    return arrays.gpu_module()


def test_the_fake_gpu_fits_the_cupy_api_mwrt_uses(xp):
    """What mwrt calls, with CuPy's behaviour: the fake must pass what CuPy passes."""
    assert xp.cuda.runtime.getDeviceCount() == arrays.device_count() >= 1
    with xp.cuda.Device(0) as device:
        stream = xp.cuda.Stream(non_blocking=True)
        with stream:
            assert xp.cuda.get_current_stream().ptr == stream.ptr != 0
            start = stream.record(xp.cuda.Event())
            a = xp.asarray(np.arange(6, dtype=np.float32))
            b = (a * 2).reshape(2, 3).sum(axis=0)
            end = stream.record(xp.cuda.Event())
            end.synchronize()
            assert start.done and end.done and xp.cuda.get_elapsed_time(start, end) >= 0
            assert isinstance(b, xp.ndarray) and b.device == device
            np.testing.assert_array_equal(b.get(), [6, 10, 14])
            np.testing.assert_array_equal(arrays.to_host(b), [6, 10, 14])
            with pytest.raises(TypeError):
                a + np.ones(6, np.float32)  # no implicit host-device mixing
        stream.synchronize()
    free, total = xp.cuda.runtime.memGetInfo()
    assert 0 < free <= total
    assert xp.cuda.runtime.getDeviceProperties(0)["totalGlobalMem"] >= total // 2
    pinned = xp.cuda.alloc_pinned_memory(64)
    staged = np.frombuffer(pinned, np.float32, 16)
    staged[:] = 1
    np.testing.assert_array_equal(xp.asarray(staged).get(), np.ones(16))


def test_the_fake_gpu_fits_the_cupy_api_staging_and_events_use(xp):
    """What staging.py and cuda_events.py call, with CuPy's behaviour."""
    with xp.cuda.Device(0):
        stream = xp.cuda.Stream(non_blocking=True)
        pinned = np.frombuffer(xp.cuda.alloc_pinned_memory(4096), np.uint8, 4096)
        device = xp.asarray(np.arange(100, dtype=np.uint8))
        flat = xp.ascontiguousarray(device).reshape(-1).view(xp.uint8)
        flat[10:20].get(stream=stream, out=pinned[:10], blocking=False)
        copied = stream.record()
        copied.synchronize()
        np.testing.assert_array_equal(pinned[:10], np.arange(10, 20))
        pinned[:5] = 200
        flat[:5].set(pinned[:5], stream=stream)
        other = xp.cuda.Stream(non_blocking=True)
        other.wait_event(stream.record())  # the GPU orders it; the host goes on
        stream.synchronize()
        np.testing.assert_array_equal(device.get()[:6], [200] * 5 + [5])
        reference = xp.cuda.Event()
        reference.record(xp.cuda.Stream.null)
        reference.synchronize()
        later = other.record(xp.cuda.Event())
        later.synchronize()
        assert xp.cuda.get_elapsed_time(reference, later) >= 0
    runtime = xp.cuda.runtime
    if runtime.getDeviceCount() > 1:
        assert runtime.deviceCanAccessPeer(1, 0) in (0, 1)


def test_the_fake_gpu_runs_out_of_memory_as_cupy_does(monkeypatch):
    monkeypatch.setenv("MWRT_FAKE_GPUS", "1")
    monkeypatch.setenv("MWRT_FAKE_GPU_BYTES", str(1 << 20))
    from mwrt.testing import fakegpu

    held = fakegpu.zeros(200_000, np.float32)  # 800 KB of 1 MiB
    with pytest.raises(fakegpu.cuda.memory.OutOfMemoryError, match="Out of memory allocating"):
        held + 1
    del held
    assert fakegpu.cuda.runtime.memGetInfo()[0] == 1 << 20  # freed with the array
    with pytest.raises(RuntimeError, match="invalid device ordinal 1"):
        fakegpu.cuda.Device(1)


# Bytes against a 4 KiB chunk: empty, one byte, one chunk less one, exactly one, one more,
# and a ragged many.
STAGED_BYTES = [0, 1, 4095, 4096, 4097, 3 * 4096 + 5]


@pytest.mark.parametrize("ends", ["host-gpu", "gpu-host", "gpu-gpu", "host-host"])
def test_the_staging_loops_over_a_channel(xp, ends, monkeypatch):
    """staging's send and receive loops between two ranks (threads, inproc channel): every
    pairing of a host array and a GPU array, one chunk and many, empty included."""
    import threading

    from mwrt import channels
    from mwrt.store import HashStore
    from mwrt import staging

    monkeypatch.setenv("MWRT_STAGING_CHUNK_BYTES", "4096")
    store = HashStore(timeout=10)
    chans = [channels.create("inproc", r, 2, store=store, timeout=10) for r in range(2)]
    source_gpu, dest_gpu = (end == "gpu" for end in ends.split("-"))
    try:
        for nbytes in STAGED_BYTES:
            host = np.random.default_rng(nbytes).integers(0, 255, nbytes, np.uint8)
            tag = staging.tag_for(7, nbytes, True)
            assert staging.chunked(tag) == (nbytes > 4096)
            errors = []

            def send():
                try:
                    with xp.cuda.Device(0), xp.cuda.Stream(non_blocking=True) as stream:
                        array = xp.asarray(host) if source_gpu else host
                        staging.send_array(chans[0], array, 1, tag, stream)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            sender = threading.Thread(target=send)
            sender.start()
            with xp.cuda.Device(0), xp.cuda.Stream(non_blocking=True) as stream:
                receive = staging.Receive(chans[1], host.shape, host.dtype,
                                          0 if dest_gpu else -1, 0, tag)
                got = receive.finish(xp, stream, 10)
            sender.join(10)
            assert not errors and not sender.is_alive(), errors
            assert (type(got) is not np.ndarray) == dest_gpu
            np.testing.assert_array_equal(arrays.to_host(got), host, err_msg=str(nbytes))
    finally:
        for chan in chans:
            chan.close()


def test_strides_and_flags_of_a_gpu_array_are_numpys(gpu):
    """t.strides, t.flags and np.isfortran(t) of an array on a GPU (CuPy's flags say only
    the contiguity: the rest is NumPy's for a writeable, aligned array)."""
    from tests.ops.test_protocols import FLAGS

    host = np.arange(24.0).reshape(4, 6)
    t = mwrt.dist_send(host).cuda()
    for expected, got in ((host, t), (host.T, t.T), (host[::2, 1:], t[::2, 1:])):
        assert got.strides == expected.strides and np.isfortran(got) == np.isfortran(expected)
        assert [got.flags[k] for k in FLAGS] == [expected.flags[k] for k in FLAGS], got

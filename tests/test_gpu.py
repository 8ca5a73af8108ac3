"""GPU paths (CuPy): tensors on a device, moves between host and GPU, streams on a GPU.

They run where CUDA and CuPy are present and are skipped with the reason elsewhere; the
logic they exercise (namespaces per device, executors, transfers) is shared with the host
path, which the rest of the suite covers.
"""

from __future__ import annotations

import numpy as np
import pytest

from test_streams import _rendezvous_signal, _rendezvous_wait

import mwrt
from mwrt import arrays

pytestmark = pytest.mark.skipif(arrays.device_count() == 0,
                                reason="no CUDA device with CuPy on this machine")


@pytest.fixture(scope="module")
def gpu_cluster(cluster):
    if mwrt.device_count(0) == 0:
        pytest.skip("the local worker sees no GPU")
    return cluster


def test_tensor_on_a_gpu_and_back(gpu_cluster):
    x = mwrt.FloatTensor(20, 20, device=0).fill_(4)
    assert x.get_device() == 0 and x.is_cuda
    y = mwrt.dist_send(np.ones((20, 20), np.float32)).cuda()
    z = (x + y).cpu()
    assert z.get_device() == -1
    np.testing.assert_array_equal(z.numpy(), np.full((20, 20), 5, np.float32))


def test_gpu_streams_overlap(gpu_cluster):
    """Checked by ordering, not time: stream A's op waits for stream B's to signal."""
    x = mwrt.ones(3, device=0)
    with mwrt.stream(mwrt.Stream(device=0)):
        waiting = mwrt.remote(_rendezvous_wait)(x)
    with mwrt.stream(mwrt.Stream(device=0)):
        mwrt.remote(_rendezvous_signal)(x)
    assert bool(waiting.numpy()), "GPU stream B's op did not run while stream A's was running"


def test_gpu_events_order_streams(gpu_cluster):
    a, b = mwrt.Stream(device=0), mwrt.Stream(device=0)
    with mwrt.stream(a):
        x = mwrt.rand(2048, 2048, device=0)
        y = x @ x
    b.wait_event(a.record_event())
    with mwrt.stream(b):
        z = y + 1
    np.testing.assert_allclose(z.numpy(), y.numpy() + 1, rtol=1e-5)


def test_large_gpu_transfer_between_nodes(gpu_cluster):
    x = mwrt.rand(1 << 20, device=0)
    moved = x.to(node=1, device=-1)
    np.testing.assert_array_equal(moved.numpy(), x.numpy())

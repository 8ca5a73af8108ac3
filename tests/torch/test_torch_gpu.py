"""Torch handles on GPUs: device=k is torch's cuda:k on the worker, and each mwrt stream of a
GPU is a torch stream there (torch.cuda.ExternalStream over the stream's CUDA stream), so
events, synchronize() and the ordering across streams hold for torch's kernels as for
CuPy's.

The fake GPU (MWRT_FAKE_GPUS) holds NumPy arrays, not torch's: on it a torch tensor on a GPU
is refused by name, and what the master decides alone (the device a handle names, a local
tensor's device beside it) runs here. The CUDA tests run where torch sees a CUDA device and
the worker has CuPy; elsewhere they skip, saying so.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

import mwrt  # noqa: E402
import mwrt.torch  # noqa: E402
from mwrt.errors import RemoteError  # noqa: E402


def _workers(env: dict):
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the local worker inherits it
    mwrt.shutdown()
    try:
        mwrt.init_master_worker(local_workers=1, timeout=60)
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.update({name: value})


@pytest.fixture(scope="module")
def fake_gpu():
    _workers({"MWRT_FAKE_GPUS": "1"})
    yield
    mwrt.shutdown()


def test_device_names_torchs_cuda_device_and_a_fake_gpu_refuses_torch(fake_gpu):
    t = mwrt.torch.zeros(3, device=0)
    assert (t.device, t.is_cuda, t.get_device()) == (torch.device("cuda", 0), True, 0)
    moved = t.cpu()
    assert moved.device == torch.device("cpu")
    for made in (t, moved):  # the host copy of it fails for the same reason
        with pytest.raises(RemoteError, match=r"torch sees no CUDA devices.*device=-1"):
            made.torch()
    host = mwrt.torch.ones(3)  # the worker goes on: host tensors are torch's as before
    assert torch.equal((host + 1).torch(), torch.full((3,), 2.0))


def test_a_local_tensor_on_another_kind_of_device_is_named(fake_gpu):
    on_gpu = mwrt.torch.zeros(3, device=0)
    with pytest.raises(ValueError, match=r"different devices.*local tensor on cpu.*cuda:0"
                                         r".*t\.to\('cuda:0'\)"):
        on_gpu + torch.ones(3)
    host = mwrt.torch.zeros(3)
    assert torch.equal((host + torch.tensor(2.0)).torch(), torch.full((3,), 2.0))


def _cuda_reason() -> str:
    if not torch.cuda.is_available():
        return "torch sees no CUDA device on this machine (the fake GPU tests run instead)"
    try:
        import cupy  # noqa: F401 - a worker's GPU streams are CuPy's
    except ImportError:
        return "CuPy is not installed: a worker's GPU streams need it"
    return ""


@pytest.fixture(scope="module")
def cuda():
    reason = _cuda_reason()
    if reason:
        pytest.skip(reason)
    _workers({"MWRT_FAKE_GPUS": "0"})
    yield
    mwrt.shutdown()


def test_torch_on_cuda_runs_on_each_mwrt_streams_torch_stream(cuda):
    """Ops on two streams of GPU 0, ordered by the tensors they share, and a backward: the
    values are local CUDA torch's, and each stream's torch kernels ran on its own stream."""
    x0 = torch.randn(64, 8, device="cuda")
    w0 = torch.randn(8, 3, device="cuda", requires_grad=True)
    x = mwrt.dist_send(x0.cpu(), device=0)
    w = mwrt.dist_send(w0.detach().cpu().requires_grad_(), device=0)
    first, second = mwrt.Stream(0, 0), mwrt.Stream(0, 0)
    with mwrt.stream(first):
        y = torch.relu(x @ w)
    with mwrt.stream(second):
        loss = (y * y).sum()
        loss.backward()
    (torch.relu(x0 @ w0) ** 2).sum().backward()
    assert torch.allclose(loss.torch(), (torch.relu(x0 @ w0) ** 2).sum().cpu())
    assert torch.allclose(w.grad.torch(), w0.grad.cpu())
    seen = mwrt.remote(lambda t: torch.tensor(torch.cuda.current_stream().cuda_stream))
    with mwrt.stream(first):
        a = seen(x).item()
    with mwrt.stream(second):
        b = seen(x).item()
    assert a != b and 0 not in (a, b)  # two streams of their own, neither the default

"""What users do with workers on other hosts, as this stop made it work: run by tests on
simulated hosts.

    MWRT_WORKERS=b:7070,c:7070 MWRT_KEY_FILE=~/keys/master.key python mw_user_calls.py

A worker's error caught by its own class, a pipeline of shipped functions issued without a
wait, and a torch model on node 1 trained with torch's gradient clipping, saved (model,
optimizer, scheduler) and resumed: its next steps equal those of the run that went on and
a local model's. Prints 'ok' when every check passed.
"""

from __future__ import annotations

import io
import time

import numpy as np
import torch
import torch.nn.functional as F

import mwrt
import mwrt.torch


def _errors_and_pipelines() -> None:
    x = mwrt.dist_send(np.zeros((2, 2)), node=1)
    try:
        np.linalg.inv(x).numpy()
        raise AssertionError("a singular matrix inverted")
    except np.linalg.LinAlgError as exc:
        assert isinstance(exc, mwrt.RemoteError) and exc.node == 1, exc
    slow = mwrt.remote(lambda a: (time.sleep(0.2), a + 1)[1])
    before = mwrt.stats()["waits"]
    third = slow(slow(slow(x)))
    assert mwrt.stats()["waits"] == before, "a pipeline of functions waited at its calls"
    assert third.numpy().tolist() == [[3.0, 3.0], [3.0, 3.0]]


def _model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _trainer(model, optim):
    """(model, its SGD, its StepLR), of `optim` (torch.optim, or mwrt.torch.optim)."""
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, optim.lr_scheduler.StepLR(opt, 2, 0.5)


def _steps(parts, x, y, count: int) -> None:
    model, opt, sched = parts
    for _ in range(count):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        sched.step()


def _training() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    xh, yh = mwrt.dist_send(x, node=1), mwrt.dist_send(y, node=1)
    local = _trainer(_model(), torch.optim)
    going = _trainer(mwrt.torch.module(_model(), node=1), mwrt.torch.optim)
    _steps(local, x, y, 3)
    _steps(going, xh, yh, 3)
    saved = io.BytesIO()
    torch.save({name: part.state_dict() for name, part in zip("mos", going)}, saved)
    saved.seek(0)
    kept = torch.load(saved)
    resumed = _trainer(mwrt.torch.module(_model(), node=1), mwrt.torch.optim)
    for name, part in zip("mos", resumed):
        part.load_state_dict(kept[name])
    for parts, data in ((local, (x, y)), (going, (xh, yh)), (resumed, (xh, yh))):
        _steps(parts, *data, 2)
    want = local[0].state_dict()
    for name, value in resumed[0].state_dict().items():
        assert torch.equal(value, going[0].state_dict()[name]), name
        torch.testing.assert_close(value.float(), want[name].float(), msg=name)
    assert resumed[2].get_last_lr() == local[2].get_last_lr()


def main() -> None:
    mwrt.init_master_worker()
    _errors_and_pipelines()
    _training()
    mwrt.shutdown()
    print("ok")


if __name__ == "__main__":
    main()

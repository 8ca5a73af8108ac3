"""A model on a worker as a training loop uses it: torch's gradient clipping on its
parameters, its state_dict (buffers too) and its optimizer's and scheduler's to save and
resume from, its mode, all as torch's, on one node and on a mesh."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import mwrt  # noqa: E402
import mwrt.torch  # noqa: E402


def _model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _data():
    torch.manual_seed(0)
    return torch.randn(16, 6), torch.randint(0, 3, (16,))


@pytest.mark.parametrize("norm_type", [2.0, "inf"])
def test_torchs_clip_grad_norm_clips_a_remote_models_gradients_as_torchs(cluster, norm_type):
    """torch's own clip_grad_norm_ grouped the gradients with a C function that refuses
    handles ('incompatible function arguments')."""
    x, y = _data()
    local, remote = _model(), mwrt.torch.module(_model(), node=1)
    xh, yh = mwrt.dist_send(x, node=1), mwrt.dist_send(y, node=1)
    lopt = torch.optim.SGD(local.parameters(), lr=0.1)
    opt = mwrt.torch.optim.SGD(remote.parameters(), lr=0.1)
    for _ in range(3):
        for model, optimizer, a, b in ((local, lopt, x, y), (remote, opt, xh, yh)):
            optimizer.zero_grad()
            F.cross_entropy(model(a), b).backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type=norm_type)
            optimizer.step()
            if model is local:
                want = norm
        torch.testing.assert_close(norm.torch(), want)  # (its last bit: torch's threads)
    for (name, p), q in zip(remote.named_parameters(), local.parameters()):
        torch.testing.assert_close(p.torch(), q.detach(), msg=name)


def test_a_remote_models_state_dict_loads_both_ways_as_torchs(cluster):
    x, y = _data()
    remote = mwrt.torch.module(_model(), node=0)
    opt = mwrt.torch.optim.SGD(remote.parameters(), lr=0.1)
    F.cross_entropy(remote(mwrt.dist_send(x)), mwrt.dist_send(y)).backward()
    opt.step()
    saved = remote.state_dict()  # parameters and buffers, by torch's names, in its order
    assert list(saved) == list(_model().state_dict())
    assert int(saved["1.num_batches_tracked"]) == 1
    local = _model()
    assert not local.load_state_dict(saved).missing_keys
    other = mwrt.torch.module(_model(), node=1)
    assert str(other.load_state_dict(local.state_dict())) == "<All keys matched successfully>"
    other.eval()
    local.eval()
    torch.testing.assert_close(other(mwrt.dist_send(x, node=1)).torch(), local(x))
    with pytest.raises(RuntimeError, match="Missing key"):  # torch's checks, before a send
        other.load_state_dict({"0.weight": torch.zeros(8, 6)})
    kept = other.load_state_dict({"0.weight": torch.zeros(8, 6)}, strict=False)
    assert kept.missing_keys and not kept.unexpected_keys
    assert float(other.state_dict()["0.weight"].abs().sum()) == 0.0
    with pytest.raises(RuntimeError, match="size mismatch for 0.weight"):
        other.load_state_dict({**saved, "0.weight": torch.zeros(3, 3)})


def test_a_remote_models_mode_and_buffers(cluster):
    remote = mwrt.torch.module(_model(), node=0)
    assert remote.training and not remote.eval().training and remote.train().training
    assert [name for name, _ in remote.named_buffers()] == [
        "1.running_mean", "1.running_var", "1.num_batches_tracked"]
    assert [b.get_node() for b in remote.buffers()] == [0, 0, 0]
    torch.testing.assert_close(next(remote.buffers()).torch(), torch.zeros(8))


def test_to_its_own_device_and_dtype_is_the_tensor_itself(cluster):
    """torch's rule (clip_grad_norm_ calls norm.to(first_device)); the meta device cannot
    run it."""
    t = mwrt.dist_send(torch.tensor([3.0, 4.0]))
    assert t.to("cpu") is t and t.to(torch.float32) is t and t.to(t.device, t.dtype) is t
    assert t.to("cpu", copy=True) is not t
    assert t.to(torch.float64).dtype == torch.float64


def test_a_mesh_models_clipping_and_state_dict_are_torchs(cluster):
    """Data parallel on two places: the clipped norm and the weights of one local model."""
    x, y = _data()
    mesh = mwrt.mesh(nodes=[0, 1])
    local = torch.nn.Sequential(*list(_model())[::2])  # (no batch norm: each place's batch
    remote = mwrt.torch.module(torch.nn.Sequential(*list(_model())[::2]), mesh=mesh)  # differs)
    lopt = torch.optim.SGD(local.parameters(), lr=0.1)
    opt = mwrt.torch.optim.SGD(remote.parameters(), lr=0.1)
    xh, yh = mwrt.dist_send(x, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
    for model, optimizer, a, b in ((local, lopt, x, y), (remote, opt, xh, yh)):
        F.cross_entropy(model(a), b).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        if model is local:
            want = norm
    assert remote.parameters().__next__().device == torch.device("cpu")
    torch.testing.assert_close(float(norm), float(want))
    for name, value in remote.state_dict().items():
        torch.testing.assert_close(value, local.state_dict()[name], msg=name)
    assert str(remote.load_state_dict(local.state_dict())) == "<All keys matched successfully>"


@pytest.mark.parametrize("mesh", [False, True])
def test_a_training_saved_and_resumed_steps_as_the_one_never_stopped(cluster, mesh):
    """torch.save of the model's, optimizer's and scheduler's state_dicts, loaded into new
    ones: their next steps equal those of the run that went on, and a local one's."""
    x, y = _data()
    make = (lambda: torch.nn.Sequential(*list(_model())[::2])) if mesh else _model
    place = {"mesh": mwrt.mesh(nodes=[0, 1])} if mesh else {"node": 1}
    send = {"mesh": place["mesh"], "shard": 0} if mesh else place

    def trainer(model):
        opt = mwrt.torch.optim.Adam(model.parameters(), lr=1e-2)
        return model, opt, mwrt.torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)

    def steps(model, opt, sched, count):
        for _ in range(count):
            opt.zero_grad()
            F.cross_entropy(model(xh), yh).backward()
            opt.step()
            sched.step()
    xh, yh = mwrt.dist_send(x, **send), mwrt.dist_send(y, **send)
    going = trainer(mwrt.torch.module(make(), **place))
    steps(*going, 3)
    saved = io.BytesIO()
    torch.save({"model": going[0].state_dict(), "opt": going[1].state_dict(),
                "sched": going[2].state_dict()}, saved)
    saved.seek(0)
    kept = torch.load(saved)
    assert list(kept["opt"]["state"][0]) == ["step", "exp_avg", "exp_avg_sq"]
    assert going[2].get_last_lr() == [0.005]
    resumed = trainer(mwrt.torch.module(make(), **place))
    for part, name in zip(resumed, ("model", "opt", "sched")):
        part.load_state_dict(kept[name])
    steps(*going, 2)
    steps(*resumed, 2)
    assert resumed[2].get_last_lr() == going[2].get_last_lr() == [0.0025]
    for (name, a), b in zip(resumed[0].state_dict().items(), going[0].state_dict().values()):
        assert torch.equal(a, b), name


def _schedule_steps(model, opt, x, y, count: int) -> list:
    """`count` steps of a manual schedule (halve every lr, set momentum, before each step);
    the lrs read back after each."""
    read = []
    for step in range(count):
        for group in opt.param_groups:
            group["lr"] = group["lr"] * 0.5
            group["momentum"] = 0.9 if step else 0.0
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        read.append([group["lr"] for group in opt.param_groups])
    return read


@pytest.mark.parametrize("mesh", [False, True])
def test_a_manual_schedule_through_param_groups_steps_as_torchs(cluster, mesh):
    """Two groups with their own lr (the second the optimizer's default), each halved by
    hand before each step: the weights, and the lrs read back, are a local model's."""
    x, y = _data()
    make = (lambda: torch.nn.Sequential(*list(_model())[::2])) if mesh else _model
    place = {"mesh": mwrt.mesh(nodes=[0, 1])} if mesh else {"node": 1}
    send = {"mesh": place["mesh"], "shard": 0} if mesh else place
    local, remote = make(), mwrt.torch.module(make(), **place)

    def groups(model):
        first, *rest = list(model.parameters())
        return [{"params": [first], "lr": 0.4}, {"params": rest}]
    lopt = torch.optim.SGD(groups(local), lr=0.2)
    opt = mwrt.torch.optim.SGD(groups(remote), lr=0.2)
    xh, yh = mwrt.dist_send(x, **send), mwrt.dist_send(y, **send)
    want = _schedule_steps(local, lopt, x, y, 4)
    assert _schedule_steps(remote, opt, xh, yh, 4) == want == [[0.2 / 2**i, 0.1 / 2**i]
                                                               for i in range(4)]
    for (name, a), b in zip(remote.state_dict().items(), local.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    group = opt.param_groups[1]
    assert [id(p) for p in group["params"]] == [id(p) for p in remote.parameters()][1:]
    assert dict(group)["momentum"] == 0.9 and set(group) >= {"params", "lr", "nesterov"}


def test_param_groups_take_plain_values_alone_and_keep_their_params(cluster):
    remote = mwrt.torch.module(_model(), node=0)
    opt = mwrt.torch.optim.Adam(remote.parameters(), lr=1e-2)
    (group,) = opt.param_groups
    group["betas"] = (0.8, 0.9)
    assert group["betas"] == (0.8, 0.9)
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['lr'\]: expected a plain Python "
                                        r"value \(got Tensor"):
        group["lr"] = torch.tensor(0.1)
    with pytest.raises(TypeError, match=r"param_groups\[0\]: 'params' cannot be set"):
        group["params"] = []
    with pytest.raises(KeyError, match="no_such_option"):
        group["no_such_option"]
    assert group["lr"] == 1e-2

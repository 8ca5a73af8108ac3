"""torch is the oracle: random torch programs run on local tensors and on torch handles, compared.

Hypothesis writes a short program as Python source, one line at a time, over variables that
hold torch tensors of several dtypes and of 0-d, size-0 and non-contiguous shapes, some
needing grad: ops with tensors and Python scalars, views, in-place ops, `requires_grad_`,
`backward`, `no_grad`, `.grad`, optimizer steps (SGD, Adam, AdamW, kept per tensor across
lines), two streams (a slow op first, so a missing order shows) and moves to a second node
(a gradient carried back across them). Each line runs on local torch first; a line torch
refuses is dropped. The same text then runs with every variable a torch handle, and every
variable is compared, bit for bit: shape, dtype, requires_grad, is_leaf, the values, and a
leaf's gradient. test_random_mesh_programs_equal_torch runs programs of the ops a mesh
places (elementwise, reductions, matmul, backward) over a mesh of the two nodes, values
within float tolerance (the mesh sums in another order). A failure prints the program.

TORCH_DIFFERENTIAL_EXAMPLES=2000 pytest tests/torch/test_torch_differential.py \
    --hypothesis-seed=N    runs more (TORCH_MESH_DIFFERENTIAL_EXAMPLES for the mesh's).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import mwrt  # noqa: E402
import mwrt.torch  # noqa: E402

EXAMPLES = int(os.environ.get("TORCH_DIFFERENTIAL_EXAMPLES", "60"))
MESH_EXAMPLES = int(os.environ.get("TORCH_MESH_DIFFERENTIAL_EXAMPLES", "25"))
DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool"]
FLOATS = ["float32", "float64"]
SHAPES = [(), (0,), (1,), (3,), (4,), (2, 3), (3, 1), (1, 3), (2, 0), (2, 2, 2)]
BINARY = ["+", "-", "*", "/", "//", "%", "**", "&", "|", "^", "<", "<=", "==", "!=", ">",
          ">=", "@"]
SCALARS = ["0", "1", "3", "-2", "2.5", "-0.5", "True", "False"]
UNARY = ["torch.neg", "torch.abs", "torch.exp", "torch.sqrt", "torch.sin", "torch.floor",
         "torch.tanh", "torch.sigmoid", "torch.relu", "torch.square", "torch.reciprocal",
         "torch.log1p", "torch.sign", "torch.logical_not", "F.gelu", "F.silu", "F.softplus",
         "F.leaky_relu", "torch.bitwise_not", "torch.isnan"]
REDUCTIONS = ["sum", "mean", "prod", "amax", "amin", "argmax", "std", "var", "logsumexp",
              "norm", "all", "any"]
REDUCE_ARGS = ["", "0", "-1", "dim=0, keepdim=True", "dtype=torch.float64", "(0, -1)"]
VIEWS = ["[1:]", "[::2]", "[0]", "[..., 0]", "[None]", ".reshape(-1)", ".view(-1)",
         ".unsqueeze(0)", ".squeeze()", ".transpose(0, -1)", ".t()", ".narrow(0, 0, 1)",
         ".flatten()", ".movedim(0, -1)", ".unbind(0)[0]", ".split(1)[0]", ".chunk(2)[-1]",
         ".detach()", ".expand(2, *{a}.shape)", ".diagonal()", ".mT", "[:, 1:]", "[-1]"]
INPLACE = ["add_({x})", "mul_({x})", "sub_({x})", "div_({x})", "clamp_(0, 1)", "zero_()",
           "fill_({s})", "copy_({b})", "relu_()", "neg_()", "pow_(2)", "masked_fill_({a} > 0,"
           " {s})", "addcmul_({b}, {b})"]
TARGETS = ["{a}", "{a}[1:]", "{a}[0]", "{a}[::2]", "{a}[...]"]
FUNCTIONS = [
    "torch.where({a} > 0, {a}, {b})", "torch.cat([{a}, {b}])", "torch.stack([{a}, {b}])",
    "torch.maximum({a}, {b})", "torch.matmul({a}, {b})", "torch.clamp({a}, 0, 1)",
    "{a}.clone()", "{a}.contiguous()", "{a}.float()", "{a}.double()", "{a}.long()",
    "{a}.sort()[0]", "{a}.sort(descending=True)[1]", "torch.outer({a}, {b})",
    "{a}.masked_fill({a} > 0, {s})", "torch.flip({a}, [0])", "F.mse_loss({a}, {b})",
    "F.softmax({a}, dim=-1)", "F.log_softmax({a}, -1)", "torch.cumsum({a}, 0)",
    "{a}.sum() * {b}.mean()", "torch.einsum('ij,jk->ik', {a}, {b})", "{a}.abs().sqrt()",
    "torch.dot({a}, {b})", "F.linear({a}, {b})", "torch.tril({a})", "{a}.mean(0).exp()",
    "torch.lerp({a}, {b}, 0.5)", "{a}.type_as({b})", "{a}.new_zeros(2)", "{a}.new_ones(())",
    "torch.zeros_like({a})", "torch.ones_like({a}, dtype=torch.float64)",
    "torch.full_like({a}, 2)", "{a}.to(torch.{dtype})", "{a}.sum().item() * {a}",
    "{a}.size(0) * {a}", "{a}.numel() + {a}", "{a}.repeat(2)", "{a}.expand_as({b})",
    "torch.addmm({a}, {b}, {b})",
]  # not a[a > 0], nonzero, unique: their shapes depend on values, refused naming remote(fn)
GRADS = ["{a}.sum().backward()", "{a}.sum().backward(retain_graph=True)",
         "({a} * {a}).mean().backward()", "{a}.backward(torch.ones_like({a}))",
         "torch.autograd.backward([{a}.sum()])", "{a}.retain_grad()", "{a}.grad = None",
         "{a}.requires_grad_()", "{a}.requires_grad_(False)"]
OPTIMIZERS = ["SGD", "Adam", "AdamW", "SGD_momentum"]


def _slow(t):
    """A remote op that holds its stream a while, reading `t`."""
    time.sleep(0.05)


class _TorchWorld:
    """The oracle's names: local torch, streams that do nothing, moves that copy (a copy that
    carries its gradient back, as clone does) unless the tensor is there already, optimizers
    kept by the tensor's name."""

    S1 = S2 = contextlib.nullcontext()

    def __init__(self):
        self._optimizers: dict = {}

    @staticmethod
    def slow(a):
        return None

    @staticmethod
    def move(a, there: bool = False):
        return a if there else a.clone()

    def step(self, kind: str, name: str, leaf) -> None:
        found = self._optimizers.get((kind, name))
        if found is None:
            found = self._optimizers[(kind, name)] = _optimizer(torch.optim, kind, leaf)
        found.step()


def _optimizer(family, kind: str, leaf):
    if kind == "SGD_momentum":
        return family.SGD([leaf], lr=0.1, momentum=0.9)
    return getattr(family, kind)([leaf], lr=0.1)


class _MwrtWorld(_TorchWorld):
    """The same names over mwrt: two streams of node 0, a slow remote read, a move to node 1,
    optimizers on the tensor's worker."""

    def __init__(self, streams: tuple):
        super().__init__()
        self._streams = streams
        self._slow = mwrt.remote(_slow, outputs=0)

    @property
    def S1(self):
        return mwrt.stream(self._streams[0])

    @property
    def S2(self):
        return mwrt.stream(self._streams[1])

    def slow(self, a):
        self._slow(a)

    @staticmethod
    def move(a, there: bool = False):
        return a.to(node=1)

    def step(self, kind: str, name: str, leaf) -> None:
        found = self._optimizers.get((kind, name))
        if found is None:
            found = self._optimizers[(kind, name)] = _optimizer(mwrt.torch.optim, kind, leaf)
        found.step()


def _run(line: str, env: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(line, env)


@st.composite
def programs(draw, max_lines: int = 8, mesh: bool = False):
    """(initial tensors by name, which need grad, program lines, torch's final values)."""
    initial, grads = {}, set()
    for i in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from(FLOATS if mesh else DTYPES))
        shape = draw(st.sampled_from([(4,), (4, 3), (4, 1)] if mesh else SHAPES))
        initial[f"v{i}"] = _tensor(draw, dtype, shape)
        if dtype in FLOATS and draw(st.booleans()):
            grads.add(f"v{i}")
    env = _torch_env(initial, grads, [])
    nodes = dict.fromkeys(initial, 0)
    lines: list = []
    for _ in range(draw(st.integers(1, max_lines))):
        line, made, node = (_mesh_line if mesh else _line)(draw, nodes)
        try:
            _run(line, env)
        except Exception:  # noqa: BLE001 - torch refuses it (so may mwrt, in any way)
            env = _torch_env(initial, grads, lines)  # it may have written part of a tensor
            continue
        if made is not None:
            if not isinstance(env[made], torch.Tensor):
                del env[made]
                continue
            nodes[made] = node
        lines.append(line)
    final = {k: env[k] for k in nodes if isinstance(env.get(k), torch.Tensor)
             and _torch_answers(env[k])}
    return initial, grads, lines, final


def _torch_answers(tensor) -> bool:
    """Whether torch says what the comparison asks of `tensor`: it refuses is_leaf of a
    view that a multi-view function (unbind) made under no_grad once its base was written
    in place with grad on (a RuntimeError), which leaves nothing to compare."""
    try:
        return tensor.is_leaf in (True, False)
    except RuntimeError:
        return False


def _tensor(draw, dtype: str, shape: tuple):
    size = int(np.prod(shape))
    if dtype == "bool":
        values = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    elif dtype in ("int64", "int32", "uint8"):
        values = draw(st.lists(st.integers(0 if dtype == "uint8" else -50, 50), min_size=size,
                               max_size=size))
    else:
        values = draw(st.lists(st.floats(-4, 4, width=16), min_size=size, max_size=size))
    return torch.tensor(values, dtype=getattr(torch, dtype)).reshape(shape)


def _torch_env(initial: dict, grads: set, lines: list) -> dict:
    """The oracle's variables after `lines`, from fresh copies of the initial tensors."""
    env = {"torch": torch, "F": F, "world": _TorchWorld()}
    env.update({k: v.clone().requires_grad_(k in grads) for k, v in initial.items()})
    for line in lines:
        _run(line, env)
    return env


def _line(draw, nodes: dict):
    """One line of source: (text, name it binds or None, node of that name)."""
    names = sorted(nodes)
    a = draw(st.sampled_from(names))
    b = draw(st.sampled_from([n for n in names if nodes[n] == nodes[a]]))
    s = draw(st.sampled_from(SCALARS))
    new = f"v{len(nodes)}"
    kind = draw(st.sampled_from(["binary", "rbinary", "scalar", "unary", "reduce", "view",
                                 "inplace", "setitem", "func", "grad", "no_grad", "step",
                                 "stream", "move", "read_grad"]))
    fill = {"a": a, "b": b, "s": s, "x": draw(st.sampled_from([b, s])),
            "dtype": draw(st.sampled_from(DTYPES))}
    if kind == "binary":
        return f"{new} = {a} {draw(st.sampled_from(BINARY))} {b}", new, nodes[a]
    if kind == "rbinary":
        return f"{new} = {s} {draw(st.sampled_from(BINARY[:-1]))} {a}", new, nodes[a]
    if kind == "scalar":
        return f"{new} = {a} {draw(st.sampled_from(BINARY[:-1]))} {s}", new, nodes[a]
    if kind == "unary":
        return f"{new} = {draw(st.sampled_from(UNARY))}({a})", new, nodes[a]
    if kind == "reduce":
        name, args = draw(st.sampled_from(REDUCTIONS)), draw(st.sampled_from(REDUCE_ARGS))
        return f"{new} = {a}.{name}({args})", new, nodes[a]
    if kind == "view":
        return f"{new} = {a}{draw(st.sampled_from(VIEWS)).format(a=a)}", new, nodes[a]
    if kind == "inplace":
        target = draw(st.sampled_from(TARGETS)).format(a=a)
        return f"{target}.{draw(st.sampled_from(INPLACE)).format(**fill)}", None, 0
    if kind == "setitem":
        index = draw(st.sampled_from(["0", "1:", "...", "::2", "-1"]))
        return f"{a}[{index}] = {fill['x']}", None, 0
    if kind == "func":
        return f"{new} = {draw(st.sampled_from(FUNCTIONS)).format(**fill)}", new, nodes[a]
    if kind == "grad":
        return draw(st.sampled_from(GRADS)).format(a=a), None, 0
    if kind == "read_grad":
        return f"{new} = {a}.grad", new, nodes[a]
    if kind == "step":
        return f"world.step({draw(st.sampled_from(OPTIMIZERS))!r}, {a!r}, {a})", None, 0
    if kind in ("no_grad", "stream"):
        inner, made, node = _line(draw, nodes)
        if "\n" in inner:
            return inner, made, node
        if kind == "no_grad":
            return f"with torch.no_grad():\n    {inner}", made, node
        return (f"world.slow({a})\nwith world.S1:\n    {inner}\nwith world.S2:\n"
                f"    v_read = {a} * 1"), made, node
    # a tensor made from node 1's tensors is there already: its move is itself
    there = ", there=True" if nodes[a] == 1 else ""
    return f"{new} = world.move({a}{there})", new, 1


def _mesh_line(draw, nodes: dict):
    """One line of the ops a mesh places from its blocks' shapes."""
    names = sorted(nodes)
    a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
    s = draw(st.sampled_from(SCALARS[:6]))
    new = f"v{len(nodes)}"
    return draw(st.sampled_from([
        (f"{new} = {a} {draw(st.sampled_from(['+', '-', '*']))} {b}", new, 0),
        (f"{new} = {a} * {s} + 1", new, 0),
        (f"{new} = {draw(st.sampled_from(UNARY[4:10]))}({a})", new, 0),
        (f"{new} = {a}.sum()", new, 0), (f"{new} = {a}.mean(0)", new, 0),
        (f"{new} = {a}.sum(-1)", new, 0), (f"{new} = {a}.T @ {b}", new, 0),
        (f"{new} = F.softmax({a}, dim=-1)", new, 0), (f"{a}.sum().backward()", None, 0),
        (f"({a} * {b}).mean().backward()", None, 0), (f"{new} = {a}.grad", new, 0),
        (f"with torch.no_grad():\n    {new} = {a} * 2", new, 0),
    ]))


def _as_source(initial: dict, grads: set, lines: list) -> str:
    head = [f"{k} = mwrt.dist_send(torch.tensor({v.tolist()!r}, dtype={v.dtype})"
            f"{'.reshape(' + str(tuple(v.shape)) + ')' if v.numel() == 0 else ''})"
            f"{'.requires_grad_()' if k in grads else ''}" for k, v in initial.items()]
    return "\n".join(head + lines)


def _compare(name: str, want, got, source: str, exact: bool = True) -> None:
    """The handle's shape, dtype, requires_grad and leafness equal torch's, its values too
    (bit for bit where `exact`), and so does a leaf's gradient."""
    where = f"{name} of the program\n{source}\n"
    assert isinstance(got, mwrt.DistributedTensor) and got.kind == "torch", \
        f"{where}is {type(got).__name__}"
    assert tuple(got.shape) == tuple(want.shape), f"{where}shape {got.shape}, torch's {want.shape}"
    assert got.dtype == want.dtype, f"{where}dtype {got.dtype}, torch's {want.dtype}"
    assert got.requires_grad == want.requires_grad, \
        f"{where}requires_grad {got.requires_grad}, torch's {want.requires_grad}"
    assert got.is_leaf == want.is_leaf, f"{where}is_leaf {got.is_leaf}, torch's {want.is_leaf}"
    _same_values(got.torch(), want.detach(), where, exact)
    if want.is_leaf and want.requires_grad:
        grad = got.grad
        assert (grad is None) == (want.grad is None), \
            f"{where}grad {'None' if grad is None else 'set'}, torch's {want.grad}"
        if grad is not None:
            _same_values(grad.torch(), want.grad, f"{where}(its .grad) ", exact)


def _same_values(got, want, where: str, exact: bool) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{where}.torch() is {got.dtype}{list(got.shape)}, torch's {want.dtype}{list(want.shape)}"
    if exact:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=where)
    else:
        torch.testing.assert_close(got, want, equal_nan=True, msg=where)


def _check(program, streams: tuple) -> None:
    initial, grads, lines, final = program
    source = _as_source(initial, grads, lines)
    env = {"torch": torch, "F": F, "world": _MwrtWorld(streams), "mwrt": mwrt}
    env.update({k: mwrt.dist_send(v).requires_grad_(k in grads) for k, v in initial.items()})
    try:
        for line in lines:
            _run(line, env)
    except Exception as exc:
        raise AssertionError(f"mwrt raised where torch did not: {exc!r}\n{source}") from exc
    for name, want in final.items():
        _compare(name, want, env[name], source)


_SETTINGS = {"deadline": None, "database": None,
             "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture]}


@pytest.fixture(scope="module")
def two_streams(cluster):
    """Two local workers (tests/conftest.py's cluster, shared with the modules before and
    after), and two streams of node 0 (made once: a session's streams are bounded and not
    given back)."""
    yield mwrt.Stream(node=0), mwrt.Stream(node=0)


@pytest.mark.slow  # torch on both workers, then hundreds of programs
@pytest.mark.timeout(3600)
@settings(max_examples=EXAMPLES, **_SETTINGS)
@given(program=programs())
def test_random_programs_equal_torch(two_streams, program):
    _check(program, two_streams)


@pytest.mark.timeout(3600)
@settings(max_examples=MESH_EXAMPLES, **_SETTINGS)
@given(program=programs(mesh=True), shard=st.booleans())
def test_random_mesh_programs_equal_torch(two_streams, program, shard):
    """Over the mesh of both nodes: every tensor replicated, or its rows split."""
    initial, grads, lines, final = program
    m = mwrt.mesh()
    source = "\n".join(f"{k} = mwrt.dist_send(torch.tensor({v.tolist()!r}).requires_grad_("
                       f"{k in grads}), mesh=m, shard={0 if shard else None})"
                       for k, v in initial.items()) + "\n" + "\n".join(lines)
    env = {"torch": torch, "F": F, "mwrt": mwrt}
    env.update({k: mwrt.dist_send(v.clone().requires_grad_(k in grads), mesh=m,
                                  shard=0 if shard else None) for k, v in initial.items()})
    try:
        for line in lines:
            _run(line, env)
    except mwrt.PlacementError:
        return  # no placement rule for these placements: refused by name, by design
    except Exception as exc:
        raise AssertionError(f"mwrt raised where torch did not (shard={shard}): {exc!r}\n"
                             f"{source}") from exc
    for name, want in final.items():
        _compare(name, want, env[name], f"(shard={shard})\n{source}", exact=False)


# What the programs above found, each kept as a program of its own: (initial tensors, names
# that need grad, lines).
FOUND = {
    "new_ones and its kin, which torch leaves out of its overridable list, are methods": (
        {"v0": torch.zeros(2, 0)}, {"v0"},
        ["v1 = v0.new_ones(())", "v2 = v0.new_zeros(3)", "v3 = v0.new_full((2,), 3.0)",
         "v4 = v0.new_tensor([1.0, 2.0])", "v5 = v0.new_empty(0)"]),
    "-, + and abs() of a handle are torch's neg, positive and abs, not NumPy's": (
        {"v0": torch.tensor([1.0, -2.0]), "v1": torch.tensor([3, -4])}, {"v0"},
        ["v2 = -2 ** v0", "v3 = +v0", "v4 = abs(v0)", "v5 = -v1", "v6 = ~v1", "v7 = abs(v1)"]),
    "a tensor without elements may come back with any strides (flip's are (0, 0))": (
        {"v0": torch.zeros(2, 0, dtype=torch.float16)}, set(),
        ["v1 = torch.flip(v0, [0])", "v2 = torch.flip(v0, [0, 1]) + 1"]),
    ".to(node=) of a tensor already there is the tensor (seed 7)": (
        {"v0": torch.tensor([1.0, 2.0]), "v1": torch.tensor([3.0])}, {"v1"},
        ["v2 = world.move(v0)", "v3 = world.move(v1)", "v4 = world.move(v2, there=True)",
         "v5 = world.move(v3 * 2, there=True)", "v2.add_(v2)", "v4.mul_(3)"]),
    "a 0-d tensor that needs grad, set into a slice, makes even an integer tensor need it": (
        {"v0": torch.zeros(0, dtype=torch.int64), "v1": torch.tensor(2.0),
         "v2": torch.arange(3), "v3": torch.zeros(2, 2, dtype=torch.int32),
         "v4": torch.zeros(2, 2, dtype=torch.int32), "v5": torch.zeros(3)}, {"v1"},
        ["v0[1:] = v1", "v2[1:] = v1", "v3[..., 0] = v1", "v4[1] = v1 * 2", "v5[0] = v1"]),
    "a bool tensor to a bool power is bool, as torch's kernel gives (seed 1)": (
        {"v0": torch.tensor(False), "v1": torch.tensor([False, True]),
         "v2": torch.tensor([True, False])}, set(),
        ["v3 = v0 ** True", "v4 = torch.pow(v1, False)", "v5 = v1[::2].pow(True)",
         "v2.pow_(True)", "v1 **= False"]),
    "views made before their base's requires_grad_() need grad with it (seed 2)": (
        {"v0": torch.zeros(2, 3), "v1": torch.zeros(4)}, set(),
        ["v2 = v0[1:]", "v3 = v0.t()", "v4 = v0[0][1:]", "v5 = v0.detach()",
         "v0.requires_grad_()", "v6 = v1[::2]", "v6.requires_grad_()", "v1.requires_grad_()",
         "v1.requires_grad_(False)", "v7 = v2 * 2", "(v2.sum() + v6.sum() + v7.sum()).backward()",
         "v8 = v6.grad"]),
    ".to(node=) of a tensor already there is itself under no_grad too (seed 2)": (
        {"v0": torch.tensor(1.0)}, {"v0"},
        ["v1 = world.move(v0)", "with torch.no_grad():\n    v2 = world.move(v1, there=True)",
         "v2.mul_(3)"]),
    "a view made before its storage was written in place is no leaf once its base needs "
    "grad (torch makes its grad_fn again, an AsStridedBackward0), whatever its size": (
        {"v0": torch.zeros(0), "v1": torch.tensor([1.0, 2.0, 3.0]), "v2": torch.zeros(2, 3)},
        set(),
        ["v3 = v0 + v0", "v5 = v3[1:]", "v3.add_(v0)", "v3.requires_grad_()",
         "v6 = v1[1:]", "v7 = v1[:1]", "v7.mul_(2)", "v8 = v1[::2]", "v1.requires_grad_()",
         "(v6 * 2).sum().backward()", "v9 = v2[0]", "v2.requires_grad_()",
         "with torch.no_grad():\n    v2.t_()", "v9.sum().backward()"]),
    "a view made under no_grad of a tensor that needs grad needs grad, a leaf that gets no "
    "gradient (seed 8)": (
        {"v0": torch.tensor(0.0), "v1": torch.zeros(0), "v2": torch.ones(3)}, {"v1", "v2"},
        ["v3 = v0 + v1", "with torch.no_grad():\n    v4 = v3[1:]", "v5 = v2 * 2",
         "with torch.no_grad():\n    v6 = v5[1:]\n    v7 = v2[1:]\n    v8 = v5.view(-1)",
         "((v6 * 2).sum() + v7.sum() + v8.sum()).backward()", "v9 = v2.grad"]),
    "torch refuses is_leaf of an unbind view written in place, which leaves nothing to "
    "compare of it (seed 11)": (
        {"v0": torch.ones(2, 3)}, set(),
        ["v1 = v0.unbind(0)[0]", "with torch.no_grad():\n    v1.add_(1)",
         "v0.requires_grad_()", "v2 = v0 * 2"]),
}


@pytest.mark.parametrize("what", FOUND)
def test_what_the_programs_found(two_streams, what):
    initial, grads, lines = FOUND[what]
    env = _torch_env(initial, grads, lines)
    final = {k: v for k, v in env.items() if k.startswith("v") and k != "v_read"
             and isinstance(v, torch.Tensor) and _torch_answers(v)}
    _check((initial, grads, lines, final), two_streams)


def test_requires_grad_of_a_mesh_tensor_in_place(two_streams):
    """Found by the mesh programs: t.requires_grad_() set it at every place, but
    t.requires_grad stayed False on the master (v1 = v0 + v0 then needed no grad either)."""
    t = mwrt.dist_send(torch.zeros(4), mesh=mwrt.mesh())
    assert t.requires_grad_() is t
    assert all(b.requires_grad for b in t._locals)
    assert t.requires_grad and (t + t).requires_grad


def test_a_resolved_partial_keeps_requires_grad(two_streams):
    """Found by the mesh programs (seed 2): v1 = v0.sum() of a row-sharded leaf that needs
    grad is Partial; v1 * 0 + 1 is Replicate and needs grad in torch, not on the mesh."""
    v0 = mwrt.dist_send(torch.zeros(4).requires_grad_(), mesh=mwrt.mesh(), shard=0)
    v4 = v0.sum() * 0 + 1
    assert v4.requires_grad and not v4.is_leaf


RESOLVED = {  # losses whose graph passes a Partial made real (the sum over the sharded rows)
    "a replicated root, the Partial used twice": lambda x, w: (x.sum() * x.sum()),
    "a sharded root, its sum times the rows": lambda x, w: (x * x.sum()).sum(),
    "a replicated leaf reached by both kinds of walk": lambda x, w: (
        (x * w).sum() ** 2 + (w * w).sum()),
    "a chain: a resolved sum inside another": lambda x, w: (
        (x * (x * w).sum()).mean() * 3),
    "a mean loss, resolved and scaled": lambda x, w: F.mse_loss(x * w, x).exp(),
}


@pytest.mark.parametrize("shard", [0, None])
@pytest.mark.parametrize("what", RESOLVED)
def test_backward_through_a_resolved_partial_gives_torch_gradients(two_streams, what, shard):
    """The resolve is in autograd's graph: a backward through it leaves torch's gradients,
    on a sharded and on a replicated leaf (each place's part carried to the others)."""
    loss = RESOLVED[what]
    x0 = torch.tensor([[1.0, -2.0], [0.5, 3.0], [2.0, 1.0], [-1.0, 0.25]], dtype=torch.float64)
    w0 = torch.tensor([0.5, -1.5], dtype=torch.float64)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    want = loss(x, w)
    want.backward()
    m = mwrt.mesh()
    hx = mwrt.dist_send(x0.clone().requires_grad_(), mesh=m, shard=shard)
    hw = mwrt.dist_send(w0.clone().requires_grad_(), mesh=m)
    got = loss(hx, hw)
    assert got.requires_grad and not got.is_leaf
    got.backward()
    torch.testing.assert_close(got.torch(), want.detach())
    for leaf, local in ((hx, x), (hw, w)):
        assert (leaf.grad is None) == (local.grad is None)
        if local.grad is not None:
            torch.testing.assert_close(leaf.grad.torch(), local.grad)


def test_a_second_backward_through_a_resolved_partial_accumulates(two_streams):
    """Two backwards (the graph retained) add up, and backward(inputs=) reaches the leaf
    through the resolve."""
    x0 = torch.tensor([1.0, 2.0, -3.0, 0.5], dtype=torch.float64)
    x = x0.clone().requires_grad_()
    hx = mwrt.dist_send(x0.clone().requires_grad_(), mesh=mwrt.mesh(), shard=0)
    for t in (x, hx):
        s = t.sum() * t.sum()
        s.backward(retain_graph=True)
        s.backward(inputs=[t])
    torch.testing.assert_close(hx.grad.torch(), x.grad)

"""The public API as a user meets it in help() and an editor: a docstring on every public
name and tensor method (operators included), real names and signatures on the generated
methods, type hints that resolve, py.typed, and the methods NumPy and torch users expect."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import typing

import numpy as np
import pytest

import mwrt
import mwrt.distributed as dist
from mwrt import ops
from mwrt.master import methods
from mwrt.master.handle import Handle

T = mwrt.DistributedTensor
# Class attributes that are data, not API.
_DATA = {"__module__", "__doc__", "__slots__", "__array_priority__", "__weakref__", "__hash__",
         "__annotations__", "__dict__", *T.__slots__}


def _own_members() -> dict:
    """What DistributedTensor and its bases above Handle define (its reads are a base's)."""
    own = [cls for cls in T.__mro__ if issubclass(cls, Handle) and cls is not Handle]
    return {name: value for cls in reversed(own) for name, value in vars(cls).items()}


def _public_tensor_members() -> dict:
    return {name: value for name, value in _own_members().items()
            if name not in _DATA and (not name.startswith("_") or name.endswith("__"))}


def _doc(value) -> str:
    return (getattr(value, "__doc__", None) or "").strip()


def test_every_public_name_and_tensor_method_has_a_docstring():
    missing = [f"mwrt.{name}" for name in mwrt.__all__ if not _doc(getattr(mwrt, name))]
    missing += [f"mwrt.distributed.{name}" for name in dist.__all__
                if callable(getattr(dist, name)) and not _doc(getattr(dist, name))]
    missing += [f"DistributedTensor.{name}" for name, value in _public_tensor_members().items()
                if not _doc(value)]
    assert not missing, f"no docstring: {', '.join(missing)}"
    assert len(_public_tensor_members()) > 150  # the operators and generated methods count


# The errors only a master meets: an SPMD rank has no workers, sessions or meshes.
_MASTER_ONLY_ERRORS = {"RemoteError", "WorkerLostError", "QuotaError", "PlacementError"}


def test_every_error_class_is_a_public_name():
    """`except mwrt.AuthError` works for every class of mwrt.errors, and `except
    dist.ChannelTimeoutError` for every one an SPMD rank meets: the same classes."""
    import mwrt.errors

    classes = {name: obj for name, obj in vars(mwrt.errors).items()
               if isinstance(obj, type) and issubclass(obj, Exception)}
    assert {"AuthError", "ConfigError", "ChannelTimeoutError", "RendezvousError"} <= set(classes)
    assert [n for n in classes if n not in mwrt.__all__ or getattr(mwrt, n) is not
            classes[n]] == []
    spmd = set(classes) - _MASTER_ONLY_ERRORS
    assert [n for n in spmd if n not in dist.__all__ or getattr(dist, n) is not classes[n]] == []
    assert not _MASTER_ONLY_ERRORS & set(dist.__all__)


def test_every_registry_op_has_a_one_line_doc():
    missing = [name for name in ops.names() if not ops.doc(name)]
    assert not missing, f"ops without a doc: {missing}"
    assert all("\n" not in ops.doc(name) for name in ops.names())
    assert ops.doc("add") == "Add arguments element-wise."
    assert ops.doc("add_").startswith("In place: add")


def test_generated_methods_have_real_names_and_signatures():
    add = T.__add__
    assert (add.__name__, add.__qualname__) == ("__add__", "DistributedTensor.__add__")
    assert list(inspect.signature(add).parameters) == ["self", "other"]
    assert add.__doc__.startswith("self + other: add arguments element-wise (np.add)")
    assert T.__rsub__.__doc__.startswith("other - self:")
    assert T.__imul__.__doc__.startswith("self *= other:")
    assert T.__lt__.__doc__.startswith("self < other:")
    assert T.__neg__.__doc__.startswith("-self:") and T.__abs__.__doc__.startswith("abs(self)")
    assert T.__matmul__.__doc__.startswith("self @ other")
    assert list(inspect.signature(T.sum).parameters) == [  # NumPy's, as they bind
        "self", "axis", "dtype", "out", "keepdims", "initial", "where"]
    assert T.sum.__qualname__ == "DistributedTensor.sum" and "np.sum" in T.sum.__doc__
    assert T.exp.__name__ == "exp" and "exponential" in T.exp.__doc__
    assert T.add_.__name__ == "add_" and T.add_.__doc__.startswith("self += other")
    for name, value in _public_tensor_members().items():
        if inspect.isfunction(value) and value.__name__ != name:
            # an alias (view = reshape, clamp = clip): it must name what it is
            assert getattr(T, value.__name__) is value, (name, value.__name__)


def _hints_missing(qualname: str, fn) -> list[str]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # a hint that does not resolve is as bad as none
        return [f"{qualname}: hints do not resolve ({exc})"]
    params = [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]
    lacking = [p for p in params if p not in hints] + ([] if "return" in hints else ["return"])
    return [f"{qualname}: {', '.join(lacking)}"] if lacking else []


def test_public_functions_and_methods_have_type_hints():
    missing = []
    for name in mwrt.__all__:
        value = getattr(mwrt, name)
        if inspect.isfunction(value):
            missing += _hints_missing(f"mwrt.{name}", value)
    for name in dist.__all__:
        value = getattr(dist, name)
        if inspect.isfunction(value) and value.__module__.startswith("mwrt.distributed"):
            missing += _hints_missing(f"mwrt.distributed.{name}", value)
    for name, value in _public_tensor_members().items():
        if inspect.isfunction(value) and (not name.startswith("_") or name in _own_members()):
            missing += _hints_missing(f"DistributedTensor.{name}", value)
    assert not missing, "missing type hints:\n" + "\n".join(missing)


def test_the_package_is_marked_typed():
    root = os.path.dirname(mwrt.__file__)
    assert os.path.isfile(os.path.join(root, "py.typed"))


@pytest.mark.skipif(shutil.which("mypy") is None and
                    subprocess.run([sys.executable, "-m", "mypy", "--version"],
                                   capture_output=True).returncode != 0,
                    reason="mypy is not installed (optional: pip install mypy)")
@pytest.mark.slow  # mypy's run
def test_mypy_checks_a_user_script(tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(
        "import numpy as np\nimport mwrt\n\n"
        "a = mwrt.ones(3, 3)\n"
        "b: mwrt.DistributedTensor = (a + 1) @ a.T\n"
        "c = b.sum(axis=0, keepdims=True).sqrt()\n"
        "n: int = b.numel()\n"
        "v: np.ndarray = (c > 0).numpy()\n"
        "w = np.linalg.inv(b)\n")
    bad.write_text("import mwrt\n\nn: str = mwrt.ones(3).numel()\nmwrt.zeros(3, node='a')\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
    run = [sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-error-summary",
           "--cache-dir", str(tmp_path / "cache")]
    ok = subprocess.run([*run, str(good)], capture_output=True, text=True, cwd=root, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    wrong = subprocess.run([*run, str(bad)], capture_output=True, text=True, cwd=root,
                           timeout=300)
    assert wrong.returncode == 1 and wrong.stdout.count("error:") == 2, wrong.stdout


# -- the methods NumPy and torch users expect, against NumPy ------------------------------

def test_expected_methods_equal_numpy(cluster):
    a = np.arange(1.0, 13.0, dtype=np.float32).reshape(3, 4)
    t = mwrt.dist_send(a)
    cases = {
        "sum": (t.sum(axis=1, keepdims=True), a.sum(axis=1, keepdims=True)),
        "mean": (t.mean(axis=0), a.mean(axis=0)), "max": (t.max(), a.max()),
        "min": (t.min(axis=1), a.min(axis=1)), "argmax": (t.argmax(axis=0), a.argmax(axis=0)),
        "reshape": (t.reshape(4, 3), a.reshape(4, 3)), "view": (t.view(-1), a.reshape(-1)),
        "transpose": (t.transpose(), a.T), "T": (t.T, a.T), "permute": (t.permute(1, 0), a.T),
        "flatten": (t.flatten(), a.flatten()),
        "squeeze": (t.reshape(1, 3, 4).squeeze(), a), "unsqueeze": (t.unsqueeze(0), a[None]),
        "clone": (t.clone(), a), "copy": (t.copy(), a), "astype": (t.astype("f8"), a),
        "float": (t.double().float(), a), "int": (t.int(), a.astype(np.int32)),
        "abs": ((-t).abs(), a), "sqrt": (t.sqrt(), np.sqrt(a)), "exp": (t.exp(), np.exp(a)),
        "log": (t.log(), np.log(a)), "clamp": (t.clamp(2, 5), np.clip(a, 2, 5)),
        "clip": (t.clip(a_max=3), np.clip(a, None, 3)), "pow": (t.pow(2), a ** 2),
        "**": (t ** 2, a ** 2), "dot": (t.dot(t.T), a.dot(a.T)),
        "matmul": (t.matmul(t.T), a @ a.T), "@": (t @ t.T, a @ a.T),
        "all": (t.all(), a.all()), "any": ((t > 11).any(axis=0), (a > 11).any(axis=0)),
        "add": (t.add(1), a + 1), "sub": (t.sub(t), a - a), "mul": (t.mul(2), a * 2),
        "div": (t.div(2), a / 2), "maximum": (t.maximum(6), np.maximum(a, 6)),
        "expand": (t[0:1].expand(3, 4), np.broadcast_to(a[0:1], (3, 4))),
        "contiguous": (t.T.contiguous(), np.ascontiguousarray(a.T)),
        "round": ((t / 3).round(1), np.round(a / 3, 1)), "sort": (np.sort(-t), np.sort(-a)),
        "argsort": ((-t).argsort(axis=0), np.argsort(-a, axis=0)),
        "trace": (t.trace(), np.trace(a)), "diagonal": (t.diagonal(), a.diagonal()),
        "square": (t.square(), a * a), "neg": (t.neg(), -a),
    }
    for name, (got, expected) in cases.items():
        expected = np.asarray(expected)
        assert got.shape == expected.shape, (name, got.shape, expected.shape)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, err_msg=name)
    assert t[1, 2].item() == 7.0
    assert t.tolist() == a.tolist() and float(t[0, 0]) == 1.0


def test_sizes_answer_as_numpy_and_torch_do(cluster):
    t = mwrt.zeros(3, 4)
    assert t.size == 12 and t.size() == (3, 4) and t.size(1) == 4 and t.numel() == 12
    assert t.ndim == t.dim() == 2 and t.shape == (3, 4) and t.dtype == np.float32
    assert t.nbytes == 48 and t.itemsize == t.element_size() == 4 and len(t) == 3
    rows = list(t)  # __iter__: one tensor per row, made worker-side as the loop asks
    assert len(rows) == 3 and rows[0].shape == (4,)

"""The generic NumPy op as an attacker uses it (issue 27, items 1-3): bare commands to an
unkeyed daemon, which any local user can reach. Only listed functions run; none reads or
writes outside the arrays it is given, none hands out another master's memory, and every
result is sized before anything is allocated (the worker's peak RSS, from /proc, says so)."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from tests.support.daemons import start_worker, stop_worker
from tests.faults.test_faults_wire import RawMaster
from tests.worker.test_quotas import MiB, status

import mwrt
from mwrt.ops import numpy_allowlist
from mwrt.protocol import wire

X = 1  # the tensor every attack is given: 16 bytes of float64


@pytest.fixture
def daemon():
    """An unkeyed daemon with a 1 MiB tensor limit: (process, address)."""
    mwrt.shutdown()
    process, address = start_worker(env={"MWRT_MAX_TENSOR_BYTES": str(MiB),
                                         "MWRT_SYNC_TIMEOUT": "5"})
    yield process, address
    stop_worker(process)


SESSIONS = itertools.count()  # a session's name is one master's: each attack opens its own


@pytest.fixture(scope="module")
def shared_daemon():
    """The daemon of `daemon`, for the many attacks one after another it survives."""
    mwrt.shutdown()
    process, address = start_worker(env={"MWRT_MAX_TENSOR_BYTES": str(MiB),
                                         "MWRT_SYNC_TIMEOUT": "5"})
    yield process, address
    stop_worker(process)


class Attacker(RawMaster):
    """A bare master that runs one `numpy` op per batch and reads its answer."""

    def __init__(self, address: str, session: str = "attacker"):
        super().__init__(address, session)
        self.seq = 0
        self.run([wire.Create(1, -1, X, "ones", (2,), "<f8", -1, ())])

    def recv(self, role=b"rx", timeout: float = 5.0):
        """The next reply; a Data's array is kept as `self.array`."""
        sock = self.socks[role]
        if not sock.poll(timeout * 1000):
            return None
        frames = sock.recv_multipart()
        _, (reply,), data = wire.decode(frames)
        if isinstance(reply, wire.Data):
            self.array = np.frombuffer(data[0], np.dtype(reply.dtype)).reshape(reply.shape)
        return reply

    def run(self, commands: list):
        """Send a batch ending in a Sync; the reply to the first command that failed, or Done."""
        self.seq += 1
        self.batch(self.seq, [*commands, wire.Sync(self.seq * 1000, -1, self.seq)])
        return self.recv(timeout=30)

    def numpy(self, path: str, *args, out: int = 7, **kwargs):
        """np.<path>(*args) on the worker as tensor `out`, then read back: Data or Failed."""
        self.seq += 1
        self.batch(self.seq, [wire.Call(self.seq * 1000, -1, (out,), "numpy", (path, 0, *args),
                                        kwargs), wire.Get(self.seq * 1000 + 1, -1, out, self.seq),
                                   wire.Free(self.seq * 1000 + 2, -1, (out,), 1)])
        return self.recv(timeout=30)


REF = wire.Ref(X)
# Paths to the worker's memory, files, libraries and code: all refused by name.
ATTACKS = [
    ("lib.stride_tricks.as_strided", (REF, (6 * MiB,), (1,))),
    ("lib.stride_tricks.as_strided", (REF, (2,), (40000,))),
    ("frombuffer", (b"\x00" * 16,)),
    ("ctypeslib.as_array", (0, (16,))),
    ("lib.format.read_array", ("/etc/passwd",)),
    ("load", ("/etc/passwd",)),
    ("save", ("/tmp/mwrt-attack-saved", REF)),
    ("fromfile", ("/etc/passwd",)),
    ("memmap", ("/etc/passwd",)),
    ("ndarray", ((16,), "u1", b"\x00" * 16)),
    ("ndarray.__new__", ("ndarray", (16,))),
    ("apply_along_axis", ("print", 0, REF)),
    ("vectorize", ("print",)),
    ("frompyfunc", ("print", 1, 1)),
    ("piecewise", (REF, (), ())),
    ("fromiter", ((1, 2), "f8")),
    ("empty", ((1024,),)),
    ("_core.multiarray.empty", ((1024,),)),
    ("lib.npyio.DataSource", ("/etc",)),
    ("testing.assert_equal", (REF, REF)),
    ("__builtins__.open", ("/etc/passwd",)),
]


@pytest.mark.parametrize("path,args", ATTACKS, ids=[f"{p}-{i}" for i, (p, _) in
                                                    enumerate(ATTACKS)])
def test_paths_into_memory_files_or_code_are_refused_by_name(shared_daemon, path, args):
    process, address = shared_daemon
    attacker = Attacker(address, f"attacker-{next(SESSIONS)}")
    try:
        reply = attacker.numpy(path, *args)
        assert isinstance(reply, wire.Failed), reply
        message = reply.info["message"]
        assert f"np.{path}: " in message and "not a NumPy function mwrt runs" in message, message
        assert not os.path.exists("/tmp/mwrt-attack-saved.npy")
        assert attacker.alive() and process.poll() is None
        # The session is still usable: a listed function runs.
        reply = attacker.numpy("linalg.norm", REF)
        assert isinstance(reply, wire.Data), reply
    finally:
        attacker.close()


def test_in_place_functions_are_their_own_short_list(daemon):
    _, address = daemon
    attacker = Attacker(address)
    try:
        for path in ("lib.stride_tricks.as_strided", "copyto_", "einsum"):
            attacker.seq += 1
            reply = attacker.run([wire.Call(attacker.seq * 100, -1, (), "numpy_",
                                            (REF, path, REF), {})])
            assert isinstance(reply, wire.Failed), reply
            assert "not a NumPy function mwrt runs" in reply.info["message"], reply.info
        assert isinstance(attacker.run([wire.Call(5, -1, (), "numpy_", (REF, "copyto", REF), {})]),
                          wire.Done)
    finally:
        attacker.close()


def test_no_result_holds_another_masters_freed_memory(daemon):
    _, address = daemon
    victim, attacker = Attacker(address, "victim"), Attacker(address, "attacker")
    try:
        marker = float.fromhex("0x1.5a5a5a5a5a5a5p+0")
        ids = list(range(100, 132))
        victim.run([wire.Create(2, -1, i, "full", (8192,), "<f8", -1, (marker,)) for i in ids])
        victim.run([wire.Free(3, -1, tuple(ids), 1)])
        attacker.run([wire.Create(4, -1, 50, "zeros", (8192,), "<f8", -1, ())])
        for path, args in (("empty_like", (wire.Ref(50),)), ("zeros_like", (wire.Ref(50),)),
                           ("empty_like", (wire.Ref(50), "<f8", "C", True, (8192,)))):
            reply = attacker.numpy(path, *args, out=60)
            assert isinstance(reply, wire.Data), reply
            assert attacker.array.shape == (8192,) and not attacker.array.any(), path
        reply = attacker.numpy("empty", (8192,), out=61)
        assert isinstance(reply, wire.Failed) and "np.empty: not a NumPy" in reply.info["message"]
    finally:
        victim.close()
        attacker.close()


# Arguments that size a result far past 1 MiB; each is refused before it is made.
OVERSIZED = [
    ("zeros_like", (REF,), {"shape": (10**8,)}),
    ("ones_like", (REF, "u1", "C", True, (10**8,)), {}),
    ("full_like", (REF, 7), {"shape": (10**8,)}),
    ("zeros_like", (REF,), {"dtype": "V1000000"}),
    ("fft.fft", (REF, 10**8), {}),
    ("fft.irfftn", (REF,), {"s": (10**8,)}),
    ("histogram", (REF,), {"bins": 10**8}),
    ("histogram2d", (REF, REF), {"bins": 10**4}),
    ("vander", (REF, 10**8), {}),
    ("diagflat", (REF,), {"k": 10**4}),
    ("diag", (REF, 10**4), {}),
    ("lib.stride_tricks.sliding_window_view", (REF, 10**8), {}),
    ("percentile", (REF, tuple(range(10)) * 10000), {"axis": None}),
    # Inline arrays count their elements, dtypes their itemsize (issue 35, item 3).
    ("tile", (np.arange(100_000.0), 400), {}),
    ("repeat", (np.arange(100_000.0), 400), {}),
    ("vander", (np.arange(6000.0),), {}),
    ("diagflat", (np.arange(6000.0),), {}),
    ("meshgrid", (np.arange(6000.0), np.arange(6000.0)), {}),
    ("cov", (np.zeros((6000, 2)),), {}),
    ("histogramdd", (np.zeros((2, 8)),), {"bins": 10}),
    ("histogramdd", (np.zeros((2, 3)),), {"bins": np.array([1000, 1000, 1000])}),
    ("histogram", (REF,), {"bins": np.int64(10**8)}),
    ("outer", (np.arange(6000.0), np.arange(6000.0)), {}),
    ("clip", (np.zeros((1, 6000)), np.zeros((6000, 1)), 1.0), {}),
    ("zeros_like", (REF, ("f8", (4_000_000,))), {}),
    ("sum", (REF, None, ("f8", (4_000_000,))), {}),
]


@pytest.mark.parametrize("path,args,kwargs", OVERSIZED,
                         ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(OVERSIZED)])
def test_results_are_sized_before_they_are_made(shared_daemon, path, args, kwargs):
    process, address = shared_daemon
    attacker = Attacker(address, f"attacker-{next(SESSIONS)}")
    try:
        before = status(process.pid, "VmHWM")
        reply = attacker.numpy(path, *args, **kwargs)
        assert isinstance(reply, wire.Failed), reply
        assert "MWRT_MAX_TENSOR_BYTES" in reply.info["message"] or \
            "bins" in reply.info["message"], reply.info
        assert status(process.pid, "VmHWM") - before < 32 * MiB
        assert isinstance(attacker.numpy("linalg.norm", REF), wire.Data)  # the session goes on
    finally:
        attacker.close()


# Arguments that would have the worker make arrays of Python objects, whose work and memory
# have no bound (a cumulative product of Python ints grows each element's digits).
OBJECTS = [
    ("cumprod", (wire.Ref(2),), {"dtype": "O"}),
    ("prod", (wire.Ref(2),), {"dtype": "object"}),
    ("cumprod", (wire.Ref(2), None, "O")),
    ("zeros_like", (REF,), {"dtype": {"names": ["a"], "formats": ["O"]}}),
    ("sum", (REF, None, ("O", (2,))), {}),
    ("cumprod", ((2**62,) * 2000 + (None,),), {}),
]


@pytest.mark.parametrize("path,args,kwargs", [c if len(c) == 3 else (*c, {}) for c in OBJECTS],
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(OBJECTS)])
def test_object_dtype_is_refused_by_name_before_anything_is_made(shared_daemon, path, args,
                                                                 kwargs):
    process, address = shared_daemon
    attacker = Attacker(address, f"attacker-{next(SESSIONS)}")
    try:
        assert isinstance(attacker.run([wire.Create(2, -1, 2, "arange", (20_000,), "<i8", -1,
                                                    (1, 20_001))]), wire.Done)
        before = status(process.pid, "VmHWM")
        reply = attacker.numpy(path, *args, **kwargs)
        assert isinstance(reply, wire.Failed), reply
        message = reply.info["message"]
        assert f"np.{path}: makes an array of Python objects" in message, reply.info
        assert "object dtype is refused" in message, reply.info
        assert status(process.pid, "VmHWM") - before < 32 * MiB
        assert isinstance(attacker.numpy("linalg.norm", REF), wire.Data)  # the session goes on
    finally:
        attacker.close()


# The in-place op's arguments: Python objects, and places visited past the target's own.
IN_PLACE = [
    ("copyto", ((2**62,) * 2000 + (None,),), {}, "makes an array of Python objects"),
    ("put", ((0, 1), (1, None)), {}, "makes an array of Python objects"),
    ("putmask", (REF, (1.0, None)), {}, "makes an array of Python objects"),
    # indices (1000, 1) along a (1, 65536) target: 65 million places, 500 MiB of float64
    ("put_along_axis", (np.zeros((1000, 1), np.int64), 1.0), {"axis": 0},
     "MWRT_MAX_TENSOR_BYTES"),
    ("copyto", (np.zeros((1, 65536)),), {"where": np.ones((1000, 1), bool)},
     "MWRT_MAX_TENSOR_BYTES"),
]


@pytest.mark.parametrize("path,args,kwargs,named", IN_PLACE,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(IN_PLACE)])
def test_in_place_arguments_are_refused_before_anything_runs(shared_daemon, path, args,
                                                             kwargs, named):
    process, address = shared_daemon
    attacker = Attacker(address, f"attacker-{next(SESSIONS)}")
    try:
        wide = wire.Ref(3)  # 512 KiB: a target the limit admits
        assert isinstance(attacker.run([wire.Create(2, -1, 3, "zeros", (1, 65536), "<f8", -1,
                                                    ())]), wire.Done)
        target = REF if named.startswith("makes") else wide
        before = status(process.pid, "VmHWM")
        reply = attacker.run([wire.Call(5, -1, (), "numpy_", (target, path, *args), kwargs)])
        assert isinstance(reply, wire.Failed), reply
        assert f"np.{path}: " in reply.info["message"], reply.info
        assert named in reply.info["message"], reply.info
        assert status(process.pid, "VmHWM") - before < 32 * MiB
        reply = attacker.run([wire.Call(6, -1, (), "numpy_", (wide, "put_along_axis",
                                                              np.zeros((1, 4), np.int64), 2.0),
                                        {"axis": 1})])  # the same, in bounds, runs
        assert isinstance(reply, wire.Done), reply
        assert isinstance(attacker.numpy("linalg.norm", REF), wire.Data)  # the session goes on
    finally:
        attacker.close()


def test_object_tensors_are_refused_by_name_where_they_would_be_made(shared_daemon):
    _, address = shared_daemon
    attacker = Attacker(address, f"attacker-{next(SESSIONS)}")
    try:
        made = [wire.Create(2, -1, 9, "zeros", (1000,), "|O", -1, ()),
                wire.Create(2, -1, 9, "full", (1000,), "O", -1, (1,)),
                wire.Call(2, -1, (9,), "astype", (REF, "O"), {})]
        for command in made:
            reply = attacker.run([command])
            assert isinstance(reply, wire.Failed), (command, reply)
            assert "object dtype" in reply.info["message"], (command, reply.info)
        attacker.seq += 1  # a dist_send's bytes read as pointers
        attacker.batch(attacker.seq, [wire.Put(2, -1, 9, (2,), "|O", -1, 0),
                                      wire.Sync(3, -1, attacker.seq)], frames=[bytes(16)])
        reply = attacker.recv(timeout=30)
        assert isinstance(reply, wire.Failed) and "object dtype" in reply.info["message"], reply
        assert isinstance(attacker.numpy("linalg.norm", REF), wire.Data)
    finally:
        attacker.close()


def test_a_constructors_arguments_are_sized_too(daemon):
    process, address = daemon
    attacker = Attacker(address)
    try:
        before = status(process.pid, "VmHWM")
        for create in (wire.Create(2, -1, 9, "arange", (1,), "<f8", -1, (0, 10**8)),
                       wire.Create(2, -1, 9, "arange", (1,), "<f8", -1, (0, 10**8, 1)),
                       wire.Create(2, -1, 9, "arange", (1,), "<f8", -1, (10**8,))):
            reply = attacker.run([create])
            assert isinstance(reply, wire.Failed), reply
            assert "MWRT_MAX_TENSOR_BYTES" in reply.info["message"], reply.info
        assert status(process.pid, "VmHWM") - before < 32 * MiB
        reply = attacker.run([wire.Create(2, -1, 9, "arange", (5,), "<f8", -1, (0, 10, 2))])
        assert isinstance(reply, wire.Done), reply
    finally:
        attacker.close()


def test_every_listed_function_exists_and_every_bound_is_a_count():
    for path in numpy_allowlist.ALLOWED:
        assert callable(numpy_allowlist.resolve(np, path)), path
    a, b = numpy_allowlist.Spec((3, 4), np.dtype("f8")), numpy_allowlist.Spec((4, 5), np.dtype("f8"))
    assert numpy_allowlist.result_bytes("einsum", ("ij,jk->ik", a, b), {}) >= 3 * 5 * 8
    assert numpy_allowlist.result_bytes("tensordot", (a, b), {"axes": 1}) >= 3 * 5 * 8
    assert numpy_allowlist.result_bytes("cov", (a,), {}) >= 3 * 3 * 8
    assert numpy_allowlist.result_bytes("unique", (a,), {}) >= 12 * 8
    assert numpy_allowlist.result_bytes("not.listed", (a,), {}) == 0


def test_a_dist_send_over_the_limit_is_a_quota_error_and_the_session_goes_on(daemon):
    process, address = daemon
    mwrt.init_master_worker([address], timeout=30)
    try:
        for _ in range(2):  # refused before a byte is sent: the channel stays whole
            with pytest.raises(mwrt.QuotaError, match="MWRT_MAX_TENSOR_BYTES"):
                mwrt.dist_send(np.zeros(4 * MiB, dtype=np.uint8))
        x = mwrt.dist_send(np.arange(1000.0))  # and the next op reports nothing earlier
        np.testing.assert_array_equal((x + 1).numpy(), np.arange(1000.0) + 1)
        assert process.poll() is None
    finally:
        mwrt.shutdown()


def test_the_readmes_numpy_functions_run_by_name_on_an_unkeyed_worker(daemon):
    """An unkeyed worker runs no shipped code: what README promises runs from the list."""
    _, address = daemon
    mwrt.init_master_worker([address], timeout=30)
    try:
        a = np.arange(16.0).reshape(4, 4) + np.eye(4) * 10
        t = mwrt.dist_send(a)
        for name, fn in [("linalg.inv", np.linalg.inv), ("linalg.eig", lambda x: np.linalg.eig(x)[0]),
                         ("fft.fft", np.fft.fft), ("einsum", lambda x: np.einsum("ij,jk", x, x)),
                         ("kron", lambda x: np.kron(x, x)), ("unique", np.unique),
                         ("percentile", lambda x: np.percentile(x, 30)), ("cov", np.cov),
                         ("histogram", lambda x: np.histogram(x, bins=5)[0]),
                         ("sort_complex", np.sort_complex), ("diff", np.diff),
                         ("nonzero", lambda x: np.nonzero(x)[1]), ("empty_like", np.zeros_like)]:
            got = fn(t)
            got = got.numpy() if hasattr(got, "numpy") else got
            np.testing.assert_allclose(got, fn(a), err_msg=name)
        assert not np.empty_like(t).numpy().any()
    finally:
        mwrt.shutdown()

"""Fixtures: real worker daemons on loopback, and a leak check after the whole suite."""

from __future__ import annotations

import compileall
import os
import subprocess
import sys

import pytest

import mwrt
from tests.support import machine
from tests.support.daemons import next_test_asks, shared_session, start_worker, stop_worker

# The slow tier: whole modules that cross simulated hosts, run the benchmarks, kill or stall
# processes and wait out timeouts by design, start SPMD jobs, launchers or outside tools
# (mpiexec, a notebook kernel, Chromium, Sphinx), or import torch on clusters of their own
# (test_torch_workers keeps torch in the fast tier). `pytest -m "not slow"` is the fast tier an
# engineer runs after each change; CI runs both. A slow test in another module says
# @pytest.mark.slow itself; a quick test of a slow module that keeps its package in the fast
# tier says @pytest.mark.quick.
SLOW_MODULES = {
    "test_benchmarks", "test_bulk", "test_cli", "test_concurrent_groups", "test_dashboard",
    "test_distributed", "test_docs", "test_examples_mw", "test_faults_kill", "test_faults_load",
    "test_faults_wire", "test_gpu", "test_hangs", "test_hosts", "test_hosts_checkpoint",
    "test_hosts_faults", "test_hosts_mw", "test_hosts_slurm", "test_hosts_spmd",
    "test_interrupts", "test_lane_faults", "test_large_reads", "test_local_workers", "test_mpi",
    "test_mw_faults",
    "test_nccl", "test_notebook", "test_quotas", "test_random_collectives",
    "test_random_faults", "test_replace", "test_restarts", "test_security",
    "test_security_hosts", "test_security_worker", "test_sessions", "test_status",
    "test_store_security", "test_torch_across", "test_torch_backend",
    "test_torch_backend_calls", "test_torch_differential", "test_torch_gpu", "test_torch_mesh",
    "test_torch_mesh2d", "test_torch_ordering", "test_worker_daemon",
}


def pytest_configure(config):
    """Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE), compile mwrt and the tests
    once into their __pycache__ folders (which git ignores), before any test starts a
    process: without, every daemon and child of the suite compiled mwrt from source again
    (tests/master/test_master_worker.py: 21.8 s of CPU, 16.4 s with them)."""
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):  # once, not per worker
        for folder in ("mwrt", "tests"):
            if os.path.isdir(config.rootpath / folder):
                compileall.compile_dir(config.rootpath / folder, quiet=2)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """Where Python writes no bytecode, let pytest keep the test modules it rewrote for their
    asserts (its own files in tests/**/__pycache__) while it collects: without, every pytest
    process rewrote all ~90 test modules from source again, about 4 s of CPU each, twice in
    a parallel run."""
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        yield
    finally:
        sys.dont_write_bytecode = dont_write


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """How many processes `-n auto` (pyproject.toml's addopts) runs the tests in: none when
    the command names test files or tests (they run in this process, as before), else one
    more than the CPUs, 3 to 8: a test spends part of its time waiting on daemons, sockets
    and timeouts, and the extra process fills the core those waits leave idle (on two quiet
    cores the whole suite took 9:56 with three, 11:33 with two; four took no less time than
    two at an earlier count, its waits stretched toward their bounds)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if any(".py" in arg for arg in config.args):
        return 0
    cpus = os.cpu_count() or 1
    return min(8, max(3, cpus + 1))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # around pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Mark every test of a SLOW_MODULES module slow (but those marked quick); put the tests
    of a module where any test uses a module-scoped fixture (a cluster of daemons) in one
    xdist group (with the other modules of its shared session, if it asks for one), so that
    it starts once and a test that finds the module's cluster running without naming it
    finds it in its process too; and give each test its pytest-timeout limit scaled by the
    load: a limit set for a quiet machine, which only load breaks."""
    shared = _groups(items)
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in SLOW_MODULES \
                and item.get_closest_marker("quick") is None:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("xdist_group") is None and item.module is not None \
                and item.module.__name__ in shared:
            item.add_marker(pytest.mark.xdist_group(shared[item.module.__name__]))
        limit = _timeout_of(item, config)
        if limit:
            item.add_marker(pytest.mark.timeout(machine.seconds(limit, 8 * limit)), append=False)
    yield
    _name_the_groups(config, items)


def _name_the_groups(config, items) -> None:
    """End each grouped test's node id in `@group`, which is how --dist loadgroup sends a
    group to one process. pytest-xdist (3.8) writes that suffix where pytest 9, whose node ids
    are structured, no longer reads it (pytest-xdist issue 1386): the groups were lost, and a
    module's tests spread over the processes, each starting the module's daemons."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        nodeid = item.nodeid
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names or nodeid.rfind("@") > nodeid.rfind("]"):  # none, or pytest-xdist's
            continue
        from _pytest.nodeid import NodeId  # pytest 9's node ids, where the suffix was lost
        item._id = NodeId.parse(f"{nodeid}@{'_'.join(names)}")


def _groups(items) -> dict:
    """{module: its xdist group} of the modules where a test uses a module-scoped fixture: the
    group of the shared session a test of it asks for, else the module's own."""
    groups: dict = {}
    for item in items:
        if _shares_a_module_fixture(item):
            module = item.module.__name__
            session = next((group for name, group in SHARED_SESSIONS.items()
                            if name in item.fixturenames), None)
            groups[module] = session or groups.get(module, module)
    return groups


def _shares_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and item.module is not None and any(
        d.scope in ("module", "class") for defs in info.name2fixturedefs.values() for d in defs)


def _timeout_of(item, config) -> float:
    """The test's pytest-timeout limit in seconds as written (its marker, else the ini's)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:
        value = config.getini("timeout")
    try:
        return max(float(value), 0.0)
    except (TypeError, ValueError):
        return 0.0


# Module-scoped fixtures that yield a session of local daemons shared with the modules before
# and after (tests/support/daemons.py's shared_session), and the xdist group of the modules
# that use each: one process runs them, one after another, on the same daemons.
SHARED_SESSIONS = {"cluster": "shared-cluster", "four": "shared-four"}


@pytest.fixture(scope="module")
def cluster():
    """Two local worker daemons for the tests of one module (and the next, if it asks)."""
    yield from shared_session(2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Before a test's teardown (where a module's fixtures end), tell the shared sessions
    whether the next test asks for one: then its daemons outlive the module."""
    next_test_asks(nextitem is not None and any(name in SHARED_SESSIONS
                                                 for name in nextitem.fixturenames))
    yield


@pytest.fixture
def keyed_worker(tmp_path):
    """A worker daemon with a key: (process, address, path of the master's key file)."""
    from mwrt.protocol.auth import keygen

    worker_key, master_key = keygen(str(tmp_path / "keys"))
    mwrt.shutdown()
    process, address = start_worker("--key-file", worker_key)
    yield process, address, master_key
    mwrt.shutdown()
    stop_worker(process)


def _workers_left() -> list[str]:
    """The worker daemons this process started, or its zygote forked, that still run."""
    from mwrt.master import forked

    zygotes = forked.zygote_pids()  # they stay for later daemons; they exit with this process
    found = []
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, ppid, args = line.split(None, 2)
        if "mwrt.worker" in args and int(ppid) in {os.getpid(), *zygotes} \
                and int(pid) not in zygotes:
            found.append(f"worker process {pid}: {args}")
    return found


# Every process this run starts inherits it (pytest-xdist's workers, daemons, ranks): a
# segment whose maker is alive without it belongs to another run going on beside this one.
_RUN = os.environ.setdefault("TESTS_RUN_ID", str(os.getpid()))  # (no MWRT_: not a setting)


def _segments_left() -> list[str]:
    """The mwrt segments in /dev/shm but those that another run's live processes made."""
    if not os.path.isdir("/dev/shm"):
        return []
    return [f"/dev/shm/{name}" for name in os.listdir("/dev/shm")
            if "mwrt" in name and not _another_runs(name)]


def _another_runs(segment: str) -> bool:
    """True if the maker named in `segment` (mwrt-PID-...) lives and is not of this run."""
    parts = segment.split("-")
    try:
        with open(f"/proc/{int(parts[1])}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except (IndexError, ValueError, OSError):  # not named so, or its maker is gone: ours
        return False
    return f"TESTS_RUN_ID={_RUN}".encode() not in environ


def _parallel(config) -> bool:
    """True in the process that hands tests to pytest-xdist's workers, or in one of those."""
    return getattr(config.option, "dist", "no") != "no" or hasattr(config, "workerinput")


_FD_SLACK = 16  # pytest, hypothesis and lazily opened modules keep a few files open


@pytest.fixture(scope="session", autouse=True)
def no_leaks(request):
    """After the suite: no worker process started by it, no mwrt shared-memory segment, and
    not many more open file descriptors than before it. In a parallel run each process checks
    its own daemons and descriptors, and the segments are checked once all have finished
    (pytest_sessionfinish below): until then another process's are in use."""
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    yield
    mwrt.shutdown()
    leftovers = _workers_left()
    if not _parallel(request.config):
        leftovers += _segments_left()
    if "cupy" in sys.modules:  # CUDA keeps device files, eventfds, pipes and a socket open
        fds = None  # for the process's life once used: the count cannot tell them from ours
    if fds is not None and len(os.listdir("/proc/self/fd")) > fds + _FD_SLACK:
        now = sorted(os.listdir("/proc/self/fd"), key=int)
        targets = [os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}")
                   else "?" for fd in now]
        leftovers.append(f"{len(now)} open file descriptors (were {fds}): {targets}")
    if leftovers:
        pytest.fail("leaked after the test suite:\n" + "\n".join(leftovers))


_LEFT_IN_PARALLEL: list[str] = []


def pytest_sessionfinish(session):
    """A parallel run's segment check, in the process that ran the workers, after them all;
    a worker sends its fault tally there."""
    config = session.config
    if hasattr(config, "workerinput"):
        from tests.support import faultkit
        config.workeroutput["faultkit"] = faultkit.TALLY.state()
    elif _parallel(config) and session.testscollected:
        _LEFT_IN_PARALLEL.extend(_segments_left())
        if _LEFT_IN_PARALLEL:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Add a finished worker's fault tally to this process's."""
    from tests.support import faultkit
    state = getattr(node, "workeroutput", {}).get("faultkit")
    if state:
        faultkit.TALLY.merge(state)


def pytest_terminal_summary(terminalreporter):
    """The fault suite's one-line summary (tests/support/faultkit.py), when any of it ran."""
    from tests.support import faultkit
    line = faultkit.TALLY.line()
    if line:
        terminalreporter.write_line(line)
    if _LEFT_IN_PARALLEL:
        terminalreporter.write_line("leaked after the test suite:\n" + "\n".join(
            _LEFT_IN_PARALLEL), red=True)

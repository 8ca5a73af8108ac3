"""Self-test of the simulated-hosts harness (tests/support/hosts.py): isolation, links, teardown."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys

import pytest

from tests.support import hosts as sim
from tests.support.hosts import hosts2, hosts3  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(60)

# Serves forever on (argv[1], a free port): prints the port, then tells each client its hostname.
SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.sendall(socket.gethostname().encode())
    c.close()
"""


def readline(process: subprocess.Popen, timeout: float = 10.0) -> str:
    """The next line `process` prints, failing the test if none comes within `timeout`."""
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, f"no output from {process.args} within {timeout} s"
    return process.stdout.readline().strip()


def serve(host: sim.Host, bind: str) -> int:
    """Start SERVER on `host` bound to `bind`; the port it listens on."""
    process = host.popen([sys.executable, "-c", SERVER, bind], stdout=subprocess.PIPE,
                         text=True)
    return int(readline(process))


def connect(host: sim.Host, addr: str, port: int, timeout: float = 2.0) -> str:
    """From `host`, connect to addr:port: 'ok <server's hostname>' or 'fail <error>'."""
    code = f"""
import socket
try:
    with socket.create_connection(({addr!r}, {port}), timeout={timeout}) as c:
        print("ok", c.recv(100).decode())
except OSError as e:
    print("fail", type(e).__name__, e)
"""
    return host.python(code).stdout.strip()


def ours() -> list[str]:
    """Our namespaces in `ip netns list` (this process's only)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         timeout=10).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.startswith(f"{sim.PREFIX}{os.getpid()}-")]


def running(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    return sim._alive(pid)


def root_links() -> set[str]:
    """Names of the network interfaces of the root namespace."""
    return {name for _, name in socket.if_nameindex()}


def test_hostnames_differ_and_resolve(hosts3):
    names = [h.python("import socket; print(socket.gethostname())").stdout.strip()
             for h in hosts3]
    assert names == ["hosta", "hostb", "hostc"] == [h.name for h in hosts3]
    assert socket.gethostname() not in names
    # each host's /etc/hosts names every host at its link address
    seen = hosts3[0].python("import socket; print(*(socket.gethostbyname(n) for n in "
                            "('hosta', 'hostb', 'hostc')))").stdout.split()
    assert seen == [h.addr for h in hosts3]


def test_environment_cwd_and_interfaces(hosts2, tmp_path):
    a = hosts2[0]
    assert a.run(["pwd"], check=True).stdout.strip() == os.getcwd()
    here = a.popen(["pwd"], cwd=str(tmp_path), stdout=subprocess.PIPE, text=True)
    assert readline(here) == str(tmp_path)
    # the repository is importable from anywhere (PYTHONPATH), env is passed on
    code = ("import importlib.util, os; print(importlib.util.find_spec('mwrt').origin); "
            "print(os.environ['SIMTEST'])")
    out = a.run([sys.executable, "-c", code], env={"SIMTEST": "x"}, check=True).stdout.split()
    assert out == [os.path.join(sim.ROOT, "mwrt", "__init__.py"), "x"]
    assert a.python("import socket; print(sorted(n for _, n in socket.if_nameindex()))"
                    ).stdout.strip() == "['eth0', 'lo']"
    with pytest.raises(sim.HostCommandError, match="on hosta.*boom"):
        a.python("raise SystemExit('boom')")


@pytest.mark.quick
def test_tcp_between_hosts_and_private_loopback(hosts2):
    a, b = hosts2
    port = serve(b, "0.0.0.0")
    assert connect(a, b.addr, port) == "ok hostb"
    assert connect(b, b.addr, port) == "ok hostb"
    # b's loopback is b's alone: a's 127.0.0.1 has nothing on that port
    port = serve(b, "127.0.0.1")
    assert connect(b, "127.0.0.1", port) == "ok hostb"
    assert connect(a, "127.0.0.1", port).startswith("fail ConnectionRefusedError")
    assert connect(a, b.addr, port).startswith("fail ConnectionRefusedError")


def test_dev_shm_private_per_host_shared_within(hosts2):
    a, b = hosts2
    path = "/dev/shm/simhost-probe"
    writer = a.popen([sys.executable, "-c", f"open({path!r}, 'w').write('a'); print('done', "
                      "flush=True); import time; time.sleep(60)"], stdout=subprocess.PIPE,
                     text=True)
    assert readline(writer) == "done"
    exists = f"import os; print(os.path.exists({path!r}))"
    assert a.python(exists).stdout.strip() == "True"  # another process on the same host
    assert b.python(exists).stdout.strip() == "False"
    assert not os.path.exists(path)
    dev = "import os; print(os.stat('/dev/shm').st_dev)"
    assert a.python(dev).stdout != b.python(dev).stdout


def test_link_down_and_up(hosts2):
    a, b = hosts2
    port = serve(b, "0.0.0.0")
    assert connect(a, b.addr, port) == "ok hostb"
    b.link_down()
    assert connect(a, b.addr, port, timeout=0.5).startswith("fail")
    assert connect(b, "127.0.0.1", port) == "ok hostb"  # its loopback still works
    b.link_up()
    assert connect(a, b.addr, port) == "ok hostb"
    a.link_down()
    assert connect(a, b.addr, port, timeout=0.5).startswith("fail")
    a.link_up()
    assert connect(a, b.addr, port) == "ok hostb"


def test_close_kills_everything_and_deletes_namespaces():
    if sim.unavailable():
        pytest.skip(sim.unavailable())
    links = root_links()
    hosts = sim.Hosts(2)
    a, b = hosts
    assert len(ours()) == 3  # two hosts and the switch
    holders = [a.holder_pid, b.holder_pid]
    sleeper = a.popen(["sleep", "60"])
    stubborn = b.popen([sys.executable, "-c", "import signal, time; signal.signal("
                        "signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                        "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert readline(stubborn) == "ready"
    # a daemon a command left behind, which nobody tracks
    stray = int(a.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"]).stdout)
    assert running(stray)
    assert root_links() == links  # nothing was made in the root namespace
    hosts.close()
    assert sleeper.returncode == -15 and stubborn.returncode == -9  # SIGTERM, then SIGKILL
    assert not any(running(pid) for pid in [*holders, stray])
    assert ours() == []
    assert root_links() == links
    hosts.close()  # idempotent
    with pytest.raises(RuntimeError):
        a.argv(["true"])


def test_failed_setup_names_the_step_and_leaves_nothing(monkeypatch):
    if sim.unavailable():
        pytest.skip(sim.unavailable())
    monkeypatch.setattr(sim, "SHM_SIZE", "bogus")  # the holder's tmpfs mount fails
    with pytest.raises(RuntimeError, match="start hosta's holder failed"):
        sim.Hosts(2)
    assert ours() == []
    with pytest.raises(ValueError):
        sim.Hosts(2, names=["hosta", "Host_B"])

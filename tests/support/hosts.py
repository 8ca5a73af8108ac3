"""Simulated hosts on this Linux machine, so tests can run real processes "on different machines".

Each host is a network namespace (its own loopback and one veth, `eth0`) plus its own UTS
(hostname), IPC and mount namespaces, held open by one `sleep infinity` holder process. The
mount namespace has a private tmpfs on /dev/shm (shared memory cannot silently bridge hosts),
a private /etc/hosts naming every host of the set (so a host's name resolves to its link
address, as on a cluster) and a sysfs of its own netns (/sys/class/net lists lo and eth0).
Everything else in the filesystem (/tmp, the repository, sys.executable) is shared, like NFS.

The hosts are joined by a bridge `br0` in a separate "switch" network namespace; nothing is
ever created in the root namespace (veths are made directly inside the namespaces), so all
traffic stays inside namespaces the test made.

Naming, unique per process and per instance: namespaces `mwrtsim-<pid>-<k>-<i>` and the
switch `mwrtsim-<pid>-<k>-sw` (k counts Hosts instances in this process); the subnet is
10.<a>.<b>.0/24 with a in 100..199 and b in 0..255 picked at random, host i (0-based) gets
.(i+2) (.1 is left free, as a gateway would have it). Namespaces left by a process that died
without tearing down (SIGKILL, os._exit) are swept when the next Hosts is made.

Requires root (or CAP_SYS_ADMIN + CAP_NET_ADMIN), `ip`, `unshare` and `nsenter`; see
unavailable(). Use:

    from tests.support.hosts import hosts2  # noqa: F401  (a fixture: skips where hosts cannot be made)

    def test_names(hosts2):
        a, b = hosts2
        out = a.python("import socket; print(socket.gethostbyname('hostb'))").stdout
        assert out.strip() == b.addr
        b.popen([...])  # a server on b, killed at teardown; tests/hosts/test_hosts.py has examples
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "mwrtsim-"
IFNAME = "eth0"
SHM_SIZE = "256m"
STEP_TIMEOUT = 10.0  # seconds for any one `ip`/`nsenter` call or a holder's start
KILL_GRACE = 3.0  # seconds between SIGTERM and SIGKILL at teardown

_COUNTER = itertools.count()
_LIVE: set[Hosts] = set()
_LIVE_LOCK = threading.Lock()
_UNAVAILABLE: list[str | None] = []  # cached answer of unavailable(), once computed


def _cmd(argv: list[str], timeout: float = STEP_TIMEOUT) -> subprocess.CompletedProcess:
    """Run a setup/teardown command, captured, never hanging."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _step(what: str, argv: list[str]) -> None:
    """Run one setup step; RuntimeError naming the step and its stderr if it fails."""
    try:
        done = _cmd(argv)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"simulated hosts: {what} failed: {' '.join(argv)}: {exc}") from None
    if done.returncode != 0:
        raise RuntimeError(f"simulated hosts: {what} failed: {' '.join(argv)}: "
                           f"{(done.stderr or done.stdout).strip()}")


def _probe() -> str | None:
    """Try everything setup needs once, in a throwaway netns; the reason it failed, or None."""
    if not sys.platform.startswith("linux"):
        return f"simulated hosts need Linux (this is {sys.platform})"
    missing = [tool for tool in ("ip", "unshare", "nsenter", "sleep") if not shutil.which(tool)]
    if missing:
        return f"simulated hosts need {', '.join(missing)} on PATH"
    ns = f"{PREFIX}{os.getpid()}-probe"
    shm = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && hostname {ns}"
    steps = [("make a netns", ["ip", "netns", "add", ns]),
             ("make a bridge", ["ip", "-n", ns, "link", "add", "br0", "type", "bridge"]),
             ("make a veth", ["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer",
                              "name", "p1"]),
             ("make uts/ipc/mount namespaces", ["nsenter", f"--net=/run/netns/{ns}", "unshare",
                                                "--uts", "--ipc", "--mount", "--propagation",
                                                "private", "sh", "-c", shm])]
    try:
        for what, argv in steps:
            _step(what, argv)
    except RuntimeError as exc:
        return f"{exc} (run as root?)"
    finally:
        with contextlib.suppress(Exception):
            _cmd(["ip", "netns", "del", ns])
    return None


def unavailable() -> str | None:
    """None if simulated hosts can be made here, else the reason (for pytest.skip)."""
    if not _UNAVAILABLE:
        _UNAVAILABLE.append(_probe())
    return _UNAVAILABLE[0]


def _ns_inode(ns: str) -> int | None:
    """The inode of named netns `ns` (what /proc/PID/ns/net of its members links to)."""
    try:
        return os.stat(f"/run/netns/{ns}").st_ino
    except OSError:
        return None


def _members(inodes: set[int]) -> list[int]:
    """Pids of the processes (other than us) inside any of the network namespaces `inodes`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            link = os.readlink(f"/proc/{entry}/ns/net")
        except OSError:
            continue  # gone, or a zombie: nothing to kill
        match = re.fullmatch(r"net:\[(\d+)\]", link)
        if match and int(match.group(1)) in inodes:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_members(inodes: set[int]) -> None:
    """SIGKILL every process left in these netns (strays the test's commands forked)."""
    inodes.discard(None)
    pids = _members(inodes) if inodes else []
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_GRACE
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    for pid in pids:  # reap those that were our own children
        with contextlib.suppress(OSError):
            os.waitpid(pid, os.WNOHANG)


def _our_namespaces() -> list[str]:
    """Names of every netns made by this harness (any process), from `ip netns list`."""
    try:
        out = _cmd(["ip", "netns", "list"]).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def _pid_alive(pid: int) -> bool:
    """True if a process `pid` exists (a reused pid counts as alive: then we leave it be)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _sweep_stale() -> None:
    """Delete namespaces (and their processes) left by harness processes that are gone."""
    stale = [ns for ns in _our_namespaces()
             if (m := re.match(rf"{PREFIX}(\d+)-", ns)) and not _pid_alive(int(m.group(1)))]
    if stale:
        _kill_members({_ns_inode(ns) for ns in stale})
        for ns in stale:
            with contextlib.suppress(Exception):
                _cmd(["ip", "netns", "del", ns])


def _host_env(env: dict | None) -> dict:
    """os.environ + env, with the repository root first on PYTHONPATH so `import mwrt` works."""
    merged = dict(os.environ, **(env or {}))
    merged["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, merged.get("PYTHONPATH")]))
    return merged


class HostCommandError(subprocess.CalledProcessError):
    """A command on a simulated host failed; its message names the host and shows stderr."""

    def __init__(self, host: str, done: subprocess.CompletedProcess):
        super().__init__(done.returncode, done.args, done.stdout, done.stderr)
        self.host = host

    def __str__(self) -> str:
        cmd = self.cmd[self.cmd.index("--") + 1:] if "--" in self.cmd else self.cmd
        tail = (self.stderr or "").strip()[-2000:]
        return f"on {self.host}: {cmd} exited with {self.returncode}:\n{tail}"


class Host:
    """One simulated host: its own netns (lo + eth0), hostname, IPC and /dev/shm."""

    def __init__(self, name: str, addr: str, netns: str, switch: Hosts):
        self.name = name
        self.addr = addr
        self.ifname = IFNAME
        self.netns = netns  # name in `ip netns list`
        self.holder: subprocess.Popen | None = None  # the process holding uts/ipc/mount
        self._hosts = switch

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.addr!r})"

    @property
    def holder_pid(self) -> int:
        """Pid of the process whose uts/ipc/mount namespaces are this host's."""
        if self.holder is None:
            raise RuntimeError(f"{self.name} is not running (closed or not set up)")
        return self.holder.pid

    def argv(self, cmd: Sequence[str]) -> list[str]:
        """`cmd` prefixed to run on this host (nsenter its net, uts, ipc and mount namespaces)."""
        # --wd=. keeps the caller's cwd: entering a mount namespace would otherwise chdir to /.
        return ["nsenter", "-t", str(self.holder_pid), "-n", "-u", "-i", "-m", "--wd=.", "--",
                *cmd]

    def run(self, cmd: Sequence[str], *, env: dict | None = None, timeout: float = 60.0,
            check: bool = False, input: str | None = None) -> subprocess.CompletedProcess:
        """Run `cmd` on this host to completion, text output captured."""
        done = subprocess.run(self.argv(cmd), env=_host_env(env), timeout=timeout, input=input,
                              capture_output=True, text=True,
                              stdin=None if input is not None else subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise HostCommandError(self.name, done)
        return done

    def popen(self, cmd: Sequence[str], *, env: dict | None = None,
              **popen_kwargs) -> subprocess.Popen:
        """Start `cmd` on this host; it is killed at teardown if still running."""
        process = subprocess.Popen(self.argv(cmd), env=_host_env(env), **popen_kwargs)
        self._hosts._track(process)
        return process

    def python(self, code: str, *, env: dict | None = None, timeout: float = 60.0,
               check: bool = True) -> subprocess.CompletedProcess:
        """Run `sys.executable -c code` on this host (raises HostCommandError if it fails)."""
        return self.run([sys.executable, "-c", code], env=env, timeout=timeout, check=check)

    def link_down(self) -> None:
        """Cut this host off the switch (its eth0 goes down; lo keeps working)."""
        _step(f"link down on {self.name}", ["ip", "-n", self.netns, "link", "set", IFNAME,
                                            "down"])

    def link_up(self) -> None:
        """Restore this host's link, waiting until eth0 is operationally up again."""
        _step(f"link up on {self.name}", ["ip", "-n", self.netns, "link", "set", IFNAME, "up"])
        deadline = time.monotonic() + STEP_TIMEOUT
        while time.monotonic() < deadline:
            out = _cmd(["ip", "-n", self.netns, "-o", "link", "show", "dev", IFNAME]).stdout
            if "state UP" in out:
                return
            time.sleep(0.01)
        raise RuntimeError(f"simulated hosts: {self.name}'s {IFNAME} did not come back up")


class Hosts(Sequence):
    """N simulated hosts on one switch; a sequence of Host and a context manager."""

    def __init__(self, n: int, names: Sequence[str] | None = None):
        names = list(names) if names is not None else [f"host{chr(97 + i)}" for i in range(n)]
        _check_names(n, names)
        k = next(_COUNTER)
        base = f"{PREFIX}{os.getpid()}-{k}"
        self.switch = f"{base}-sw"  # netns of the bridge
        self.subnet = f"10.{random.randint(100, 199)}.{random.randint(0, 255)}"  # .0/24
        self._hosts = [Host(name, f"{self.subnet}.{i + 2}", f"{base}-{i}", self)
                       for i, name in enumerate(names)]
        self._made: list[str] = []  # netns created so far, for teardown
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._closed = False
        self._dir = tempfile.mkdtemp(prefix=f"{base}-")
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            _sweep_stale()
            self._setup()
        except BaseException:
            self.close()
            raise

    def __getitem__(self, index):
        return self._hosts[index]

    def __len__(self) -> int:
        return len(self._hosts)

    def __repr__(self) -> str:
        return f"Hosts({self._hosts!r}, subnet={self.subnet}.0/24)"

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _setup(self) -> None:
        """Make the switch, each host's netns and link, then its namespace holder."""
        self._netns_add(self.switch)
        _step("make the bridge", ["ip", "-n", self.switch, "link", "add", "br0", "type",
                                  "bridge"])
        _step("bring the bridge up", ["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for i, host in enumerate(self._hosts):
            self._wire(i, host)
        hosts_file = os.path.join(self._dir, "hosts")
        with open(hosts_file, "w") as f:
            f.write("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
            f.writelines(f"{host.addr}\t{host.name}\n" for host in self._hosts)
        for host in self._hosts:  # start all holders first, then wait: they start in parallel
            host.holder = self._start_holder(host, hosts_file)
        for host in self._hosts:
            self._await_holder(host)

    def _netns_add(self, ns: str) -> None:
        """Make a named netns, remembered for teardown."""
        _step(f"make netns {ns}", ["ip", "netns", "add", ns])
        self._made.append(ns)

    def _wire(self, i: int, host: Host) -> None:
        """Make host's netns and a veth from it to the bridge (made inside the namespaces)."""
        ns, port = host.netns, f"port{i}"
        self._netns_add(ns)
        _step(f"make {host.name}'s veth", ["ip", "-n", self.switch, "link", "add", port, "type",
                                           "veth", "peer", "name", IFNAME, "netns", ns])
        _step(f"plug {host.name} into the bridge", ["ip", "-n", self.switch, "link", "set", port,
                                                    "master", "br0", "up"])
        _step(f"address {host.name}", ["ip", "-n", ns, "addr", "add", f"{host.addr}/24", "dev",
                                       IFNAME])
        _step(f"bring {host.name}'s {IFNAME} up", ["ip", "-n", ns, "link", "set", IFNAME, "up"])
        _step(f"bring {host.name}'s lo up", ["ip", "-n", ns, "link", "set", "lo", "up"])

    def _start_holder(self, host: Host, hosts_file: str) -> subprocess.Popen:
        """Start the process that holds host's uts/ipc/mount namespaces (it prints ready)."""
        script = (f"set -e; mount -t tmpfs -o size={SHM_SIZE},mode=1777 tmpfs /dev/shm; "
                  f"mount --bind {hosts_file} /etc/hosts; "
                  # a sysfs mounted inside the netns shows its interfaces (as ip netns exec does);
                  # mounted over the old one, so where it cannot be made the old one stays
                  "mount -t sysfs sysfs /sys 2>/dev/null || true; "
                  f"hostname {host.name}; echo ready; exec sleep infinity")
        # nsenter and unshare (no --fork) exec in turn, so the Popen's pid is the sleep's.
        argv = ["nsenter", f"--net=/run/netns/{host.netns}", "unshare", "--uts", "--ipc",
                "--mount", "--propagation", "private", "sh", "-c", script]
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, cwd="/")
        except OSError as exc:
            raise RuntimeError(f"simulated hosts: start {host.name}'s holder failed: "
                               f"{exc}") from None

    def _await_holder(self, host: Host) -> None:
        """Wait for host's holder to say ready, then check it really is in its namespaces."""
        holder, what = host.holder, f"start {host.name}'s holder"
        ready, _, _ = select.select([holder.stdout], [], [], STEP_TIMEOUT)
        line = holder.stdout.readline() if ready else ""
        if line.strip() != "ready":
            holder.kill()
            holder.wait(STEP_TIMEOUT)
            rest = holder.stdout.read()
            raise RuntimeError(f"simulated hosts: {what} failed: {(line + rest).strip()!r}")
        holder.stdout.close()  # nothing more comes; an open pipe would count as a leaked fd
        if os.readlink(f"/proc/{holder.pid}/ns/uts") == os.readlink("/proc/self/ns/uts"):
            raise RuntimeError(f"simulated hosts: {what} failed: it shares our uts namespace")
        if os.stat(f"/proc/{holder.pid}/ns/net").st_ino != _ns_inode(host.netns):
            raise RuntimeError(f"simulated hosts: {what} failed: it is not in {host.netns}")

    def _track(self, process: subprocess.Popen) -> None:
        """Remember a process started on a host, to kill it at teardown."""
        with self._lock:
            if self._closed:
                process.kill()
                process.wait()
                raise RuntimeError("simulated hosts: popen after close()")
            self._procs.append(process)

    def close(self) -> None:
        """Kill every process on the hosts and delete every namespace; idempotent, never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for what, step in (("stop processes", self._stop_tracked),
                           ("stop holders", self._stop_holders),
                           ("kill strays", self._kill_strays),
                           ("delete namespaces", self._delete_namespaces)):
            try:
                step()
            except Exception as exc:  # teardown goes on; a failure must not mask the test's
                warnings.warn(f"simulated hosts: teardown could not {what}: {exc!r}")
        shutil.rmtree(self._dir, ignore_errors=True)
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def _stop_tracked(self) -> None:
        """SIGTERM the tracked processes still running, SIGKILL them after KILL_GRACE."""
        running = [p for p in self._procs if p.poll() is None]
        for process in running:
            with contextlib.suppress(OSError):
                process.terminate()
        deadline = time.monotonic() + KILL_GRACE
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(STEP_TIMEOUT)
        for process in self._procs:
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()

    def _stop_holders(self) -> None:
        """Kill and reap each host's holder (its uts/ipc/mount namespaces go with it)."""
        for host in self._hosts:
            if host.holder is None:
                continue
            with contextlib.suppress(OSError):
                host.holder.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                host.holder.wait(STEP_TIMEOUT)
            if host.holder.stdout and not host.holder.stdout.closed:
                host.holder.stdout.close()
            host.holder = None

    def _kill_strays(self) -> None:
        """Kill whatever else still runs in our namespaces (daemons a command forked)."""
        _kill_members({_ns_inode(ns) for ns in self._made})

    def _delete_namespaces(self) -> None:
        """Delete the hosts' netns (their veths die with them) and then the switch."""
        failed = []
        for ns in reversed(self._made):
            try:
                done = _cmd(["ip", "netns", "del", ns])
                if done.returncode != 0 and ns in _our_namespaces():
                    failed.append(f"{ns}: {done.stderr.strip()}")
            except (OSError, subprocess.TimeoutExpired) as exc:
                failed.append(f"{ns}: {exc}")
        self._made.clear()
        if failed:
            raise RuntimeError("; ".join(failed))


def _check_names(n: int, names: list[str]) -> None:
    """Names must be n distinct valid hostnames."""
    if not 1 <= n <= 200:
        raise ValueError(f"simulated hosts: n must be 1..200 (got {n})")
    if len(names) != n or len(set(names)) != n:
        raise ValueError(f"simulated hosts: need {n} distinct names (got {names!r})")
    for name in names:
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", name):
            raise ValueError(f"simulated hosts: {name!r} is not a valid host name")


@contextlib.contextmanager
def make_hosts(n: int, names: Sequence[str] | None = None):
    """Hosts(n, names) for the duration of a with block, always closed."""
    hosts = Hosts(n, names)
    try:
        yield hosts
    finally:
        hosts.close()


def _close_all() -> None:
    """At interpreter exit: tear down any Hosts a test forgot to close."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for hosts in live:
        hosts.close()


atexit.register(_close_all)


def _fixture(n: int):
    """Hosts of n hosts for one test, skipped where they cannot be made, always torn down."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with make_hosts(n) as hosts:
        yield hosts


@pytest.fixture
def hosts2():
    """Two simulated hosts, hosta and hostb."""
    yield from _fixture(2)


@pytest.fixture
def hosts3():
    """Three simulated hosts, hosta, hostb and hostc."""
    yield from _fixture(3)

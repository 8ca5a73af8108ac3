"""How mwrt's costs grow with the number of nodes, each beside a baseline measured in the same run.

0. A session's start and stop, each in a fresh process: `import mwrt` with its API,
   `init_master_worker()` (2 local daemons) and its CPU, the daemons' CPU from start to exit,
   and `shutdown()` (baseline: a bare `python -c "import numpy, zmq"`'s start, CPU, and
   stop by SIGTERM, in the same rounds).
1. Master-worker, N local daemons (N = 1, 2, 4, 8, 16, 32), `init_master_worker(
   local_workers=N)`: time to init, split into starting the daemons (baseline: N plain
   `python -c "import numpy, zmq"` started one after another, as init starts daemons), the
   sessions and the data-channel join; the fan-out round, one tiny op on every node then
   `mwrt.synchronize()`, and the same with every node's batch sent before the first wait
   (baseline: one 16-byte pyzmq DEALER/ROUTER echo to each of N echo processes, all sent
   then all received), and `float(t.sum())` node after node; ops issued/s across the N
   nodes (`x += 1.0` round robin) and the master's CPU per op; what the master gained in
   fds, TCP sockets and threads; each daemon's RSS, threads and fds; heartbeats per second,
   computed (N / MWRT_HEARTBEAT_INTERVAL pings, as many pongs) and counted on the master's
   heartbeat thread over idle seconds.
2. SPMD over simulated hosts (tests/support/hosts.py, root only), k = 2, 4, 8, 16, one rank each:
   `init_process_group("tcp", init_method="tcp://<host0>:PORT")` with a job secret, timed
   from a common start (every rank imported mwrt and waits on a go file); a 4 KiB all_reduce
   (baseline: one 4 KiB hop to the next rank over a plain socket, the cost of one of the
   log2(k) steps of recursive doubling) and a 16 MiB all_reduce's bus bandwidth (baseline:
   a plain-socket ring moving the same 2(k-1)/k bytes, nothing reduced); each rank's TCP
   sockets after init and after each size (from /proc/self/fd and /proc/self/net/tcp); the
   store requests of init, counted by wrapping TCPStore's client call and rank 0's server
   handler in the rank's process (the store keeps no count itself); threads per rank.

Everything runs on this machine's cores: absolute times are the CPU's, not a network's.

    python benchmarks/bench_scale.py [--quick]   # --quick: N <= 2, k = 2, few reps
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import mwrt  # noqa: E402
from mwrt import config  # noqa: E402
from mwrt.channels.tcp import tune  # noqa: E402  (raw sockets get the channel's settings)
from bench_hosts import connect_retrying, recv_exactly, send_in_pieces, timed  # noqa: E402
from bench_hosts import result as hosts_result  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
STORE_PORT, RAW_PORT = 29500, 29700  # each namespace is fresh; each k gets its own offset
RUN_TIMEOUT = 240.0
TCP_STATES = {"01": "established", "0A": "listen"}


# -- /proc: sockets, threads, memory ------------------------------------------------------


def tcp_sockets(pid: str = "self", store_port: int | None = None, exclude=()) -> dict:
    """This process's TCP sockets by kind: listen, established, and `store` (either end on
    store_port), leaving out the socket inodes in `exclude` (a benchmark's own); read from
    /proc/PID/fd and the process's own netns' /proc/PID/net/tcp."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:[") and link[8:-1] not in exclude:
            inodes.add(link[8:-1])
    counts = {"listen": 0, "established": 0, "store": 0}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[9] not in inodes or cols[3] not in TCP_STATES:
                    continue
                counts[TCP_STATES[cols[3]]] += 1
                ports = {int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16)}
                if cols[3] == "01" and store_port in ports:
                    counts["store"] += 1
    return counts


def status_field(pid, name: str) -> int:
    """An integer field of /proc/PID/status (VmRSS in kB, Threads)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(f"/proc/{pid}/status: no field {name}")


def fd_count(pid="self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# -- table 0: a session's start and stop, each in a fresh process --------------------------

_SESSION = """
import json, os, resource, time
t, c = time.perf_counter(), time.process_time()
import mwrt
mwrt.init_master_worker  # the package and its API, loaded on first use
imported, t, c = time.perf_counter() - t, time.perf_counter(), time.process_time()
mwrt.init_master_worker()
init, init_cpu, t = time.perf_counter() - t, time.process_time() - c, time.perf_counter()
mwrt.shutdown()
down, kids = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps([imported, init, init_cpu, down, kids.ru_utime + kids.ru_stime]))
"""
_BARE = "import numpy, zmq, sys; print(1, flush=True); sys.stdin.read()"


def bare_python() -> tuple[float, float, float]:
    """One plain Python importing numpy and zmq: its start (s), CPU (s) and stop by SIGTERM (s)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _BARE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    proc.stdout.readline()
    started, stop = time.perf_counter() - start, time.perf_counter()
    proc.terminate()
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped above
    return started, usage.ru_utime + usage.ru_stime, time.perf_counter() - stop


def start_stop_table(reps: int) -> None:
    """`import mwrt`, init_master_worker() (2 local daemons) and shutdown() in fresh
    processes, each beside a bare Python's start, CPU and stop in the same rounds."""
    runs, bare = [], []
    for _ in range(reps):
        bare.append(bare_python())
        out = subprocess.run([sys.executable, "-c", _SESSION], capture_output=True, text=True,
                             check=True, timeout=120).stdout
        runs.append(json.loads(out.splitlines()[-1]))
    imp, init, init_cpu, down, daemons = (statistics.median(r[i] for r in runs) for i in range(5))
    start, cpu, stop = (statistics.median(b[i] for b in bare) for i in range(3))
    cached = "not written (PYTHONDONTWRITEBYTECODE)" if sys.dont_write_bytecode else "cached"
    print(f"\n## a session's start and stop, fresh processes (medians of {reps}; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; bytecode {cached})\n")
    print("| what | mwrt | baseline, same rounds | ratio |\n|---|---|---|---|")
    for what, mine, base, name in [
            ("`import mwrt` and its API s", imp, start, "a bare Python's start (numpy, zmq)"),
            ("init_master_worker() s, 2 local daemons", init, start, "the same"),
            ("CPU s per daemon, start to exit", daemons / 2, cpu, "a bare Python's CPU"),
            ("the master's CPU s in init", init_cpu, cpu, "the same"),
            ("shutdown() s", down, stop, "a bare Python stopped by SIGTERM")]:
        print(f"| {what} | {mine:.3f} | {base:.3f} ({name}) | {mine / base:.2f}x |")


# -- table 1: master-worker with N local daemons -------------------------------------------

_ECHO = """
import sys, zmq
ctx = zmq.Context(); router = ctx.socket(zmq.ROUTER)
print(router.bind_to_random_port("tcp://127.0.0.1"), flush=True)
while True:
    frames = router.recv_multipart()
    if frames[-1] == b"stop":
        break
    router.send_multipart(frames)
"""


class EchoFarm:
    """N pyzmq ROUTER echo processes and one DEALER to each: the fan-out floor."""

    def __init__(self, n: int):
        self.procs = [subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, text=True) for _ in range(n)]
        self.ctx = zmq.Context()
        self.dealers = []
        for proc in self.procs:
            dealer = self.ctx.socket(zmq.DEALER)
            dealer.connect(f"tcp://127.0.0.1:{int(proc.stdout.readline())}")
            self.dealers.append(dealer)
        self.round(n)  # every connection is up before anyone counts the master's sockets

    def round(self, n: int) -> None:
        """One 16-byte message to each of the first n echoes, then every answer."""
        for dealer in self.dealers[:n]:
            dealer.send(b"x" * 16)
        for dealer in self.dealers[:n]:
            if not dealer.poll(10_000):
                raise SystemExit("bench_scale: an echo process did not answer within 10 s")
            dealer.recv()

    def close(self) -> None:
        for dealer in self.dealers:
            dealer.send(b"stop")
            dealer.close(linger=1000)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        self.ctx.term()


def bare_starts(n: int) -> float:
    """Seconds to start n plain Pythons importing numpy and zmq, one after another."""
    start = time.perf_counter()
    for _ in range(n):
        subprocess.run([sys.executable, "-c", "import numpy, zmq"], check=True, timeout=60)
    return time.perf_counter() - start


def timed_init(n: int) -> dict:
    """init_master_worker(local_workers=n), its phases timed by wrapping two of its steps."""
    from mwrt.master import cluster as cluster_mod

    phases = {}
    start_workers, join = cluster_mod.start_local_workers, cluster_mod.Cluster._join_data_channel

    def start_timed(*args):
        t = time.perf_counter()
        try:
            return start_workers(*args)
        finally:
            phases["daemons"] = time.perf_counter() - t

    def join_timed(self, *args):
        t = time.perf_counter()
        try:
            return join(self, *args)
        finally:
            phases["join"] = time.perf_counter() - t

    Cluster = cluster_mod.Cluster
    cluster_mod.start_local_workers, Cluster._join_data_channel = start_timed, join_timed
    try:
        phases["init"] = timed(lambda: mwrt.init_master_worker(local_workers=n))
    finally:
        cluster_mod.start_local_workers, Cluster._join_data_channel = start_workers, join
    phases["sessions"] = phases["init"] - phases["daemons"] - phases["join"]
    return phases


def heartbeat_rate(window: float) -> tuple[float, float]:
    """Pings sent and pongs received per second by the master's heartbeat thread, idle."""
    from mwrt.master.cluster import current
    from mwrt.protocol import wire

    beat = current().heartbeat
    counts = {"ping": 0, "pong": 0}
    send, on_message = beat._send, beat._on_message

    def counting_send(index, message):
        counts["ping"] += isinstance(message, wire.Ping)
        send(index, message)

    def counting_on_message(index, message):
        counts["pong"] += isinstance(message, wire.Pong)
        on_message(index, message)

    beat._send, beat._on_message = counting_send, counting_on_message  # this instance only
    time.sleep(window)
    del beat._send, beat._on_message
    return counts["ping"] / window, counts["pong"] / window


def synchronize_flushed() -> None:
    """mwrt.synchronize() with every node's batch sent before the first wait: what the fan-out
    would cost if synchronize() did that (today a node's Sync waits in its batch until the
    master waits on that node, or the heartbeat thread sends it after 2 ms)."""
    from mwrt.master.cluster import current
    from mwrt.protocol import wire

    pending = []
    for node in current().nodes:
        for stream in node.known_streams():
            sync = wire.Sync(id=next(node.ids), stream=stream, token=next(node.tokens))
            node.issue(sync)
            pending.append((node, sync.token))
    for node in current().nodes:
        node.flush()
    for node, token in pending:
        node.wait(token, "synchronize_flushed()")


def fan_out(ones: list, reps: int) -> dict:
    """Median seconds of a round: `t += 1` on every node then a sync of all of them, by
    synchronize(), by synchronize_flushed(), and by float(t.sum()) node after node."""
    def round_with(sync):
        for t in ones:
            t += 1.0
        sync()

    def one_by_one():
        for t in ones:
            float(t.sum())

    rounds = {"sync": lambda: round_with(mwrt.synchronize),
              "flushed": lambda: round_with(synchronize_flushed), "serial": one_by_one}
    times = {name: [] for name in rounds}
    for rep in range(reps + 1):
        for name, fn in rounds.items():  # in turns: the same load for each
            seconds = timed(fn)
            if rep:  # the first is a warm-up
                times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}


def issue_rate(xs: list, ops: int) -> tuple[float, float]:
    """Ops issued per second, `x += 1.0` round robin over every node's x, and the master's
    CPU seconds per op (all its threads): the rate falls where daemons take the CPU."""
    mwrt.synchronize()
    n = len(xs)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(ops):
        xs[i % n] += 1.0
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    mwrt.synchronize()
    got = sum(float(x[0]) for x in xs)
    if got != ops:
        raise SystemExit(f"bench_scale: round robin lost ops (got {got}, expected {ops})")
    return ops / seconds, cpu / ops


def mw_row(n: int, echoes: EchoFarm, reps: int, ops: int, window: float) -> dict:
    """Every figure of table 1 for n local daemons."""
    from mwrt.master.cluster import current

    before = (fd_count(), tcp_sockets()["established"], status_field("self", "Threads"))
    row = timed_init(n)
    try:
        workers = [w.process.pid for w in current().local]
        row.update(fan_out([mwrt.zeros(4, node=i) for i in range(n)], reps))
        echoes.round(n)
        row["echo"] = statistics.median(timed(lambda: echoes.round(n)) for _ in range(reps))
        row["issue"], row["cpu_op"] = issue_rate([mwrt.zeros(16, node=i) for i in range(n)], ops)
        row["pings"], row["pongs"] = heartbeat_rate(window)
        after = (fd_count(), tcp_sockets()["established"], status_field("self", "Threads"))
        row["fds"], row["tcp"], row["threads"] = (a - b for a, b in zip(after, before))
        rss = [status_field(pid, "VmRSS") / 1024 for pid in workers]
        row["rss"] = (statistics.median(rss), max(rss))
        row["worker_threads"] = statistics.median(status_field(p, "Threads") for p in workers)
        row["worker_fds"] = statistics.median(fd_count(p) for p in workers)
    finally:
        mwrt.shutdown()
    row["bare"] = bare_starts(n)
    return row


def mw_table(sizes: list, reps: int, ops: int, window: float) -> None:
    """Table 1, printed as markdown."""
    interval = config.get("heartbeat_interval")
    echoes = EchoFarm(max(sizes))
    try:
        rows = []
        for n in sizes:
            rows.append((n, mw_row(n, echoes, reps, ops, window)))
            print(f"# master-worker N={n}: done", file=sys.stderr)
    finally:
        echoes.close()
    print(f"\n## master-worker, N local daemons (medians of {reps} rounds; {ops} ops issued; "
          f"heartbeat interval {interval} s, counted over {window} s)\n")
    print("| N | init s (daemons + sessions + join) | baseline: N bare Python starts s | "
          "fan-out: op on each + synchronize() ms | same, all batches sent first ms | "
          "baseline: N pyzmq echoes ms | float(t.sum()) node by node ms | ops issued/s | "
          "master CPU µs/op | "
          "master fds / TCP / threads added | "
          "worker RSS MiB median, max | worker threads, fds | heartbeats/s computed | "
          "pings, pongs/s counted |")
    print("|" + "---|" * 14)
    for n, r in rows:
        print(f"| {n} | {r['init']:.2f} ({r['daemons']:.2f} + {r['sessions']:.2f} + "
              f"{r['join']:.2f}) | {r['bare']:.2f} | {r['sync'] * 1e3:.2f} | "
              f"{r['flushed'] * 1e3:.2f} | "
              f"{r['echo'] * 1e3:.2f} | {r['serial'] * 1e3:.2f} | {r['issue']:,.0f} | "
              f"{r['cpu_op'] * 1e6:.1f} | "
              f"{r['fds']} / {r['tcp']} / {r['threads']} | {r['rss'][0]:.0f}, {r['rss'][1]:.0f} "
              f"| {r['worker_threads']:.0f}, {r['worker_fds']:.0f} | {n / interval:.0f} + "
              f"{n / interval:.0f} | {r['pings']:.0f}, {r['pongs']:.0f} |")


# -- table 2: SPMD ranks on simulated hosts (programs run as `--role rank`) ----------------


class RawRing:
    """Plain sockets from each rank to the next one: the bytes-only floor of a ring."""

    def __init__(self, rank: int, addrs: list, port: int):
        server = socket.create_server((addrs[rank], port))
        self.next = connect_retrying((addrs[(rank + 1) % len(addrs)], port))
        self.prev = server.accept()[0]
        server.close()
        for sock in (self.next, self.prev):
            tune(sock)
            sock.settimeout(RUN_TIMEOUT)
        self.spare: dict[int, tuple] = {}

    def inodes(self) -> set:
        return {str(os.fstat(s.fileno()).st_ino) for s in (self.next, self.prev)}

    def pass_on(self, nbytes: int) -> None:
        """Send nbytes to the next rank while receiving as many from the previous."""
        if nbytes not in self.spare:  # both prefaulted and reused, as a floor's should be
            self.spare[nbytes] = np.ones(nbytes, np.uint8), np.ones(nbytes, np.uint8)
        out, into = self.spare[nbytes]
        if nbytes <= 64 * KIB:  # fits the socket buffer: no thread needed to avoid a deadlock
            self.next.sendall(out)
            recv_exactly(self.prev, memoryview(into))
            return
        sender = threading.Thread(target=send_in_pieces, args=(self.next, out))
        sender.start()
        recv_exactly(self.prev, memoryview(into))
        sender.join()

    def close(self) -> None:
        self.next.close()
        self.prev.close()


def count_store_requests(serve: bool) -> dict:
    """Count TCPStore requests in this process from now on: the client's by op, new
    connections, and (on rank 0, which serves the store) every request served."""
    from mwrt.store import tcp_store_server as store_server
    from mwrt.store import tcp_store as store_tcp

    counts: dict = {"served": 0, "connects": 0}
    call, connect, handle = (store_tcp.TCPStore._call, store_tcp.TCPStore._connect,
                             store_server.handle)

    def counting_call(self, op, *args, **kwargs):
        counts[op] = counts.get(op, 0) + 1
        return call(self, op, *args, **kwargs)

    def counting_connect(self):
        counts["connects"] += 1
        return connect(self)

    def counting_handle(*args):
        counts["served"] += 1  # one thread per client: a lost increment is within the noise
        return handle(*args)

    store_tcp.TCPStore._call, store_tcp.TCPStore._connect = counting_call, counting_connect
    if serve:
        store_server.handle = counting_handle  # StoreServer._serve looks it up on each call
    return counts


def connect_echo(addr: str, port: int) -> float:
    """Seconds for a fresh TCP connection to rank 0's echo and one byte there and back."""
    start = time.perf_counter()
    with socket.create_connection((addr, port), timeout=30) as sock:
        sock.sendall(b"x")
        recv_exactly(sock, memoryview(bytearray(1)))
    return time.perf_counter() - start


def serve_echo(addr: str, port: int) -> set:
    """On rank 0: accept connections forever, echo one byte on each (the connect baseline);
    returns the listener's inode."""
    server = socket.create_server((addr, port))

    def loop():
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(conn.recv(1))

    threading.Thread(target=loop, daemon=True).start()
    return {str(os.fstat(server.fileno()).st_ino)}


def wait_for_file(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_scale: no go file {path} within {timeout} s")
        time.sleep(0.002)


def in_turns(dist, impls: dict, reps: int) -> dict:
    """Seconds per repetition of each fn, taking turns, each after a barrier, after two
    warm-ups of each (they fault in the buffers and open the TCP windows)."""
    for _ in range(2):
        for fn in impls.values():
            fn()
    times = {name: [] for name in impls}
    for _ in range(reps):
        for name, fn in impls.items():
            dist.barrier()  # every rank starts together: the slowest one's time counts
            times[name].append(timed(fn))
    return times


def role_rank(rank: int, addrs: list, port: int, go: str, reps: dict) -> dict:
    """One SPMD rank: timed init, then all_reduce and the raw floors in turn, socket counts."""
    import mwrt.distributed as dist

    counts = count_store_requests(serve=rank == 0)
    print("ready", flush=True)  # imported: the parent starts every rank's clock at once
    wait_for_file(go, 120)
    init = timed(lambda: dist.init_process_group("tcp", init_method=f"tcp://{addrs[0]}:{port}",
                                                 rank=rank, world_size=len(addrs), timeout=60))
    out = {"init": init, "requests": dict(counts), "sockets": {"init": tcp_sockets("self", port)},
           "threads": status_field("self", "Threads")}
    ours = serve_echo(addrs[0], port + 2) if rank == 0 else set()
    ring = RawRing(rank, addrs, port + 1)
    try:
        dist.barrier()
        out["connect"] = [connect_echo(addrs[0], port + 2) for _ in range(5)]
        for nbytes in (4 * KIB, 16 * MIB):
            buf = np.zeros(nbytes // 4, np.float32)  # zeros: the sums stay exact
            moved = nbytes if nbytes < MIB else 2 * (len(addrs) - 1) * nbytes // len(addrs)
            impls = {"mwrt": lambda: dist.all_reduce(buf), "raw": lambda: ring.pass_on(moved)}
            for name, times in in_turns(dist, impls, reps[nbytes]).items():
                out[f"{name}{nbytes}"] = times
            out["sockets"][nbytes] = tcp_sockets("self", port, ours | ring.inodes())
        out["requests_total"] = dict(counts)
        return out
    finally:
        ring.close()
        dist.destroy_process_group()


ROLES = {"rank": role_rank}


def launch(host, role: str, args: dict, env: dict):
    """This file with `--role role` on `host`, stdout and stderr piped."""
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--args", json.dumps(args)]
    return host.popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      stdin=subprocess.DEVNULL, text=True)


def await_ready(proc, what: str) -> None:
    """Wait for the role's 'ready' line; an error with its stderr if it died first."""
    line = proc.stdout.readline()  # each role prints it within seconds, or exits
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate()
        raise SystemExit(f"bench_scale: {what} did not start (said {line!r}):\n{err[-3000:]}")


def result(proc, what: str) -> dict:
    """The JSON a role printed last (bench_hosts's reader, naming this benchmark)."""
    return hosts_result(proc, what, "bench_scale")


def spmd_row(hosts, k: int, port: int, reps: dict, home: str) -> dict:
    """Run k ranks on hosts[:k], start their clocks together, gather their figures."""
    go = os.path.join(home, f"go-{k}")
    env = {"MWRT_JOB_SECRET": secrets.token_hex(16)}  # the same secret on every rank
    args = {"addrs": [h.addr for h in hosts[:k]], "port": port, "go": go,
            "reps": {str(n): r for n, r in reps.items()}}
    procs = [launch(h, "rank", dict(args, rank=r), env) for r, h in enumerate(hosts[:k])]
    try:
        for r, proc in enumerate(procs):
            await_ready(proc, f"rank {r} of {k}")
        open(go, "w").close()
        res = [result(proc, f"rank {r} of {k}") for r, proc in enumerate(procs)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return summarize(k, res)


def slowest(res: list, key: str) -> float:
    """Median over repetitions of the slowest rank's seconds."""
    return float(np.median(np.max([r[key] for r in res], axis=0)))


def summarize(k: int, res: list) -> dict:
    """Table 2's figures from every rank's JSON."""
    big = 16 * MIB
    factor = 2 * (k - 1) / k  # bus bandwidth: bytes each rank must send, over the time
    est = {stage: [r["sockets"][stage]["established"] - r["sockets"][stage]["store"]
                   for r in res] for stage in ("init", str(4 * KIB), str(big))}
    client = [sum(v for op, v in r["requests"].items() if op not in ("served", "connects"))
              for r in res]
    return {
        "init": (statistics.median(r["init"] for r in res), max(r["init"] for r in res)),
        "connect": statistics.median(t for r in res for t in r["connect"]),
        "small": slowest(res, f"mwrt{4 * KIB}"), "small_raw": slowest(res, f"raw{4 * KIB}"),
        "busbw": factor * big / slowest(res, f"mwrt{big}") / 1e9,
        "busbw_raw": factor * big / slowest(res, f"raw{big}") / 1e9,
        "requests": (statistics.median(client), max(client)),
        "served": res[0]["requests"]["served"],
        "connects": statistics.median(r["requests"]["connects"] for r in res),
        "store_conns": (res[0]["sockets"]["init"]["store"],
                        statistics.median(r["sockets"]["init"]["store"] for r in res[1:])),
        "est": {stage: (min(v), max(v)) for stage, v in est.items()},
        "listen": max(r["sockets"][str(big)]["listen"] for r in res),
        "threads": (min(r["threads"] for r in res), max(r["threads"] for r in res)),
        "ops": res[-1]["requests"],
    }


def spmd_table(sizes: list, reps: dict) -> None:
    """Table 2 on tests/support/hosts.py's simulated hosts, or the reason it cannot be made."""
    from tests.support.hosts import make_hosts, unavailable

    print(f"\n## SPMD, k simulated hosts, one rank each, tcp channel (4 KiB: median of "
          f"{reps[4 * KIB]}, 16 MiB: median of {reps[16 * MIB]}, the slowest rank's time)\n")
    reason = unavailable()
    if reason:
        print(f"skipped: {reason}")
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="mwrt-bench-scale-") as home, \
            make_hosts(max(sizes)) as hosts:
        for i, k in enumerate(sizes):
            rows.append((k, spmd_row(hosts, k, STORE_PORT + 10 * i, reps, home)))
            print(f"# SPMD k={k}: rank {k - 1}'s store calls during init: {rows[-1][1]['ops']}",
                  file=sys.stderr)
    print("| k | init s median, max | baseline: TCP connect + 1-byte echo to host0 ms | "
          "store requests per rank median, max (rank 0 served) | "
          "channel TCP conns per rank after init; 4 KiB; 16 MiB (min-max) | "
          "store conns rank 0, others | threads per rank after init | "
          "4 KiB all_reduce µs | baseline: one 4 KiB hop µs | 16 MiB busbw GB/s | "
          "baseline: raw ring GB/s |")
    print("|" + "---|" * 11)
    for k, r in rows:
        conns = "; ".join(f"{lo}-{hi}" if lo != hi else f"{lo}" for lo, hi in r["est"].values())
        print(f"| {k} | {r['init'][0]:.2f}, {r['init'][1]:.2f} | {r['connect'] * 1e3:.2f} | "
              f"{r['requests'][0]:.0f}, {r['requests'][1]:.0f} ({r['served']}) | {conns} | "
              f"{r['store_conns'][0]}, {r['store_conns'][1]:.0f} | "
              f"{'-'.join(str(t) for t in sorted(set(r['threads'])))} | "
              f"{r['small'] * 1e6:.0f} | {r['small_raw'] * 1e6:.0f} | {r['busbw']:.2f} | "
              f"{r['busbw_raw']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N <= 2, k = 2, few repetitions")
    ap.add_argument("--skip-hosts", action="store_true", help="table 1 only")
    ap.add_argument("--skip-workers", action="store_true", help="table 2 only")
    ap.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    ap.add_argument("--args", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:  # a program on a simulated host
        given = json.loads(args.args)
        given["reps"] = {int(n): r for n, r in given["reps"].items()}
        print(json.dumps(ROLES[args.role](**given)), flush=True)
        return
    started = time.monotonic()
    if not args.skip_workers:
        start_stop_table(3 if args.quick else 10)
        if args.quick:
            mw_table([1, 2], reps=5, ops=2000, window=1.0)
        else:
            mw_table([1, 2, 4, 8, 16, 32], reps=20, ops=20000, window=3.0)
    if not args.skip_hosts:
        if args.quick:
            spmd_table([2], {4 * KIB: 10, 16 * MIB: 2})
        else:
            spmd_table([2, 4, 8, 16], {4 * KIB: 50, 16 * MIB: 5})
    print(f"# {time.monotonic() - started:.1f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()

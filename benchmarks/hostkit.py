"""What the benchmarks that run programs on simulated hosts share: plain-socket helpers with
the tcp channel's own settings (the baselines' sockets), the raw-socket baseline programs,
launching a benchmark's role on a host and reading the JSON it prints, and what /proc says a
process holds (TCP sockets, threads, descriptors)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

from mwrt.channels.tcp import tune  # the baselines' sockets get the channel's settings

KIB, MIB = 1 << 10, 1 << 20
PIECE_BYTES = 4 * MIB  # the tcp channel's segment size (MWRT_SEGMENT_BYTES)
RUN_TIMEOUT = 300.0  # for a role to finish
TCP_STATES = {"01": "established", "0A": "listen"}


def connect_retrying(addr: tuple[str, int], timeout: float = 30.0) -> socket.socket:
    """A plain TCP connection, retried while the peer's listener is not up yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(addr)
            tune(sock)
            return sock
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from `sock`."""
    got = 0
    while got < view.nbytes:
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("peer closed mid-message")
        got += n


def send_in_pieces(sock: socket.socket, buf: np.ndarray) -> None:
    """sendall in pieces of the channel's segment size: one huge send holds the socket's lock
    through the whole copy, so the kernel cannot process the peer's ACKs meanwhile (measured
    here: 2.0 GB/s in one call, faster in pieces)."""
    view = memoryview(buf).cast("B")
    for start in range(0, view.nbytes, PIECE_BYTES):
        sock.sendall(view[start:start + PIECE_BYTES])


def role_raw_recv(addr: str, port: int, nbytes: int, reps: int) -> dict:
    """Baseline receiver: accept one connection, receive and ack reps + 1 messages."""
    with socket.create_server((addr, port)) as server:
        conn, _ = server.accept()
    tune(conn)
    buf = np.zeros(nbytes, np.uint8)  # prefaulted and reused, as a ceiling should be
    with conn:
        for _ in range(reps + 1):
            recv_exactly(conn, memoryview(buf))
            conn.sendall(b"k")
    return {}


def role_raw_send(addr: str, port: int, nbytes: int, reps: int) -> dict:
    """Baseline sender: time sendall of `nbytes` plus the 1-byte ack, reps + 1 times."""
    # Connect first, then allocate: allocating 64 MiB before connecting made this same loop
    # run at 2.0 GB/s instead of 3.0 over the veth link, reproducibly (the placement of the
    # buffer's pages, not the socket, differs); the floor should be the better of the two.
    with connect_retrying((addr, port)) as sock:
        src, ack, times = np.ones(nbytes, np.uint8), bytearray(1), []
        for i in range(reps + 1):
            start = time.perf_counter()
            send_in_pieces(sock, src)
            recv_exactly(sock, memoryview(ack))
            if i:  # the first warms the connection's window and the receiver's pages
                times.append(time.perf_counter() - start)
    return {"times": times}


def launch(script: str, host, role: str, args: dict, env: dict | None = None,
           log: str | None = None):
    """`script` with `--role role` on `host`; stdout is a pipe, or a log file for daemons."""
    cmd = [sys.executable, os.path.abspath(script), "--role", role, "--args", json.dumps(args)]
    out = open(log, "w") if log else subprocess.PIPE
    try:
        return host.popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if log else
                          subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    finally:
        if log:
            out.close()  # the child has its own descriptor


def result(proc, what: str, program: str, timeout: float = RUN_TIMEOUT) -> dict:
    """The JSON a role printed last; an error naming `program` with its stderr if it failed."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise SystemExit(f"{program}: {what} timed out:\n{err[-2000:]}") from None
    if proc.returncode != 0:
        raise SystemExit(f"{program}: {what} exited {proc.returncode}:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def await_ready(proc, what: str, program: str) -> None:
    """Wait for the role's 'ready' line; an error naming `program` with its stderr if it died
    first."""
    line = proc.stdout.readline()  # each role prints it within seconds, or exits
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate()
        raise SystemExit(f"{program}: {what} did not start (said {line!r}):\n{err[-3000:]}")


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

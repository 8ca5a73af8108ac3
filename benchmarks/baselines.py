"""The baselines the benchmarks measure mwrt against, in the same run: a pyzmq DEALER/ROUTER
echo and a PUSH loop into another process, a loopback TCP socket, memory copies (into warm
pages, fresh ones, pages the process never touched) and a multiprocessing.shared_memory
handoff between two processes; and for N nodes, N echo processes (EchoFarm) and N DEALER
sockets into one sink (SendSink)."""

from __future__ import annotations

import mmap
import multiprocessing
import socket
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import zmq


def median_us(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


ECHO = """
import sys, zmq
ctx = zmq.Context(); router = ctx.socket(zmq.ROUTER)
port = router.bind_to_random_port("tcp://127.0.0.1"); print(port, flush=True)
while True:
    frames = router.recv_multipart()
    if frames[-1] == b"stop":
        break
    router.send_multipart(frames)
"""

# The same echo on a Unix socket (the path local workers take): it prints its address.
ECHO_IPC = """
import os, tempfile, zmq
folder = tempfile.mkdtemp(); address = f"ipc://{folder}/echo"
ctx = zmq.Context(); router = ctx.socket(zmq.ROUTER)
router.bind(address); print(address, flush=True)
while True:
    frames = router.recv_multipart()
    if frames[-1] == b"stop":
        break
    router.send_multipart(frames)
router.close(0); os.unlink(address[6:]); os.rmdir(folder)
"""


def zmq_round_trip(reps: int) -> float:
    """Raw DEALER/ROUTER echo over loopback tcp; the echo is another process, like a worker."""
    echo = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    port = int(echo.stdout.readline())
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    msg = [b"x" * 16]

    def once():
        dealer.send_multipart(msg)
        dealer.recv_multipart()
    for _ in range(100):
        once()
    result = median_us(once, reps)
    dealer.send_multipart([b"stop"])
    echo.wait(10)
    echo.stdout.close()
    dealer.close(0)
    ctx.term()
    return result


SINK = """
import sys, zmq
ctx = zmq.Context(); pull = ctx.socket(zmq.PULL)
port = pull.bind_to_random_port("tcp://127.0.0.1"); print(port, flush=True)
while pull.recv() != b"stop":
    pass
"""


def zmq_push_rate(n: int) -> float:
    """Messages per second a bare pyzmq PUSH loop sends to a PULL in another process: the
    floor under the master's issue rate (one small command per op, none of mwrt's work)."""
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    port = int(sink.stdout.readline())
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    msg = b"x" * 48  # about one encoded Call of `x += 1.0`
    t0 = time.perf_counter()
    for _ in range(n):
        push.send(msg)
    rate = n / (time.perf_counter() - t0)
    push.send(b"stop")
    sink.wait(30)
    sink.stdout.close()
    push.close(0)
    ctx.term()
    return rate


def raw_socket_gbps(nbytes: int, reps: int = 5) -> float:
    """sendall/recv_into over a loopback TCP socket between two threads."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    src = np.ones(nbytes, np.uint8)
    dst = np.empty(nbytes, np.uint8)

    def sender():
        conn, _ = server.accept()
        for _ in range(reps):
            conn.sendall(src)
            conn.recv(1)
        conn.close()

    thread = threading.Thread(target=sender)
    thread.start()
    client = socket.create_connection(("127.0.0.1", port))
    times = []
    view = memoryview(dst)
    for _ in range(reps):
        t = time.perf_counter()
        got = 0
        while got < nbytes:
            got += client.recv_into(view[got:])
        times.append(time.perf_counter() - t)
        client.sendall(b"k")
    thread.join()
    client.close()
    server.close()
    return nbytes / statistics.median(times) / 1e9


def memcpy_gbps(nbytes: int, reps: int = 5, fresh: bool = False) -> float:
    """np.copyto into a prefaulted array (the ceiling of a same-host copy), or into a fresh
    np.empty each time (what .numpy() does, as it must return a new array; after the first
    free, malloc mostly hands back pages it already has)."""
    src, warm = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)

    def once():
        np.copyto(np.empty(nbytes, np.uint8) if fresh else warm, src)
    return nbytes / statistics.median(timed(once) for _ in range(reps)) / 1e9


def new_pages_gbps(nbytes: int, reps: int = 5) -> float:
    """np.copyto into pages the process never touched (a fresh mmap each time): what a
    .numpy() costs when malloc has just given its memory back to the kernel."""
    src = np.ones(nbytes, np.uint8)

    def once():
        pages = mmap.mmap(-1, nbytes)
        view = np.frombuffer(pages, np.uint8)
        np.copyto(view, src)
        del view
        pages.close()
    return nbytes / statistics.median(timed(once) for _ in range(reps)) / 1e9


def _shm_reader(name: str, nbytes: int, conn) -> None:
    """The handoff's receiver: on each word, copy the segment into its own array."""
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(name=name)
    src = np.ndarray(nbytes, np.uint8, buffer=shm.buf)
    dst = np.zeros(nbytes, np.uint8)
    while conn.recv():
        np.copyto(dst, src)
        conn.send(True)
    del src
    shm.close()


def shm_handoff_gbps(nbytes: int, reps: int = 5) -> float:
    """multiprocessing.shared_memory handoff: copy into a segment, another process copies out."""
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=nbytes)
    try:
        ctx = multiprocessing.get_context("fork")  # before any mwrt thread starts
        ours, theirs = ctx.Pipe()
        reader = ctx.Process(target=_shm_reader, args=(shm.name, nbytes, theirs))
        reader.start()
        seg, src = np.ndarray(nbytes, np.uint8, buffer=shm.buf), np.ones(nbytes, np.uint8)

        def once():
            np.copyto(seg, src)
            ours.send(True)
            if not ours.poll(30):
                raise SystemExit("bench_ops: the shared-memory reader did not answer in 30 s")
            ours.recv()
        once()
        seconds = statistics.median(timed(once) for _ in range(reps))
        ours.send(False)
        reader.join(10)
        del seg
    finally:
        shm.close()
        shm.unlink()
    return nbytes / seconds / 1e9


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class EchoFarm:
    """N pyzmq ROUTER echo processes and one DEALER to each: the fan-out floor."""

    def __init__(self, n: int):
        self.procs = [subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE,
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
                raise SystemExit("EchoFarm: an echo process did not answer within 10 s")
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


ROUTER_SINK = """
import sys, zmq
ctx = zmq.Context(); router = ctx.socket(zmq.ROUTER)
port = router.bind_to_random_port("tcp://127.0.0.1"); print(port, flush=True)
while router.recv_multipart()[-1] != b"stop":
    pass
"""


class SendSink:
    """One process that drains what N DEALER sockets of this one send it: the baseline of a
    master that sends each op to each node in its own message."""

    def __init__(self, n: int):
        self.proc = subprocess.Popen([sys.executable, "-c", ROUTER_SINK], stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)
        self.ctx = zmq.Context()
        port = int(self.proc.stdout.readline())
        self.dealers = [self.ctx.socket(zmq.DEALER) for _ in range(n)]
        for dealer in self.dealers:
            dealer.connect(f"tcp://127.0.0.1:{port}")
        self.body = b"x" * 48  # about a small Call's bytes

    def send_to(self, n: int) -> None:
        """One message to the sink on each of the first n sockets."""
        body = self.body
        for dealer in self.dealers[:n]:
            dealer.send(body)

    def close(self) -> None:
        self.dealers[0].send(b"stop")
        for dealer in self.dealers:
            dealer.close(linger=1000)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.ctx.term()

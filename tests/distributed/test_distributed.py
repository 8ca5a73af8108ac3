"""The torch.distributed-shaped facade, spawn and mwrt-launch, end to end in real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tests.support import machine
from tests.support.ranks import available, spawn_and_collect

import mwrt.distributed as dist
from mwrt.errors import ChannelClosedError, ChannelTimeoutError, ConfigError

pytestmark = pytest.mark.timeout(60)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKENDS = [b for b in ("tcp", "shm") if available(b)]


def _facade(rank, backend):
    dist.init_process_group(backend, timeout=machine.seconds(10, 100))
    n = dist.get_world_size()
    assert (dist.get_rank(), dist.get_backend(), dist.is_initialized()) == (rank, backend, True)
    a = np.full(5, rank + 1, np.int64)
    dist.all_reduce(a, op=dist.ReduceOp.MAX)
    assert (a == n).all()
    b = np.arange(4.0) if rank == 1 else np.zeros(4)
    dist.broadcast(b, src=1)
    assert (b == np.arange(4.0)).all()
    out = [np.zeros(2, np.float32) for _ in range(n)]
    dist.all_gather(out, np.full(2, rank, np.float32))
    assert [int(o[0]) for o in out] == list(range(n))
    uneven = [np.zeros((p, 2)) for p in range(n)]  # torch allows a size per rank
    dist.all_gather(uneven, np.full((rank, 2), rank + 0.5))
    assert [u.tolist() for u in uneven] == [[[p + 0.5] * 2] * p for p in range(n)]
    # torch's documented uneven all_to_all_single, on the first three of its four ranks
    in_split = [[2, 2, 1], [3, 2, 2], [2, 1, 1]][rank]
    out_split = [[2, 3, 2], [2, 2, 1], [1, 2, 1]][rank]
    a2a = np.zeros(sum(out_split))
    dist.all_to_all_single(a2a, np.arange(sum(in_split)) + rank * 10.0, out_split, in_split)
    assert a2a.tolist() == [[0, 1, 10, 11, 12, 20, 21], [2, 3, 13, 14, 22],
                            [4, 15, 16, 23]][rank]
    pieces = [np.zeros(rank + p) for p in range(n)]
    dist.all_to_all(pieces, [np.full(p + rank, rank * 1.0) for p in range(n)])
    assert [q.tolist() for q in pieces] == [[p * 1.0] * (rank + p) for p in range(n)]
    sent = [[1, 3, 2], [3, 1, 2], [2, 2, 2]]  # rank 2's lists happen to be all one size
    pieces = [np.zeros(sent[p][rank]) for p in range(n)]
    dist.all_to_all(pieces, [np.full(sent[rank][p], rank * 1.0) for p in range(n)])
    assert [q.tolist() for q in pieces] == [[p * 1.0] * sent[p][rank] for p in range(n)]
    got = np.zeros(3)
    dist.scatter(got, [np.full(3, i * 10.0) for i in range(n)] if rank == 0 else None, src=0)
    assert (got == rank * 10).all()
    gl = [np.zeros(3) for _ in range(n)] if rank == 2 else None
    dist.gather(got, gl, dst=2)
    if rank == 2:
        assert [g[0] for g in gl] == [i * 10.0 for i in range(n)]
    rs = np.zeros(2)
    dist.reduce_scatter(rs, [np.full(2, float(i)) for i in range(n)])
    assert (rs == rank * n).all()
    a2a = [np.zeros(1) for _ in range(n)]
    dist.all_to_all(a2a, [np.full(1, rank * 100.0 + p) for p in range(n)])
    assert [x[0] for x in a2a] == [p * 100.0 + rank for p in range(n)]
    # point-to-point around a ring, blocking and async
    right, left = (rank + 1) % n, (rank - 1) % n
    buf = np.zeros(3)
    send = dist.isend(np.full(3, float(rank)), right, tag=7)
    dist.irecv(buf, left, tag=7).wait()
    send.wait()
    assert (buf == left).all()
    # async collectives keep program order; a subgroup without rank 2
    w = dist.all_reduce(c := np.ones(4), async_op=True)
    sub = dist.new_group([0, 1])
    if rank < 2:
        s = np.ones(1)
        dist.all_reduce(s, group=sub)
        assert s[0] == 2 and dist.get_rank(sub) == rank
    else:
        assert sub is dist.GroupMember.NON_GROUP_MEMBER and dist.all_reduce(np.ones(1), group=sub) is None
    w.wait()
    assert (c == n).all()
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(n)]
    lst = [rank, "x"] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [0, "x"]
    _torch_extras(rank, n)
    dist.barrier()
    dist.destroy_process_group()
    dist.init_process_group(backend, timeout=machine.seconds(10, 100))  # re-init works
    a = np.ones(2)
    dist.all_reduce(a)
    assert (a == n).all()
    dist.destroy_process_group()


def _torch_extras(rank, n):
    """The rest of torch's surface: object gather/scatter/p2p, batched p2p, rank lookups."""
    got = [None] * n if rank == 1 else None
    dist.gather_object("x" * rank, got, dst=1)
    assert rank != 1 or got == ["x" * r for r in range(n)]
    mine = [None]
    dist.scatter_object_list(mine, [{"to": r} for r in range(n)] if rank == 0 else None, src=0)
    assert mine == [{"to": rank}]
    right, left = (rank + 1) % n, (rank - 1) % n
    inbox = np.zeros(3)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, np.full(3, rank * 1.0), right),
                                    dist.P2POp(dist.irecv, inbox, left)])
    assert all(w.wait() and w.is_success() for w in works) and inbox.tolist() == [left] * 3
    if rank == 0:
        dist.send_object_list([{"a": 1}, "b"], dst=n - 1)
    elif rank == n - 1:
        received = [None, None]
        assert dist.recv_object_list(received) == 0 and received == [{"a": 1}, "b"]
    sub = dist.new_group([1, 2])
    if sub is not dist.GroupMember.NON_GROUP_MEMBER:
        assert dist.get_group_rank(sub, 2) == 1 and dist.get_global_rank(sub, 0) == 1
    assert dist.get_node_local_rank() == rank and dist.is_available()
    mine, every = dist.new_subgroups_by_enumeration([[0, 2], [1]])
    assert len(every) == 2 and mine.ranks == ([1] if rank == 1 else [0, 2])
    x = np.ones(1)
    dist.all_reduce(x, group=mine)
    assert x[0] == len(mine.ranks)
    with pytest.raises(ValueError, match="must divide the world size"):
        dist.new_subgroups(2)  # 3 ranks


@pytest.mark.parametrize("backend", BACKENDS)
def test_facade_end_to_end(backend):
    dist.spawn(_facade, args=(backend,), nprocs=3, timeout=machine.seconds(50, 500))


def _fails(rank):
    dist.init_process_group("tcp", timeout=machine.seconds(10, 100))
    if rank == 1:
        raise ValueError("rank one is unhappy")
    dist.all_reduce(np.ones(3))  # survivors are stopped by spawn, or fail on rank 1's absence


@pytest.mark.quick
def test_spawn_names_the_failing_rank_and_its_traceback():
    with pytest.raises(dist.RankFailedError, match="rank 1 exited with code 1") as info:
        dist.spawn(_fails, nprocs=3, timeout=machine.seconds(40, 400))
    assert "rank one is unhappy" in str(info.value) and info.value.rank == 1


@pytest.mark.quick
def test_spawn_refuses_what_it_cannot_start():
    import threading

    with pytest.raises(ValueError, match="nprocs must be a positive int"):
        dist.spawn(_fails, nprocs=0)
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"<lambda> cannot be sent to the ranks "
                                        r"\(TypeError: cannot pickle '_thread.lock'"):
        dist.spawn(lambda rank: lock, nprocs=2)
    with pytest.raises(TypeError, match="a tuple of its arguments"):
        dist.spawn(_fails, args=5, nprocs=1)


def test_run_and_spawn_take_a_function_of_python_c_a_lambda_or_a_closure(tmp_path):
    """The spawn start method sent fn by name, which a rank cannot import from `python -c`
    or a notebook ("Can't get attribute 'main' on <module '__main__'>"): cloudpickle's."""
    program = textwrap.dedent("""
        import numpy as np, mwrt.distributed as dist
        def main():
            dist.init_process_group()
            t = np.ones(2) * (dist.get_rank() + 1)
            dist.all_reduce(t)
            print(f"rank {dist.get_rank()} {t.tolist()}\\n", end="", flush=True)  # one write
            dist.destroy_process_group()
        dist.run(main, nprocs=2)
        scale = 3
        dist.spawn(lambda rank, k: print(f"lambda {rank} {k * scale}\\n", end="", flush=True),
                   args=(2,), nprocs=2)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        ROOT, os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         env=env, timeout=machine.seconds(60, 600), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(res.stdout.splitlines()) == [
        "lambda 0 6", "lambda 1 6", "rank 0 [3.0, 3.0]", "rank 1 [3.0, 3.0]"], res.stdout


def _dies_mid_collective(rank, queue):
    dist.init_process_group("tcp", timeout=machine.seconds(3, 30))
    if rank == 2:
        os._exit(3)  # a crash: no close, no goodbye
    try:
        dist.all_reduce(np.ones(1 << 16, np.float32))
        queue.put((rank, "no error"))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, str(e)))


def test_a_dying_rank_is_named_by_every_survivor():
    _, got = spawn_and_collect(_dies_mid_collective, nprocs=3, reports=2, join=30)
    for rank in (0, 1):
        assert "rank 2" in got[rank], got[rank]


def _monitored(rank, queue, backend="tcp"):
    dist.init_process_group(backend, timeout=machine.seconds(10, 100))
    dist.monitored_barrier(timeout=5)  # everyone comes: it passes
    if rank == 3:
        os._exit(3)
    if rank == 2:
        time.sleep(3)  # alive, but not there in time
        return
    try:
        dist.monitored_barrier(timeout=1, wait_all_ranks=True)
        queue.put((rank, "no error"))
    except ChannelTimeoutError as e:
        queue.put((rank, str(e)))


def _any_source_from_the_dead(rank, queue):
    dist.init_process_group("tcp", timeout=machine.seconds(20, 200))
    if rank == 1:
        os._exit(3)
    try:
        dist.recv(np.zeros(1))
        queue.put((rank, "no error"))
    except ChannelClosedError as e:
        queue.put((rank, str(e)))


def test_a_receive_from_any_source_fails_when_no_peer_is_left():
    _, got = spawn_and_collect(_any_source_from_the_dead, nprocs=2, reports=1, join=15)
    assert "every peer is gone" in got[0] and "rank 1" in got[0], got[0]


def _monitored_shm(rank, queue):
    _monitored(rank, queue, "shm")


@pytest.mark.parametrize("fn", [_monitored, _monitored_shm], ids=["tcp", "shm"])
def test_monitored_barrier_names_every_rank_that_did_not_come(fn):
    _, got = spawn_and_collect(fn, nprocs=4, reports=2, join=30)
    for rank in (0, 1):
        assert "ranks [2] did not arrive within 1.0 s" in got[rank], got[rank]
        assert "ranks [3] closed their connection or died" in got[rank], got[rank]


@pytest.mark.quick
def test_init_errors():
    with pytest.raises(RuntimeError, match="not initialized"):
        dist.get_rank()
    with pytest.raises(Exception, match="ranks \\[1\\] of world size 2 did not join"):
        dist.init_process_group("tcp", init_method="tcp://127.0.0.1:0", rank=0, world_size=2,
                                timeout=0.5)
    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match="unknown channel 'nccl2'"):  # at once, not at timeout
        dist.init_process_group("nccl2", init_method="tcp://127.0.0.1:0", rank=0, world_size=2,
                                timeout=300)
    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match=r"unknown backend 'nccl2' \(known: gloo, auto, inproc"):
        dist.Backend("nccl2")


def _torch_tutorial(rank):
    """torch's "Writing Distributed Applications" tutorial, arrays for tensors."""
    assert dist.is_available() and dist.is_gloo_available()
    assert isinstance(dist.is_nccl_available(), bool)  # True where CuPy's NCCL loads
    dist.init_process_group(dist.Backend.GLOO, rank=rank, world_size=2)  # runs as tcp
    tensor = np.zeros(1)
    if rank == 0:
        tensor += 1
        req = dist.isend(tensor=tensor, dst=1)
    else:
        req = dist.irecv(tensor=tensor, src=0)
    req.wait()
    group = dist.new_group([0, 1])
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    assert tensor[0] == 2 and dist.get_backend() == "gloo"
    dist.all_reduce(tensor, group=dist.group.WORLD)  # the default group, as torch's
    dist.barrier(device_ids=[0])  # NCCL code passes its GPU; nothing to pick here
    assert tensor[0] == 4 and dist.get_world_size(dist.group.WORLD) == 2
    dist.destroy_process_group()


def _any_source(rank, backend):
    dist.init_process_group(backend, timeout=2)
    n = dist.get_world_size()
    if rank == 0:
        got: dict = {}
        for _ in range(2 * (n - 1)):
            t = np.zeros(2)
            got.setdefault(dist.recv(t), []).append(t[0])  # returns the sender, as torch's
        assert got == {p: [p, p * 10.0] for p in range(1, n)}, got  # in order per sender
        late = np.zeros(2)
        work = dist.irecv(late)  # from any source, on a thread: the sender is known once done
        dist.send(np.ones(1), dst=1, tag=9)  # rank 1 sends only once asked
        assert work.wait() and work.source_rank() == 1 and late.tolist() == [5.0, 5.0]
        with pytest.raises(ChannelTimeoutError, match=r"any source.*nothing from ranks \[1, 2\]"):
            dist.recv(np.zeros(2), tag=7)
        for bad in (-1, 1 << 32):  # a tag the channel's 32 bits cannot hold apart
            with pytest.raises(ValueError, match=r"tag: must be in \[0, 2\*\*32\)"):
                dist.send(np.zeros(1), dst=1, tag=bad)
    else:
        dist.send(np.full(2, rank * 1.0), dst=0)
        dist.send(np.full(2, rank * 10.0), dst=0)
        if rank == 1:
            dist.recv(np.zeros(1), src=0, tag=9)
            dist.send(np.full(2, 5.0), dst=0)
        time.sleep(3)  # alive while rank 0 waits out its timeout on tag 7: it is not "gone"
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
def test_recv_from_any_source_returns_the_sender(backend):
    dist.spawn(_any_source, args=(backend,), nprocs=3, timeout=machine.seconds(40, 400))


def _bfloat16_lists(rank):
    import torch

    dist.init_process_group("tcp", timeout=machine.seconds(10, 100))
    bf = torch.bfloat16
    out = torch.zeros(2, dtype=bf)
    dist.reduce_scatter(out, [torch.full((2,), i + 1.5, dtype=bf) for i in range(2)])
    assert out.tolist() == [rank * 2 + 3.0] * 2  # row `rank` from both ranks, summed
    got = [torch.zeros(1, dtype=bf) for _ in range(2)]
    dist.all_to_all(got, [torch.full((1,), rank * 10.0 + i, dtype=bf) for i in range(2)])
    assert [g.item() for g in got] == [rank, 10.0 + rank]
    dist.all_gather(got, torch.full((1,), rank + 0.5, dtype=bf))
    assert [g.item() for g in got] == [0.5, 1.5]
    dist.destroy_process_group()


def test_torch_bfloat16_lists():
    pytest.importorskip("torch", reason="torch is only compared against, not required")
    dist.spawn(_bfloat16_lists, nprocs=2, timeout=machine.seconds(40, 400))


def test_torch_tutorial_runs_unchanged():
    dist.spawn(_torch_tutorial, nprocs=2, timeout=machine.seconds(40, 400))


SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    import mwrt.distributed as dist
    dist.init_process_group("tcp", timeout=10)
    a = np.ones(3) * dist.get_rank()
    dist.all_reduce(a)
    print("sum", a[0], "local", __import__("os").environ["LOCAL_RANK"], flush=True)
    if len(sys.argv) > 1 and dist.get_rank() == int(sys.argv[1]):
        print("about to fail", flush=True)
        sys.exit(5)
    dist.barrier()
    dist.destroy_process_group()
""")


def _launch(tmp_path, *args):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT,
                                                                   os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "mwrt.distributed.launch", "--nproc-per-node",
                           "2", str(script), *args], capture_output=True, text=True, env=env,
                          timeout=machine.seconds(50, 500))


@pytest.mark.parametrize("given", [None, "3"])
def test_launcher_gives_each_rank_one_math_thread_unless_told(tmp_path, given):
    script = tmp_path / "threads.py"
    script.write_text("import os; print('threads', os.environ.get('OMP_NUM_THREADS'))\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update({"OMP_NUM_THREADS": given} if given else {})
    res = subprocess.run([sys.executable, "-m", "mwrt.distributed.launch", "--nproc-per-node",
                          "2", str(script)], capture_output=True, text=True, env=env,
                         timeout=machine.seconds(50, 500))
    assert res.stdout.count(f"threads {given or 1}") == 2, res.stdout + res.stderr
    assert ("OMP_NUM_THREADS=1 for each rank" in res.stderr) == (given is None)


def test_launcher_runs_ranks_with_prefixed_output(tmp_path):
    res = _launch(tmp_path)
    assert res.returncode == 0, res.stderr
    assert "[rank 0] sum 1.0 local 0" in res.stdout and "[rank 1] sum 1.0 local 1" in res.stdout
    assert "not an mwrt setting" not in res.stderr  # the launcher's own MWRT_RESTART_COUNT


def test_launcher_reports_a_failing_rank(tmp_path):
    res = _launch(tmp_path, "1")
    assert res.returncode == 5
    assert "rank 1" in res.stderr and "exited with code 5" in res.stderr
    assert "[rank 1] about to fail" in res.stderr


@pytest.mark.quick
def test_launcher_reads_slurm_variables():
    from mwrt.distributed.launch import _parse, plan
    from mwrt.store.launchers import first_host

    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_NODELIST": "gpu[03-04]", "SLURM_JOB_ID": "77"}
    (e,) = plan(_parse(["x.py"]), env)
    assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == ("5", "8", "1", "4")
    assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("gpu03", "29577")
    assert first_host("a1,b2") == "a1"


@pytest.mark.quick
def test_launcher_refuses_counts_that_start_nothing():
    from mwrt.distributed.launch import _parse, plan

    for args in (["--nproc-per-node", "0"], ["--nnodes", "2", "--node-rank", "2",
                                             "--master-port", "29500"]):
        with pytest.raises(SystemExit, match="need --nproc-per-node >= 1"):
            plan(_parse([*args, "x.py"]), {})


def _is_spmd(name: str) -> bool:
    with open(os.path.join(ROOT, "examples", name)) as f:
        return "init_master_worker" not in f.read()


# Every SPMD example, and one master-worker example: under the launcher each rank of a
# master-worker script is a master with its own local workers, so one shows that two such
# masters side by side keep apart; each runs as a user runs it in tests/project/test_examples_mw.py.
EXAMPLES = sorted(f for f in os.listdir(os.path.join(ROOT, "examples"))
                  if f.endswith(".py") and (_is_spmd(f) or f == "quickstart.py"))


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs_under_the_launcher(example):
    if example.startswith("torch_"):
        pytest.importorskip("torch", reason="torch is an optional extra (pip install mwrt[torch])")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT,
                                                                   os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-m", "mwrt.distributed.launch", "--nproc-per-node",
                          "2", os.path.join(ROOT, "examples", example)], capture_output=True,
                         text=True, env=env, timeout=machine.seconds(50, 500), cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[rank 0]" in res.stdout


def _async_then_objects(rank, backend):
    dist.init_process_group(backend, timeout=machine.seconds(20, 200))
    big = np.full(1 << 20, rank + 1.0)
    work = dist.all_reduce(big, async_op=True)
    objects = [None] * dist.get_world_size()
    dist.all_gather_object(objects, {"rank": rank})  # before the wait: runs after it, in order
    box = [rank]
    dist.broadcast_object_list(box, src=1)
    work.wait()
    assert objects == [{"rank": r} for r in range(dist.get_world_size())] and box == [1]
    assert (big == 3.0).all()
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
def test_an_object_collective_waits_for_a_pending_async_one(backend):
    dist.spawn(_async_then_objects, args=(backend,), nprocs=2, timeout=machine.seconds(60, 600))

"""Checkpoints written by the workers: round trips, snapshots, crashes mid-save, damage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tests.master.test_gpu import gpu  # noqa: F401  (fixture)

import mwrt

CASES = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "f64_T": np.arange(6.0).reshape(2, 3).T,  # not contiguous
    "f16": np.array([1.5, -2], np.float16),
    "c64": np.array([1 + 2j], np.complex64),
    "c128": np.array([[1 - 1j, 2j]], np.complex128),
    "i8": np.array([-128, 127], np.int8),
    "u64": np.array([2**64 - 1], np.uint64),
    "i64_0d": np.array(7),
    "bool": np.array([True, False]),
    "empty": np.zeros((2, 0), np.int32),
}


def _placed() -> dict:
    """CASES on alternating nodes."""
    out = {}
    for i, (name, value) in enumerate(CASES.items()):
        with mwrt.node(i % 2):
            out[name] = mwrt.dist_send(value)
    return out


def test_save_and_load_round_trip_every_dtype_and_shape(cluster, tmp_path):
    handle = mwrt.save(tmp_path, _placed())
    assert handle.done() and os.path.exists(tmp_path / "manifest.json")
    loaded = mwrt.load(tmp_path)
    assert set(loaded) == set(CASES)
    for i, (name, expected) in enumerate(CASES.items()):
        got = loaded[name]
        assert got.get_node() == i % 2, name
        assert (got.shape, got.dtype) == (expected.shape, expected.dtype), name
        value = got.numpy()
        assert (value.shape, value.dtype) == (expected.shape, expected.dtype), name
        np.testing.assert_array_equal(value, expected, err_msg=name)


def test_other_tools_read_the_files(cluster, tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    with mwrt.node(1):
        t = mwrt.dist_send(CASES["f32"])
    mwrt.save(tmp_path, {"w": t})
    found = safetensors.load_file(str(tmp_path / "generation-1" /
                                      "node1-device-1.safetensors"))
    np.testing.assert_array_equal(found["w"], CASES["f32"])


def test_load_onto_one_node(cluster, tmp_path):
    mwrt.save(tmp_path, _placed())
    loaded = mwrt.load(tmp_path, node=0)
    assert {t.get_node() for t in loaded.values()} == {0}
    np.testing.assert_array_equal(loaded["c128"].numpy(), CASES["c128"])
    assert set(mwrt.load(tmp_path, names=["bool"])) == {"bool"}


def test_a_background_save_keeps_what_was_there_when_it_was_called(cluster, tmp_path):
    w = mwrt.dist_send(np.zeros(1000))
    handle = mwrt.save(tmp_path, {"w": w}, wait=False)
    for _ in range(5):
        w += 1  # the program goes on; the save has its own snapshot
    handle.wait()
    np.testing.assert_array_equal(mwrt.load(tmp_path)["w"].numpy(), np.zeros(1000))
    np.testing.assert_array_equal(w.numpy(), np.full(1000, 5.0))


def test_background_saves_to_one_folder_follow_each_other(cluster, tmp_path):
    w = mwrt.dist_send(np.zeros(100_000))
    for _ in range(4):  # each save waits for the one before it, whose manifest it reads
        w += 1
        handle = mwrt.save(tmp_path, {"w": w}, wait=False)
    handle.wait()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["generation"] == 4
    np.testing.assert_array_equal(mwrt.load(tmp_path)["w"].numpy(), np.full(100_000, 4.0))


def test_older_generations_are_removed_and_the_last_two_kept(cluster, tmp_path):
    w = mwrt.dist_send(np.zeros(3))
    for step in range(4):
        w += 1
        mwrt.save(tmp_path, {"w": w})
    assert sorted(os.listdir(tmp_path)) == ["generation-3", "generation-4", "manifest.json"]
    np.testing.assert_array_equal(mwrt.load(tmp_path)["w"].numpy(), np.full(3, 4.0))


def _files(folder) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.glob("generation-*/*"))


def test_a_place_a_save_leaves_out_has_its_older_files_removed_too(cluster, tmp_path):
    with mwrt.node(0):
        a = mwrt.dist_send(np.arange(3.0))
    with mwrt.node(1):
        b = mwrt.dist_send(np.arange(4.0))
    for _ in range(2):
        mwrt.save(tmp_path, {"a": a, "b": b})
    mwrt.save(tmp_path, {"a": a + 1})  # node 1's generation-1 file goes; generation 2 stays
    assert _files(tmp_path) == ["generation-2/node0-device-1.safetensors",
                                "generation-2/node1-device-1.safetensors",
                                "generation-3/node0-device-1.safetensors"]
    mwrt.save(tmp_path, {"a": a + 2, "b": b})
    assert _files(tmp_path) == ["generation-3/node0-device-1.safetensors",
                                "generation-4/node0-device-1.safetensors",
                                "generation-4/node1-device-1.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["generation-3", "generation-4", "manifest.json"]
    loaded = mwrt.load(tmp_path)
    np.testing.assert_array_equal(loaded["a"].numpy(), np.arange(3.0) + 2)
    np.testing.assert_array_equal(loaded["b"].numpy(), np.arange(4.0))


def test_a_killed_saves_file_that_no_manifest_lists_is_removed_by_later_saves(cluster,
                                                                              tmp_path):
    """A save of {a on node 0, b on node 1} killed after node 1 wrote its file but before
    the manifest (the manifest put back here, as the kill leaves it) leaves a file no manifest
    lists; saves of {a} alone remove it once it is older than what the manifest in place
    replaces, and nothing else of the folder that a save did not write."""
    with mwrt.node(0):
        a = mwrt.dist_send(np.arange(3.0))
    with mwrt.node(1):
        b = mwrt.dist_send(np.arange(4.0))
    mwrt.save(tmp_path, {"a": a, "b": b})  # generation 1
    manifest = (tmp_path / "manifest.json").read_bytes()
    mwrt.save(tmp_path, {"a": a, "b": b})  # generation 2, killed before its manifest:
    (tmp_path / "manifest.json").write_bytes(manifest)
    (tmp_path / "generation-2" / "node0-device-1.safetensors").unlink()  # node 0 not yet
    foreign = ["generation-1/notes.txt", "generation-1/node1-device-1.safetensors.bak",
               "generation-9x/node1-device-1.safetensors", "node1-device-1.safetensors"]
    for name in foreign:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("not a save's")
    orphan = "generation-2/node1-device-1.safetensors"
    for _ in range(3):  # generations 2 (again), 3 and 4: not older than what 1, 2, 3 replace
        mwrt.save(tmp_path, {"a": a})
        assert orphan in _files(tmp_path)
    mwrt.save(tmp_path, {"a": a + 1})  # generation 5 replaces 4: older than that goes
    assert _files(tmp_path) == ["generation-1/node1-device-1.safetensors.bak",
                                "generation-1/notes.txt",
                                "generation-4/node0-device-1.safetensors",
                                "generation-5/node0-device-1.safetensors",
                                "generation-9x/node1-device-1.safetensors"]
    assert all((tmp_path / name).read_text() == "not a save's" for name in foreign)
    np.testing.assert_array_equal(mwrt.load(tmp_path)["a"].numpy(), np.arange(3.0) + 1)

def test_damaged_files_are_named_and_the_session_goes_on(cluster, tmp_path):
    with mwrt.node(1):
        w = mwrt.dist_send(np.arange(5))
    mwrt.save(tmp_path, {"w": w})
    part = tmp_path / "generation-1" / "node1-device-1.safetensors"
    data = bytearray(part.read_bytes())
    data[-1] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(mwrt.RemoteError, match=r"node1-device-1.safetensors: tensor 'w' fails "
                                               r"its checksum"):
        mwrt.load(tmp_path)
    part.write_bytes(bytes(data[:20]))
    with pytest.raises(mwrt.RemoteError, match="truncated"):
        mwrt.load(tmp_path)
    part.unlink()
    with pytest.raises(mwrt.RemoteError, match="checkpoint file missing"):
        mwrt.load(tmp_path)
    np.testing.assert_array_equal((w + 1).numpy(), np.arange(1, 6))
    with pytest.raises(FileNotFoundError, match="no checkpoint there"):
        mwrt.load(tmp_path / "nowhere")


def test_bad_arguments_are_named(cluster, tmp_path):
    with pytest.raises(TypeError, match="expected a DistributedTensor"):
        mwrt.save(tmp_path, {"w": np.zeros(2)})
    with pytest.raises(TypeError, match="non-empty dict"):
        mwrt.save(tmp_path, {})
    with pytest.raises(ValueError, match="tensor names"):
        mwrt.save(tmp_path, {"__metadata__": mwrt.zeros(1)})


_SAVER = textwrap.dedent("""
    import itertools, sys, numpy as np, mwrt
    mwrt.init_master_worker(local_workers=2)
    path = sys.argv[1]
    with mwrt.node(1):
        big = mwrt.zeros(8_000_000)
    mwrt.save(path, {"w": mwrt.dist_send(np.full(4, 1.0)), "big": big})
    print("saved", flush=True)
    for step in itertools.count(2):  # every other save leaves node 1 out
        w = mwrt.dist_send(np.full(4, float(step)))
        mwrt.save(path, {"w": w, "big": big} if step % 2 else {"w": w})
""")


@pytest.mark.timeout(120)
def test_a_master_killed_mid_save_leaves_a_whole_checkpoint(cluster, tmp_path):
    saver = subprocess.Popen([sys.executable, "-c", _SAVER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert saver.stdout.readline().strip() == "saved"
        time.sleep(np.random.default_rng().uniform(0.05, 0.5))
    finally:
        saver.send_signal(signal.SIGKILL)
        saver.wait(30)
        saver.stdout.close()
    loaded = mwrt.load(tmp_path)
    generation = json.loads((tmp_path / "manifest.json").read_text())["generation"]
    assert loaded["w"].numpy()[0] == generation
    assert ("big" in loaded) == (generation % 2 == 1)
    if "big" in loaded:
        assert loaded["big"].shape == (8_000_000,)
    kept = {f"generation-{g}" for g in (generation - 1, generation, generation + 1)}
    assert {f.split("/")[0] for f in _files(tmp_path)} <= kept  # one save removed the rest


@pytest.mark.slow  # saves and loads hundreds of MiB
def test_long_saves_and_loads_show_their_progress(tmp_path):
    pytest.importorskip("tqdm", reason="the bar is tqdm's where it is installed")
    script = textwrap.dedent("""
        import sys, mwrt
        mwrt.init_master_worker(local_workers=2)
        with mwrt.node(1):
            t = mwrt.ones(1000)
        mwrt.save(sys.argv[1], {"t": t, "u": mwrt.zeros(10)})
        mwrt.load(sys.argv[1])
    """)
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, MWRT_PROGRESS_AFTER="0"))
    assert res.returncode == 0, res.stderr
    for what in ("mwrt.save", "mwrt.load"):
        assert what in res.stderr, res.stderr
    assert "starting local workers" not in res.stderr  # 2 are too few to report (8 are not)


def test_progress_on_a_terminal_without_tqdm(monkeypatch):
    import io

    from mwrt.master import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for name in ("tqdm", "tqdm.auto"):  # as if not installed
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setenv("MWRT_PROGRESS_AFTER", "0")
    with progress.Progress(3 << 20, "mwrt.save /x") as bar:
        bar.update(1 << 20)
        bar.update(2 << 20)
    assert sys.stderr.getvalue().endswith("\rmwrt.save /x: 3.0 MiB of 3.0 MiB\n")


def test_sharded_tensors_are_saved_by_block_and_resharded_on_load(cluster, tmp_path):
    rows = np.arange(15.0).reshape(5, 3)
    m = mwrt.mesh()
    x = mwrt.dist_send(rows, mesh=m, shard=0)  # 3 + 2 rows
    w = mwrt.dist_send(np.arange(3.0), mesh=m)  # replicated: written once
    total = x.sum(0)  # Partial: its value is saved
    mwrt.save(tmp_path, {"x": x, "w": w, "total": total, "plain": mwrt.ones(2)})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [len(manifest["sharded"][n]["blocks"]) for n in ("x", "w", "total")] == [2, 1, 1]
    back = mwrt.load(tmp_path)
    assert set(back) == {"x", "w", "total", "plain"}
    assert back["x"].placement == mwrt.Shard(0) and back["x"].mesh == m
    assert [s.shape for s in back["x"].shards()] == [(3, 3), (2, 3)]
    np.testing.assert_array_equal(back["x"].numpy(), rows)
    np.testing.assert_array_equal(back["w"].numpy(), np.arange(3.0))
    np.testing.assert_array_equal(back["total"].numpy(), rows.sum(0))
    assert [s.get_node() for s in back["w"].shards()] == [0, 1]
    one = mwrt.mesh(nodes=[0])
    onto_one = mwrt.load(tmp_path, mesh=one, names=["x"])["x"]
    assert onto_one.mesh == one and len(onto_one.shards()) == 1
    np.testing.assert_array_equal(onto_one.numpy(), rows)
    swapped = mwrt.mesh(nodes=[1, 0])  # the blocks change places, worker to worker
    x2 = mwrt.load(tmp_path, mesh=swapped, names=["x"])["x"]
    assert [s.get_node() for s in x2.shards()] == [1, 0]
    np.testing.assert_array_equal(x2.numpy(), rows)
    grid = mwrt.mesh({"a": 1, "b": 2})  # another rank of mesh: rows along its first dim
    np.testing.assert_array_equal(mwrt.load(tmp_path, mesh=grid, names=["x"])["x"].numpy(),
                                  rows)


def test_gpu_tensors_are_saved_and_loaded_on_their_gpus(gpu, tmp_path):
    """On the fake GPU always, and on CuPy where CUDA exists (tests/master/test_gpu.py's fixture,
    which ends the module's cluster: this test comes last)."""
    with mwrt.node(1):
        w = mwrt.dist_send(CASES["f32"]).cuda(1 if mwrt.device_count(1) > 1 else 0)
    host = mwrt.dist_send(CASES["c128"])
    handle = mwrt.save(tmp_path, {"w": w, "host": host}, wait=False)
    w += 1  # after the snapshot: not saved
    handle.wait()
    loaded = mwrt.load(tmp_path)
    assert (loaded["w"].get_node(), loaded["w"].get_device()) == (1, w.get_device())
    np.testing.assert_array_equal(loaded["w"].numpy(), CASES["f32"])
    np.testing.assert_array_equal(loaded["host"].numpy(), CASES["c128"])

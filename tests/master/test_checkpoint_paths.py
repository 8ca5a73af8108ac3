"""A checkpoint's manifest reaches no file outside its folder (issue 35, item 1).

Checkpoints are shared and downloaded, so everything a manifest names is an attacker's to
choose: a `replaces` the next save removes, a `file` a load reads, a link planted where a
save writes, a header length. Each attack below leaves the file outside untouched and gets
an error naming the manifest's entry and the bad path; a header is bounded before it is read.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest
from tests.worker.test_quotas import MiB, status

import mwrt
from mwrt import tensorfile
from mwrt.master.cluster import current

PART = "generation-1/node0-device-1.safetensors"


@pytest.fixture(scope="module")
def cluster():
    """One local daemon whose tensors are at most 1 MiB."""
    mwrt.shutdown()
    before = os.environ.get("MWRT_MAX_TENSOR_BYTES")
    os.environ["MWRT_MAX_TENSOR_BYTES"] = str(MiB)
    try:
        mwrt.init_master_worker(local_workers=1, timeout=30)
    finally:
        if before is None:
            del os.environ["MWRT_MAX_TENSOR_BYTES"]
        else:
            os.environ["MWRT_MAX_TENSOR_BYTES"] = before
    yield mwrt
    mwrt.shutdown()


@pytest.fixture
def saved(cluster, tmp_path):
    """(checkpoint folder, its tensor w, a file beside the folder): one save done."""
    folder = tmp_path / "ckpt"
    w = mwrt.dist_send(np.arange(4.0))
    mwrt.save(folder, {"w": w})
    victim = tmp_path / "vdir" / "v2.txt"
    victim.parent.mkdir()
    victim.write_text("keep me")
    return folder, w, victim


def _edit(folder, **entry) -> None:
    """Change tensor w's manifest entry as a downloaded checkpoint might."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["tensors"]["w"].update(entry)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _outside_paths(victim) -> list:
    return ["../vdir/v2.txt", str(victim), "generation-1/../../vdir/v2.txt"]


def test_a_sweep_of_older_files_removes_none_the_checkpoint_in_place_reads(saved):
    folder, w, _ = saved
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["generation"] = 50  # a copied checkpoint's: its files are of generation 1
    (folder / "manifest.json").write_text(json.dumps(manifest))
    mwrt.save(folder, {"w": w + 1})  # generation 51: the files of 49 and older may go
    assert (folder / PART).exists()  # read by the checkpoint in place while it was saved
    np.testing.assert_array_equal(mwrt.load(folder)["w"].numpy(), np.arange(1.0, 5.0))


def test_a_sweep_of_older_files_follows_no_link(saved):
    folder, w, victim = saved
    planted = victim.parent / "node0-device-1.safetensors"
    planted.write_text("keep me")
    os.symlink(victim.parent, folder / "generation-0")
    os.symlink(planted, folder / "generation-1" / "node7-device-1.safetensors")
    for _ in range(3):  # generation 4 removes what is older than 2
        mwrt.save(folder, {"w": w})
    assert not (folder / "generation-1").exists() and (folder / "generation-0").is_symlink()
    assert planted.read_text() == "keep me" and victim.read_text() == "keep me"

@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("key", ["replaces", "file"])
def test_a_save_removes_no_file_a_manifest_names_outside_its_folder(saved, which, key):
    folder, w, victim = saved
    bad = _outside_paths(victim)[which]
    _edit(folder, **{key: bad})
    for _ in range(2):  # `file` becomes the next save's `replaces`: it would go a save later
        with pytest.raises(ValueError, match=r"tensor 'w' names a file .*" + key + " "
                                             + repr(bad).replace(".", r"\.")):
            mwrt.save(folder, {"w": w})
    assert victim.read_text() == "keep me"


def test_a_save_removes_only_files_a_save_wrote(saved):
    folder, w, _ = saved
    (folder / "notes.txt").write_text("mine")
    _edit(folder, replaces="notes.txt")
    with pytest.raises(ValueError, match="replaces 'notes.txt', expected one like"):
        mwrt.save(folder, {"w": w})
    assert (folder / "notes.txt").read_text() == "mine"


def _edit_replaces(folder, replaces) -> None:
    """Set the manifest's list of the files the next save removes."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["replaces"] = replaces
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_save_removes_no_file_the_manifests_list_names_outside_its_folder(saved):
    folder, w, victim = saved
    for bad in _outside_paths(victim):
        _edit_replaces(folder, [bad])
        with pytest.raises(ValueError, match=r"manifest.json: the manifest names a file .* "
                                             r"\(got replaces " + repr(bad).replace(".", r"\.")):
            mwrt.save(folder, {"w": w})
    assert victim.read_text() == "keep me"


def test_a_save_removes_no_file_the_checkpoint_in_place_reads(saved):
    folder, w, _ = saved
    _edit_replaces(folder, [PART])  # the file of generation 1, which its manifest reads
    mwrt.save(folder, {"w": w + 1})
    assert (folder / PART).exists()
    np.testing.assert_array_equal(mwrt.load(folder)["w"].numpy(), np.arange(1.0, 5.0))


@pytest.mark.parametrize("which", range(3))
def test_a_load_reads_no_file_outside_its_folder(saved, which):
    folder, _, victim = saved
    shutil.copy(folder / PART, victim)  # a good part file, but not the checkpoint's
    bad = _outside_paths(victim)[which]
    _edit(folder, file=bad)
    with pytest.raises(ValueError, match=r"manifest.json: tensor 'w' names a file outside the "
                                         r"checkpoint's folder \(got file " +
                                         repr(bad).replace(".", r"\.")):
        mwrt.load(folder)


@pytest.mark.parametrize("linked", ["file", "folder"])
def test_a_load_follows_no_link(saved, linked):
    folder, w, victim = saved
    outside = victim.parent
    shutil.copy(folder / PART, outside / "x.safetensors")
    if linked == "file":
        os.symlink(outside / "x.safetensors", folder / "generation-1" / "x.safetensors")
        _edit(folder, file="generation-1/x.safetensors")
        at = "'x.safetensors'"
    else:
        os.symlink(outside, folder / "elsewhere")
        _edit(folder, file="elsewhere/x.safetensors")
        at = "'elsewhere'"
    with pytest.raises(mwrt.RemoteError, match=r"the file of tensor 'w' passes through a "
                                               r"symbolic link \(got " + at):
        mwrt.load(folder)
    np.testing.assert_array_equal((w + 1).numpy(), np.arange(1.0, 5.0))  # the session goes on


def test_a_save_writes_through_no_planted_link(saved):
    folder, w, victim = saved
    pid = current().local[0].process.pid
    (folder / "generation-2").mkdir()
    name = "node0-device-1.safetensors"
    os.symlink(victim, folder / "generation-2" / f"{name}.partial-{pid}")
    os.symlink(victim, folder / "generation-2" / name)
    mwrt.save(folder, {"w": w + 10})
    assert victim.read_text() == "keep me"
    assert not os.path.islink(folder / "generation-2" / name)
    np.testing.assert_array_equal(mwrt.load(folder)["w"].numpy(), np.arange(10.0, 14.0))
    os.symlink(victim.parent, folder / "generation-3")  # a folder of the next save, linked
    with pytest.raises(mwrt.RemoteError, match=r"passes through a symbolic link \(got "
                                               r"'generation-3' -> "):
        mwrt.save(folder, {"w": w})
    assert sorted(os.listdir(victim.parent)) == ["v2.txt"]


def test_a_header_length_is_bounded_before_it_is_read(saved):
    folder, w, _ = saved
    part = folder / PART
    with open(part, "r+b") as f:  # a sparse file as long as the header it announces
        f.write(struct.pack("<Q", 64 * MiB))
        f.truncate(64 * MiB + 8)
    pid = current().local[0].process.pid
    before = status(pid, "VmHWM")
    with pytest.raises(mwrt.RemoteError, match=r"load of 'w' from .*node0-device-1.safetensors: "
                                               r"tensor of 67108864 bytes \(its header\) "
                                               r"exceeds the limit of 1048576 bytes"):
        mwrt.load(folder)
    assert status(pid, "VmHWM") - before < 32 * MiB  # refused, not read
    with open(part, "r+b") as f:  # past what the format allows, whatever the quota
        f.write(struct.pack("<Q", 3 << 30))
        f.truncate((3 << 30) + 8)
    with pytest.raises(mwrt.RemoteError, match=r"header of 3221225472 bytes \(expected at most "
                                               r"100000000"):
        mwrt.load(folder)
    assert status(pid, "VmHWM") - before < 32 * MiB
    np.testing.assert_array_equal((w + 1).numpy(), np.arange(1.0, 5.0))


def test_the_manifest_itself_is_read_through_no_link(saved, tmp_path):
    folder, w, victim = saved
    elsewhere = tmp_path / "elsewhere.json"  # a manifest of another folder's choosing
    os.replace(folder / "manifest.json", elsewhere)
    os.symlink(elsewhere, folder / "manifest.json")
    for run in (lambda: mwrt.load(folder), lambda: mwrt.save(folder, {"w": w})):
        with pytest.raises(ValueError, match=r"manifest.json: its manifest passes through a "
                                             r"symbolic link \(got 'manifest.json' -> "):
            run()
    assert os.path.islink(folder / "manifest.json") and victim.read_text() == "keep me"
    os.mkfifo(folder / "fifo")  # neither a link nor a file: refused, not waited on
    os.replace(folder / "fifo", folder / "manifest.json")
    with pytest.raises(ValueError, match="its manifest is not a regular file"):
        mwrt.load(folder)


def test_a_gpu_tensors_host_staging_is_sized_before_it_is_made(tmp_path):
    """A tensor loaded onto a GPU is read into host memory first: the manifest's shape is held
    to MWRT_MAX_TENSOR_BYTES there before it is. Its own cluster (a fake GPU's worker), so it
    comes last in this module."""
    mwrt.shutdown()
    env = {"MWRT_FAKE_GPUS": "1", "MWRT_FAKE_GPU_BYTES": str(256 * MiB),
           "MWRT_MAX_TENSOR_BYTES": str(MiB)}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the local worker inherits it
    try:
        mwrt.init_master_worker(local_workers=1, timeout=30)
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.update({name: value})
    try:
        big = np.zeros(8 * MiB, np.uint8)  # 8 MiB: a fake GPU's to hold, not the host's
        (crc,) = tensorfile.write(str(tmp_path), PART, {"w": big})
        (tmp_path / "manifest.json").write_text(json.dumps({
            "format": "mwrt-checkpoint", "version": 1, "generation": 1, "files": [PART],
            "tensors": {"w": {"dtype": "|u1", "shape": [big.size], "where": [0, 0],
                              "file": PART, "replaces": None, "crc32": crc}}}))
        pid = current().local[0].process.pid
        before = status(pid, "VmHWM")
        with pytest.raises(mwrt.RemoteError, match=r"load of 'w' from .*: tensor of 8388608 "
                                                   r"bytes \(uint8\[8388608\], read into host "
                                                   r"memory before the device\) exceeds the "
                                                   r"limit of 1048576 bytes"):
            mwrt.load(tmp_path)
        assert status(pid, "VmHWM") - before < 4 * MiB  # refused, not read
        small = mwrt.dist_send(np.arange(4.0)).cuda()  # the session goes on, and loads fit
        mwrt.save(tmp_path / "small", {"s": small})
        back = mwrt.load(tmp_path / "small")["s"]
        assert back.get_device() == 0
        np.testing.assert_array_equal(back.numpy(), np.arange(4.0))
    finally:
        mwrt.shutdown()

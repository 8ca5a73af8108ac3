"""Checkpoints across simulated hosts: each host writes and reads its own disk."""

from __future__ import annotations

import sys
import textwrap

import pytest
from tests.support.hosts import hosts3  # noqa: F401  (fixture)
from tests.hosts.test_hosts_mw import keyed_workers, master_env

pytestmark = pytest.mark.timeout(180)

MASTER = textwrap.dedent("""
    import os, sys, numpy as np, mwrt
    mwrt.init_master_worker()
    path = sys.argv[1]
    saved = {}
    for i in range(2):
        with mwrt.node(i):
            saved[f"t{i}"] = mwrt.dist_send(np.arange(5.0) + i)
    mwrt.save(path, saved)
    back = mwrt.load(path)
    for name, t in saved.items():
        assert back[name].get_node() == t.get_node(), name
        assert (back[name].numpy() == t.numpy()).all(), name
    print("master sees", sorted(os.listdir(path)), flush=True)
    try:
        mwrt.load(path, node=0)
    except mwrt.RemoteError as exc:
        print("node 0 cannot read node 1's disk:", "checkpoint file missing" in str(exc))
    print("ok", flush=True)
""")


def test_each_host_writes_its_own_disk(hosts3, tmp_path):
    disk = tmp_path / "ckpt"
    disk.mkdir()
    for host in hosts3:  # the same path, a private tmpfs on each host
        host.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], timeout=10)
    keyed_workers(hosts3, tmp_path)
    script = tmp_path / "master.py"
    script.write_text(MASTER)
    res = hosts3[0].run([sys.executable, str(script), str(disk)],
                        env=master_env(hosts3, tmp_path), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "master sees ['manifest.json']" in res.stdout, res.stdout
    assert "node 0 cannot read node 1's disk: True" in res.stdout, res.stdout
    assert res.stdout.rstrip().endswith("ok")
    for host, node in ((hosts3[1], 0), (hosts3[2], 1)):
        listing = host.run(["ls", "-R", str(disk)], timeout=10).stdout
        assert f"node{node}-device-1.safetensors" in listing, listing
        assert f"node{1 - node}-device-1.safetensors" not in listing, listing

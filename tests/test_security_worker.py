"""What one master leaves on a worker cannot reach the next, and keys others could read are
refused (issue 27, items 8 and 9)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import start_worker, stop_worker
from test_quotas import finish, master_process

import mwrt
from mwrt.errors import AuthError
from mwrt.protocol.auth import keygen, load_key_file

# The same source in each master, so the shipped bytes are the same: module state kept on
# the worker between them would show as a count above 1.
COUNTING = """
SEEN = []
def count(t):
    SEEN.append(1)
    return t * len(SEEN)
print("COUNT", float(mwrt.remote(count)(mwrt.ones(1))), float(mwrt.remote(count)(mwrt.ones(1))))
"""


def test_shipped_functions_are_not_shared_across_masters(keyed_worker):
    _, address, master_key = keyed_worker
    outs = [finish(master_process(address, COUNTING, env={"MWRT_KEY_FILE": master_key}))
            for _ in range(3)]
    for out in outs:  # within a master its state lives on (1 then 2); never across masters
        assert "COUNT 1.0 2.0" in out, out[-2000:]


def _worker(key_file: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mwrt.worker", "--listen", "127.0.0.1:0",
                           "--key-file", key_file], capture_output=True, text=True, timeout=30)


def test_a_key_file_others_may_read_is_refused_with_the_fix(tmp_path):
    worker_key, master_key = keygen(str(tmp_path / "keys"))
    for path in (worker_key, master_key):
        os.chmod(path, 0o644)
    refused = _worker(worker_key)
    assert refused.returncode != 0 and f"chmod 600 {worker_key}" in refused.stderr, refused
    with pytest.raises(AuthError, match=r"others may read or change it \(mode 0644"):
        mwrt.init_master_worker(["127.0.0.1:1"], key=master_key, timeout=5)
    os.chmod(master_key, 0o640)
    with pytest.raises(AuthError, match="chmod 600"):
        load_key_file(master_key)
    os.chmod(master_key, 0o600)
    assert load_key_file(master_key).path == master_key


def test_a_key_in_a_directory_anyone_may_write_is_refused(tmp_path):
    worker_key, _ = keygen(str(tmp_path / "keys"))
    os.chmod(tmp_path / "keys", 0o777)
    try:
        refused = _worker(worker_key)
        assert refused.returncode != 0 and "writable by anyone" in refused.stderr, refused
        assert f"chmod o-w {tmp_path / 'keys'}" in refused.stderr
        os.chmod(tmp_path / "keys", 0o1777)  # sticky, as /tmp: others cannot replace the file
        process, _ = start_worker("--key-file", worker_key)
        stop_worker(process)
    finally:
        os.chmod(tmp_path / "keys", 0o700)

"""The master-worker examples run as a user would run them, and say what they promise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("name, expected", [
    ("quickstart.py", "matches NumPy: True"),
    ("mw_remote.py", "issued at:"),
    ("mw_collectives.py", "all_reduce on node 2: [6. 6. 6. 6.]"),
    ("mw_streams_events.py", "node 0 after node 1's event: [ 1.  2.  5. 10.]"),
    ("mw_numpy_functions.py", "t @ inv(t) is the identity: True"),
    ("mw_array_api.py", "same result on NumPy and on node 1: True"),
    # the loss of data_parallel_training.py, eager and captured
    ("mesh_training.py", "captured: final loss 0.00010; same weights as eager: True"),
    ("mesh_kmeans.py", "centres found within 0.2 of the truth: True"),
    ("mw_checkpoint.py", "same weights as the run that lost nothing: True"),
])
def test_example_runs(name, expected):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT,
                                                                     os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name)],
                            capture_output=True, text=True, timeout=90, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert expected in result.stdout

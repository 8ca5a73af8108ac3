"""The suite's parallel run (pyproject.toml's -n auto --dist loadgroup, tests/conftest.py): the
tests of a module where any test uses a module-scoped fixture run in one process, so the
fixture's daemons start once, and a test that uses them without naming the fixture finds
them."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = '''
import os
import pytest

@pytest.fixture(scope="module")
def shared():
    return os.getpid()

@pytest.mark.parametrize("case", range(8))
def test_shares(shared, case):
    assert shared == os.getpid()

def test_alone():  # finds the module's cluster running, as some tests do
    pass
'''


@pytest.mark.slow  # a pytest and two pytest-xdist processes start
def test_a_modules_tests_that_share_a_fixture_run_in_one_process(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-c", os.devnull, "--rootdir", str(tmp_path), "-n", "2", "--dist", "loadgroup", "-v",
         str(tmp_path / "test_probe.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
            ROOT, os.environ.get("PYTHONPATH")]))))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ran = re.findall(r"\[(gw\d+)\].*PASSED .*::(test_shares\[\d\]|test_alone)", res.stdout)
    assert len(ran) == 9, res.stdout[-3000:]
    assert len({process for process, _ in ran}) == 1, ran

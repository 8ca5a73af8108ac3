"""A notebook run by a real Jupyter kernel (nbclient, ipykernel): an error a cell's op raises on
the worker names that cell as IPython does ("Cell In[3], line 4") with its source line, in
"issued at" and in the worker's traceback, not the kernel's temporary file."""

from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip("nbformat", reason="needs nbformat (pip install mwrt[test])")
nbclient = pytest.importorskip("nbclient", reason="needs nbclient (pip install mwrt[test])")
pytest.importorskip("ipykernel", reason="needs ipykernel, the Python kernel (mwrt[test])")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CELLS = [
    "import mwrt, numpy as np\nmwrt.init_master_worker(timeout=30)",
    "x = mwrt.ones(3)",
    "def bad(a):\n    return a.reshape(7)\n\ny = mwrt.remote(bad)(x)",
    "y.numpy()",
    "import time\nmwrt.remote(lambda a: print('hello from node 0') or a)(x).numpy()\n"
    "time.sleep(1)  # forwarded by a thread of the kernel's, soon after",
    "mwrt.shutdown()",
]


@pytest.mark.timeout(180)
def test_a_failing_cell_is_named_as_ipython_names_it(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [
        ROOT, os.environ.get("PYTHONPATH")])))  # the kernel imports this checkout's mwrt
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            allow_errors=True).execute()
    errors = [(i, out) for i, cell in enumerate(nb.cells) for out in cell.get("outputs", [])
              if out.get("output_type") == "error"]
    assert [i for i, _ in errors] == [3], errors  # only y.numpy() fails, where it waits
    text = errors[0][1]["evalue"]
    assert errors[0][1]["ename"] == "RemoteValueError", text  # a RemoteError and a ValueError
    assert "issued at: Cell In[3], line 4 in <module>\n    y = mwrt.remote(bad)(x)" in text, text
    assert "Cell In[3], line 2, in bad\n    return a.reshape(7)" in text, text
    assert "ipykernel_" not in text, text
    shown = "".join(out.get("text", "") for out in nb.cells[4].get("outputs", []))
    assert "(node 0) hello from node 0\n" in shown, nb.cells[4].get("outputs")  # under its cell

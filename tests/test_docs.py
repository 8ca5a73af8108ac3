"""The documentation site (docs/, Sphinx): it builds with no warning, its API reference has
every public name, and every Python block of its pages runs as written, each as a script in
a fresh process (the master-worker ones start their own local daemons, as the quickstart)."""

from __future__ import annotations

import glob
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

import mwrt
import mwrt.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
TOOLS = ("sphinx", "furo", "myst_parser")
MISSING = [name for name in TOOLS if importlib.util.find_spec(name) is None]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks() -> list:
    """(page, index, code) of every ```python block under docs/."""
    found = []
    for path in sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)):
        page = os.path.relpath(path, DOCS)
        for index, match in enumerate(BLOCK.finditer(pathlib.Path(path).read_text())):
            found.append(pytest.param(match.group(1), id=f"{page}#{index}"))
    return found


OPTIONAL = {"torch": "'mwrt[torch]'", "sklearn": "scikit-learn array-api-compat",
            "scipy": "scipy"}


@pytest.mark.parametrize("code", blocks())
def test_a_block_of_the_docs_runs(code, tmp_path):
    for module, install in OPTIONAL.items():  # what a guide may show but mwrt never needs
        if f"import {module}" in code and importlib.util.find_spec(module) is None:
            pytest.skip(f"the block needs {module} (pip install {install})")
    script = tmp_path / "block.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240, check=False)
    assert res.returncode == 0, f"the block failed:\n{code}\n{res.stdout[-2000:]}" \
                                f"{res.stderr[-4000:]}"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once with warnings as errors: (returncode, output, html folder)."""
    if MISSING:
        pytest.skip(f"needs the docs tools {MISSING} (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    res = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                          "html", DOCS, str(out)], capture_output=True, text=True,
                         timeout=600, cwd=ROOT, check=False)
    return res.returncode, res.stdout + res.stderr, out


def test_the_site_builds_without_warnings(site):
    code, output, _ = site
    assert code == 0 and "WARNING" not in output, output[-5000:]


@pytest.mark.parametrize("module, page", [(mwrt, "mwrt"), (mwrt.distributed, "distributed")])
def test_the_reference_has_every_public_name(site, module, page):
    html = (site[2] / "reference" / f"{page}.html").read_text()
    shown = set(re.findall(rf'id="(?:module-)?{re.escape(module.__name__)}\.(\w+)"', html))
    assert not set(module.__all__) - shown, sorted(set(module.__all__) - shown)


def test_every_error_class_has_its_troubleshooting_entry():
    """docs/troubleshooting.md has a section per error class of mwrt.errors."""
    import mwrt.errors

    text = pathlib.Path(DOCS, "troubleshooting.md").read_text()
    classes = [name for name, obj in vars(mwrt.errors).items()
               if isinstance(obj, type) and issubclass(obj, Exception)]
    missing = [name for name in classes if f"## `{name}`" not in text]
    assert not missing, missing


def test_the_developing_page_names_every_layer():
    """docs/developing.md's table of layers names every package tests/test_layers.py knows."""
    from test_layers import LAYERS

    text = pathlib.Path(DOCS, "developing.md").read_text()
    table = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in LAYERS if name != "__init__" and
               not re.search(rf"[`\s]{re.escape(name)}[`\s]", table)]
    assert not missing, f"add these packages to the layers table: {missing}"


def test_the_performance_page_names_every_benchmark():
    """docs/performance.md says how to run each file of benchmarks/."""
    text = pathlib.Path(DOCS, "performance.md").read_text()
    missing = [os.path.basename(path) for path in
               glob.glob(os.path.join(ROOT, "benchmarks", "bench_*.py"))
               if f"benchmarks/{os.path.basename(path)}" not in text]
    assert not missing, f"add these benchmarks to docs/performance.md: {missing}"


def test_the_readme_keeps_its_two_commands_and_links_to_pages_that_exist():
    """The README is a first visit: the two commands as written, and links into docs/."""
    readme = pathlib.Path(ROOT, "README.md").read_text()
    for command in ("    pip install . && python examples/quickstart.py",
                    "    pip install -e '.[test]' && python -m pytest -q"):
        assert command + "\n" in readme, command
    broken = [link for link in re.findall(r"\]\((docs/[^)#]+)", readme)
              if not os.path.exists(os.path.join(ROOT, link))]
    assert not broken, broken

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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
TOOLS = ("sphinx", "furo", "myst_parser")
MISSING = [name for name in TOOLS if importlib.util.find_spec(name) is None]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks() -> list:
    """(page, index, code) of every ```python block under docs/, and of the README."""
    found = []
    pages = [os.path.join(ROOT, "README.md"),
             *sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))]
    for path in pages:
        page = os.path.relpath(path, DOCS if path.startswith(DOCS + os.sep) else ROOT)
        for index, match in enumerate(BLOCK.finditer(pathlib.Path(path).read_text())):
            found.append(pytest.param(match.group(1), id=f"{page}#{index}"))
    return found


OPTIONAL = {"torch": "'mwrt[torch]'", "sklearn": "scikit-learn array-api-compat",
            "scipy": "scipy"}


def run_block(code: str, folder) -> subprocess.CompletedProcess:
    """`code` run as a script of its own in a fresh process, in `folder`."""
    script = folder / "block.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, str(script)], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=240, check=False)
    assert res.returncode == 0, f"the block failed:\n{code}\n{res.stdout[-2000:]}" \
                                f"{res.stderr[-4000:]}"
    return res


@pytest.mark.parametrize("code", blocks())
def test_a_block_of_the_docs_runs(code, tmp_path):
    for module, install in OPTIONAL.items():  # what a guide may show but mwrt never needs
        if f"import {module}" in code and importlib.util.find_spec(module) is None:
            pytest.skip(f"the block needs {module} (pip install {install})")
    run_block(code, tmp_path)


@pytest.mark.parametrize("page, printed", [
    ("README.md", r"\[\[[-\d. e\n\[\]]+\]\]"),  # z: 20 rows of 20 floats
    ("docs/getting-started.md", r"\[[-\d. e]+\]\n10\.0"),  # z[0, :3], then a.sum()
])
def test_the_first_example_prints_what_its_page_says(page, printed, tmp_path):
    """The README's example and getting started's first master print what their comments
    say: z's values, then 10.0, computed on node 1."""
    code = BLOCK.search(pathlib.Path(ROOT, page).read_text()).group(1)
    out = run_block(code, tmp_path).stdout
    assert re.fullmatch(printed + r"\n", out), out
    if page == "README.md":
        assert len(re.findall(r"\d\.\d", out)) == 400, out


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


def test_the_creation_functions_signatures_read_short(site):
    """zeros/ones/empty/rand/randn show dtype as DTypeLike, not NumPy's ~500 characters of
    private protocols that the alias expands to."""
    html = (site[2] / "reference" / "mwrt.html").read_text()
    for name in ("zeros", "ones", "empty", "rand", "randn"):
        found = re.search(rf'<dt class="sig sig-object py" id="mwrt\.{name}">(.*?)</dt>', html,
                          re.DOTALL)
        assert found, name
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", found.group(1)))
        assert len(text) < 250 and "DTypeLike" in text, (name, len(text), text)


def _members(module):
    """(name, object) of every public name of `module` and every public member of its
    classes."""
    import inspect

    for name in module.__all__:
        obj = getattr(module, name)
        yield f"{module.__name__}.{name}", obj
        if inspect.isclass(obj):
            for attr in dir(obj):
                static = inspect.getattr_static(obj, attr)
                if not attr.startswith("_") and (isinstance(static, property)
                                                 or callable(getattr(obj, attr))):
                    yield (f"{module.__name__}.{name}.{attr}",
                           static if isinstance(static, property) else getattr(obj, attr))


def test_every_public_member_has_a_docstring():
    """help() and the reference say what each public function, class, method and property
    does (an override takes its base's docstring)."""
    import inspect

    missing = [name for module in (mwrt, mwrt.distributed) for name, obj in _members(module)
               if not isinstance(obj, (int, float, str, dict, tuple)) and not inspect.getdoc(obj)]
    assert not missing, missing


def test_every_error_mwrt_exports_is_an_mwrt_error():
    """The errors page says `except mwrt.MwrtError` catches every mwrt error (PlacementError
    was only a ValueError)."""
    errors = [getattr(m, n) for m in (mwrt, mwrt.distributed) for n in m.__all__
              if isinstance(getattr(m, n), type) and issubclass(getattr(m, n), Exception)
              and not issubclass(getattr(m, n), Warning)]
    assert [e.__name__ for e in errors if not issubclass(e, mwrt.MwrtError)] == []
    assert issubclass(mwrt.PlacementError, ValueError)


def test_every_error_class_has_its_troubleshooting_entry():
    """docs/troubleshooting.md has a section per error class of mwrt.errors."""
    import mwrt.errors

    text = pathlib.Path(DOCS, "troubleshooting.md").read_text()
    classes = [name for name, obj in vars(mwrt.errors).items()
               if isinstance(obj, type) and issubclass(obj, Exception)]
    missing = [name for name in classes if f"## `{name}`" not in text]
    assert not missing, missing


def test_the_developing_page_names_every_layer():
    """docs/developing.md's table of layers names every package tests/project/test_layers.py knows."""
    from tests.project.test_layers import LAYERS

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


@pytest.mark.parametrize("run", ["examples/torch_ddp.py", "-c import mwrt.torch"])
def test_without_torch_the_install_line_is_given(run):
    """The torch example and mwrt.torch, where torch is missing, say how to install it."""
    code = ("import sys; sys.modules['torch'] = None; import mwrt.torch" if run.startswith("-c")
            else f"import sys, runpy; sys.modules['torch'] = None; "
                 f"runpy.run_path({os.path.join(ROOT, run)!r}, run_name='__main__')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode != 0 and "pip install 'mwrt[torch]'" in done.stderr, done.stderr

"""Sphinx's settings for mwrt's documentation site: `sphinx-build -W docs docs/_build`."""

from __future__ import annotations

import os
import sys
from typing import ClassVar

from sphinx.util.docutils import SphinxDirective

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the checkout's mwrt, not an installed one

project = "mwrt"
author = "the mwrt developers"
copyright = "2026, the mwrt developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "mwrt"
myst_heading_anchors = 3
# The reference: signatures with their type hints; one-line docstrings read as prose.
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
# Annotations by the names the code writes (DTypeLike expanded is ~500 characters of NumPy's
# private protocols in every creation function's signature).
autodoc_type_aliases = {name: name for name in ("DTypeLike", "ArrayLike", "Shape", "ShardArg")}
autodoc_default_options = {"members": True, "undoc-members": True}
suppress_warnings = ["myst.xref_missing"]  # links to files of the repository, not pages
# Docstrings are written as Markdown-ish prose: `x` is code, and * or | is an operator.
default_role = "code"


def _escape(line: str) -> str:
    """RST's inline markup characters outside `code`, escaped (a docstring's `a * b`)."""
    parts = line.split("`")
    for i in range(0, len(parts), 2):  # even parts are outside backticks
        parts[i] = parts[i].replace("\\", "\\\\").replace("*", "\\*").replace("|", "\\|")
    return "`".join(parts)


def _docstring(app, what, name, obj, options, lines) -> None:
    lines[:] = [_escape(line) for line in lines]


class Settings(SphinxDirective):
    """`mwrt-settings`: the table of mwrt.config.SETTINGS (variable, default, meaning), as
    Markdown: the pages are MyST, and so is what a directive parses."""

    def run(self) -> list:
        from mwrt import config

        rows = ["| variable | default | meaning |", "|---|---|---|"]
        for setting in config.SETTINGS.values():
            doc = setting.doc.replace("|", "\\|")
            rows.append(f"| `{setting.env}` | `{setting.default!r}` | {doc} |")
        return self.parse_text_to_nodes("\n".join(rows))


class Others(SphinxDirective):
    """`mwrt-others MODULE`: the names of MODULE.__all__ autodoc's automodule leaves out,
    modules (their docstring) and constants (their value), so a new one needs no edit here."""

    required_arguments = 1
    option_spec: ClassVar[dict] = {"skip": lambda text: text.split()}

    def run(self) -> list:
        import importlib
        import inspect

        name = self.arguments[0]
        module = importlib.import_module(name)
        data, modules = [], []
        for member in module.__all__:
            value = getattr(module, member)
            if member in self.options.get("skip", ()):
                continue
            if inspect.ismodule(value):  # after the constants: automodule moves the context
                modules += [f"## `{value.__name__}`", "", "```{eval-rst}",
                            f".. automodule:: {value.__name__}", "   :no-members:", "```", ""]
            elif not (inspect.isclass(value) or callable(value)):
                data += ["```{eval-rst}", f".. py:data:: {name}.{member}",
                         f"   :value: {value!r}", "```", ""]
        return self.parse_text_to_nodes("\n".join(data + modules))


class Examples(SphinxDirective):
    """`mwrt-examples`: every file of examples/ with the first paragraph of its docstring."""

    def run(self) -> list:
        import ast
        import glob

        rows = []
        for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))):
            with open(path) as f:
                doc = ast.get_docstring(ast.parse(f.read())) or ""
            summary = " ".join(doc.split("\n\n")[0].split())
            rows.append(f"- `examples/{os.path.basename(path)}`: {summary}")
        return self.parse_text_to_nodes("\n".join(rows))


def setup(app) -> None:
    app.connect("autodoc-process-docstring", _docstring)
    app.add_directive("mwrt-settings", Settings)
    app.add_directive("mwrt-examples", Examples)
    app.add_directive("mwrt-others", Others)

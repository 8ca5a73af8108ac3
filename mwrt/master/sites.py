"""Where the user's code is: the line that issued a command, a notebook cell's name, and the
files of functions shipped by value.

The master reports a worker's error at the user's line: the first frame outside mwrt when
the command was issued (found on every op, formatted on error only), a cell as IPython names
it, and a function that mwrt.remote shipped by value at its own file and line, which the
worker cannot know. Below the client (which formats errors) and remote.py (which ships the
functions).
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import threading
import types
import warnings
from collections import OrderedDict
from types import FrameType


def cell_name(filename: str) -> str | None:
    """IPython's name for the code of a notebook cell or console input ('Cell In[7]'),
    where the file is one of its temporary ones; None for any other file."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
        named = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:  # noqa: BLE001 - an IPython without the call: name the file instead
        return None
    return None if named is None else f"{named[0]} {named[1]}"


# Code shipped by value reaches the worker as "<dynamic-code>" (cloudpickle >= 3.1.3), so a
# worker's traceback cannot name its file; the master, which has the file, puts it back.
_SHIPPED: dict[str, set] = {}  # code name -> {(file, first line, last line)}
_DYNAMIC = re.compile(r'^(\s*)File "<dynamic-code>", line (\d+), in (\S+)$')


def remember_places(fn) -> None:
    """Note the file and lines of `fn`'s code and of the code defined inside it."""
    stack = [getattr(fn, "__code__", None)]
    while stack:
        code = stack.pop()
        if code is None:
            continue
        lines = [line for _, _, line in code.co_lines() if line is not None]
        _SHIPPED.setdefault(code.co_name, set()).add(
            (code.co_filename, min(lines, default=code.co_firstlineno),
             max(lines, default=code.co_firstlineno)))
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def restore_places(text: str) -> str:
    """A worker's traceback with each shipped function's file and source line put back."""
    if "<dynamic-code>" not in text:
        return text
    out = []
    for line in text.splitlines():
        found = _DYNAMIC.match(line)
        if found:
            indent, number, name = found.group(1), int(found.group(2)), found.group(3)
            place = next((path for path, first, last in sorted(_SHIPPED.get(name, ()))
                          if first <= number <= last), None)
            if place is not None:
                cell = cell_name(place)
                out.append(f'{indent}File "{place}", line {number}, in {name}' if cell is None
                           else f"{indent}{cell}, line {number}, in {name}")
                source = linecache.getline(place, number).strip()
                if source:
                    out.append(f"{indent}  {source}")
                continue
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


_REGISTRIES: dict[str, dict] = {}  # file -> the warnings registry of its lines (as a module's)
# Warnings issued lately: (id of the site, text) -> the site. One op's site is one tuple,
# shared by every place of a mesh op, and a new one (equal, but not the same) for each op
# issued: a mesh op whose places all warn warns once; a line issued twice, twice.
_ISSUED: OrderedDict[tuple, tuple] = OrderedDict()
_ISSUED_KEPT = 4096


def warn_at_sites(warned: list, site_of) -> None:
    """Issue NumPy's warnings from a worker ((command id, text) pairs) as RuntimeWarnings
    at the lines that issued the ops (`site_of(id)`: (code, line) or None), so that the
    master's filters, pytest.warns and np.errstate see them as NumPy's own."""
    for command_id, text in warned:
        site = site_of(command_id)
        if site is None:
            warnings.warn(text, RuntimeWarning, stacklevel=2)
            continue
        if _ISSUED.get((id(site), text)) is site:  # another place of the op said it already
            continue
        _ISSUED[id(site), text] = site  # kept alive: its id names no other site meanwhile
        if len(_ISSUED) > _ISSUED_KEPT:
            _ISSUED.popitem(last=False)
        code, line = site
        registry = _REGISTRIES.setdefault(code.co_filename, {})
        warnings.warn_explicit(text, RuntimeWarning, code.co_filename, line,
                               registry=registry)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SITES = 1 << 16  # issue sites remembered per id counter (a session's nodes share one)
SITE_MASK = SITES - 1


def issue_site() -> tuple | None:
    """(code, line) of the first caller outside mwrt: formatted by site_text() on error only."""
    pinned = _PINNED[0]
    if pinned is not None and _PINNED[1] == threading.get_ident():
        return pinned
    return _outside(sys._getframe(2))


def _outside(frame: FrameType | None) -> tuple | None:
    known = _IN_PACKAGE
    while frame is not None:
        name = frame.f_code.co_filename
        inside = known.get(name)
        if inside is None:
            inside = known[name] = name.startswith(_PACKAGE_DIR)
        if not inside:
            return line_of(frame.f_code, frame.f_lasti)
        frame = frame.f_back
    return None


def line_of(code: types.CodeType, lasti: int) -> tuple:
    """(code, line) of the instruction at byte offset `lasti`: a new tuple each time, as an
    op's site names that op alone (its warnings are told apart by it).

    A frame's f_lineno scans its code's line table from the start: 6 us at line 400 of a
    long script or cell, on every op. The instruction's offset is a field; its line is
    found once and kept, by the code's id (a code object hashes itself anew each time)."""
    known = _LINES.get((id(code), lasti))
    if known is None or known[0] is not code:
        line = next((n for start, end, n in code.co_lines() if start <= lasti < end), None)
        known = (code, code.co_firstlineno if line is None else line)
        if len(_LINES) >= _LINES_KEPT:
            _LINES.clear()
        _LINES[id(code), lasti] = known
    return (code, known[1])


_LINES: dict = {}  # (id(code), instruction offset) -> (code, line), the code kept alive
_LINES_KEPT = 1 << 16


# Whether a source file is mwrt's, by its name (a str caches its hash: a lookup costs less
# than startswith, and far less than a set of code objects, whose hash is computed anew).
_IN_PACKAGE: dict = {}


# The site every command a mesh op issues names, and the thread issuing it (a plain list:
# issue_site() reads it on every op, where a threading.local costs 0.5-3 us).
_PINNED: list = [None, 0]


def pin_site() -> bool:
    """Until unpin_site(), every command this thread issues names the line issuing now: a
    mesh op's commands at every place are one op (its places' warnings are issued once).
    False if a site is pinned already (this op's, nested; then unpin_site does nothing)."""
    if _PINNED[0] is not None:
        return False
    _PINNED[:] = [_outside(sys._getframe(1)), threading.get_ident()]
    return True


def unpin_site(pinned: bool) -> None:
    """End pin_site(), given what it returned."""
    if pinned:
        _PINNED[:] = [None, 0]


def site_text(site: tuple | str | None) -> str:
    """'file:line in function' of an issue_site() (a str is already that), '' if none; a
    notebook cell's code as IPython names it, with its source line."""
    if site is None or isinstance(site, str):
        return site or ""
    code, line = site
    cell = cell_name(code.co_filename)
    if cell is None:
        return f"{code.co_filename}:{line} in {code.co_name}"
    source = linecache.getline(code.co_filename, line).strip()
    return f"{cell}, line {line} in {code.co_name}" + (f"\n    {source}" if source else "")

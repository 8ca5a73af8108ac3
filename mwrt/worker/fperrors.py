"""NumPy's floating-point errors on a worker: the master's error state, and its warnings.

An op runs under the error state the master had when it issued it (np.errstate), carried
in its Call only when it differs from NumPy's default. Where NumPy would print a
RuntimeWarning on the worker's stderr ("divide by zero encountered in divide"), where no
one can catch or filter it, each thread that runs ops has NumPy call `_note` instead
("call" mode); the executor keeps what an op met and sends it with the next answer of its
stream, for the master to warn at the line that issued the op.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np

from ..arrays import ERROR_STATE

_KINDS = ("divide", "over", "under", "invalid")
# How the worker runs each of the master's modes: "warn" (and print, log, call, which act
# on the master's side) becomes noted; "raise" and "ignore" are NumPy's own.
_MODES = {"raise": "raise", "ignore": "ignore"}
_PER_THREAD = 64  # warnings kept per thread until claimed: a bound, however many ops warn
NOTED: dict[int, list] = {}  # thread id -> what NumPy met there ("divide by zero", ...)


def _note(err: str, flag: int) -> None:
    noted = NOTED.setdefault(threading.get_ident(), [])
    if len(noted) < _PER_THREAD:
        noted.append((err, False))


def note_in_this_thread() -> None:
    """Make NumPy note, not print, what it warns of in this thread (errstate is per thread),
    and its functions' RuntimeWarnings ("Mean of empty slice") too."""
    np.seterr(divide="call", over="call", invalid="call")
    np.seterrcall(_note)
    with _LOCK:
        _OP_THREADS.add(threading.get_ident())
        if warnings.showwarning is not _show:  # once a process, before any op runs
            _SHOWN.append(warnings.showwarning)
            warnings.showwarning = _show
            warnings.simplefilter("always", RuntimeWarning)  # each op's, as on the master


def _show(message, category, filename, lineno, file=None, line=None) -> None:
    """A RuntimeWarning in a thread that runs ops is noted for the master, whose filters
    decide, as its fp errors are; any other warning is printed as Python prints it."""
    thread = threading.get_ident()
    if issubclass(category, RuntimeWarning) and thread in _OP_THREADS:
        noted = NOTED.setdefault(thread, [])
        if len(noted) < _PER_THREAD:
            noted.append((str(message), True))
        return
    _SHOWN[0](message, category, filename, lineno, file, line)


_LOCK = threading.Lock()
_OP_THREADS: set = set()  # the threads that run ops (note_in_this_thread's)
_SHOWN: list = []  # Python's showwarning, for what is not an op's


def modes(state: dict) -> dict:
    """The master's error state (np.geterr()) as this worker runs it."""
    return {kind: _MODES.get(state[kind], "call") for kind in _KINDS if kind in state}


def state_object(state: dict):
    """NumPy 2's own object of the master's error state as this worker runs it, to set in
    NumPy's context variable (STATE.set): made once per state, where an np.errstate block
    costs 4.6 us an op (a loop in an np.errstate block sends the same state with every op).
    None on another NumPy: run the op under np.errstate(**modes(state))."""
    if STATE is None:
        return None
    key = tuple(state.items())
    found = _STATES.get(key)
    if found is None:
        with np.errstate(**modes(state)):
            found = STATE.get()  # (with _note as the callback: every thread's)
        if len(_STATES) < 64:  # a handful of states in a program
            _STATES[key] = found
    return found


STATE = ERROR_STATE  # NumPy's context variable of the error state (None: another NumPy)
_STATES: dict = {}  # the master's state, as items -> NumPy's object of the worker's modes


def claim(keep: list, command_id: int, op: str, limit: int) -> None:
    """Move what NumPy noted in this thread to `keep`, as (command id, warning text)."""
    noted = NOTED.pop(threading.get_ident(), None)
    ufunc = getattr(np, op.removesuffix("_"), None)  # NumPy names a ufunc by its own name
    name = ufunc.__name__ if isinstance(ufunc, np.ufunc) else op
    for text, whole in noted or ():
        if len(keep) < limit:
            keep.append((command_id, text if whole else f"{text} encountered in {name}"))

"""mwrt: a master-worker remote-tensor runtime.

The master (this script) holds DistributedTensor handles; the arrays live on worker
daemons. Every op returns at once; copies to the master are the sync points.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and editors read; at run time __getattr__ loads it
    from ._api import *  # noqa: F403

__version__ = "0.1.0"
# Packages whose use means a master: `mwrt.master.cluster` after a bare `import mwrt` finds
# the whole API loaded, as it did when this module imported it all.
_MASTER_SIDE = frozenset({"master", "dashboard", "array_api"})


def __getattr__(name: str) -> Any:
    """A submodule, or a name of the public API (mwrt/_api.py), loaded on first use: a
    worker daemon or an SPMD rank imports this package too, and never loads the master side."""
    if name.startswith("__") and name != "__all__":  # probes: __path__, __wrapped__...
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _MASTER_SIDE and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # `from . import config` too
    from . import _api

    names = globals()
    names.update((n, getattr(_api, n)) for n in _api.__all__)
    names["__all__"] = _api.__all__
    if name not in names:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return names[name]


def __dir__() -> list[str]:
    """The module's names and the public API's, loaded or not."""
    return sorted({*globals(), *__getattr__("__all__")})

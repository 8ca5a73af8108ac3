"""The internal layering holds, package by package: lower layers never import higher ones,
and nothing below the master imports the master side (so a daemon or an SPMD rank cannot
depend on master-only state).

    foundation  errors, config, arrays, netaddr, netio, procs
    protocol    messages, their codec, keys and handshakes        ops  the op registry
    store       key-value stores and rendezvous                   channels  bytes between ranks
    collective  process groups and the algorithms over channels
    distributed the torch-shaped SPMD facade                      worker  the daemon
    master      the user's side: cluster, tensors, streams, transfers
"""

from __future__ import annotations

import ast
import os

import mwrt

ROOT = os.path.dirname(os.path.abspath(mwrt.__file__))

FOUNDATION = {"errors", "config", "arrays", "netaddr", "netio", "procs"}
LAYERS = {**dict.fromkeys(FOUNDATION, 0),
          "protocol": 1, "ops": 1,
          "store": 2, "channels": 2,
          "collective": 3,
          "distributed": 4, "worker": 4,
          "master": 5, "__init__": 5}
# What each package may import besides the foundation and itself (None: anything lower).
ALLOWED = {
    "protocol": set(),
    "ops": set(),
    "store": {"protocol"},
    "channels": {"protocol"},
    "collective": {"channels", "store"},
    "distributed": None,
    "worker": None,
    "master": None,
}
# Known reaches across the rules, each to be removed: the shm channel's single-copy
# collectives still live in channels/ and use the collective layer's reductions.
EXCEPTIONS = {("channels.cma", "collective"), ("channels.cma_collectives", "collective")}


def _modules():
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield module.removesuffix(".__init__"), path, name == "__init__.py"


def _top(module: str) -> str:
    return module.split(".")[0]


def _imports(module: str, path: str, is_package: bool):
    """Top-level mwrt packages or modules that `module` imports (relative imports resolved)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            target = base + (node.module.split(".") if node.module else [])
            if target:
                yield target[0]
            else:
                yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mwrt."):
            yield node.module.split(".")[1]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mwrt."):
                    yield alias.name.split(".")[1]


def test_every_module_has_a_place():
    unplaced = {_top(m) for m, _, _ in _modules()} - set(LAYERS)
    assert not unplaced, f"give these modules a layer in tests/test_layers.py: {unplaced}"


def test_lower_layers_never_import_higher_ones():
    wrong = []
    for module, path, is_package in _modules():
        top = _top(module)
        if LAYERS[top] == 0 and module != top:
            continue
        for imported in set(_imports(module, path, is_package)) - {top} - FOUNDATION:
            allowed = ALLOWED.get(top)
            too_high = LAYERS.get(imported, 9) >= LAYERS[top] if top != "__init__" else False
            if (too_high or (allowed is not None and imported not in allowed)) and \
                    (module, imported) not in EXCEPTIONS:
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "layering broken:\n" + "\n".join(sorted(wrong))


def test_the_foundation_imports_only_itself():
    wrong = [f"{module} imports {imported}" for module, path, is_package in _modules()
             if module in FOUNDATION
             for imported in set(_imports(module, path, is_package)) - FOUNDATION]
    assert not wrong, "layering broken:\n" + "\n".join(wrong)


def test_the_root_holds_only_the_foundation_and_the_api():
    stray = sorted(name for name in os.listdir(ROOT) if name.endswith(".py")
                   and name[:-3] not in FOUNDATION | {"__init__"})
    assert not stray, f"put these modules in the package of their layer: {stray}"

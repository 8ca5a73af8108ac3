"""The internal layering holds: lower layers never import higher ones; workers never import
the master side (so a daemon cannot depend on master-only state)."""

from __future__ import annotations

import ast
import os

import mwrt

ROOT = os.path.dirname(os.path.abspath(mwrt.__file__))

LAYERS = {
    "errors": 0, "config": 0, "procs": 0, "netio": 0, "netaddr": 0,
    "arrays": 1, "wire": 1, "messages": 1, "auth": 1, "reduce_ops": 1, "ops": 1, "scratch": 1,
    "buffers": 1,
    "rendezvous": 2, "stores": 2, "tcp_store": 2, "channels": 2,
    "collectives": 3, "algorithms": 3, "group": 3, "agreement": 3,
    "distributed": 4, "worker": 4,
}
MASTER_SIDE = {"client", "cluster", "context", "creation", "heartbeat", "local", "profile",
               "remote", "streams", "tensor", "tensor_collectives", "transfer", "worker_api",
               "__init__"}


def _modules():
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, ROOT)[:-3].replace(os.sep, "."), path


def _top(module: str) -> str:
    return module.split(".")[0]


def _imports(module: str, path: str):
    """Top-level mwrt modules that `module` imports (relative imports resolved)."""
    package = module.split(".")[:-1] if not module.endswith("__init__") else module.split(".")[:-1]
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
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
    unplaced = {_top(m) for m, _ in _modules()} - set(LAYERS) - MASTER_SIDE
    assert not unplaced, f"give these modules a layer in tests/test_layers.py: {unplaced}"


def test_lower_layers_never_import_higher_ones():
    wrong = []
    for module, path in _modules():
        top = _top(module)
        if top not in LAYERS:
            continue
        for imported in _imports(module, path):
            if imported in MASTER_SIDE or LAYERS.get(imported, -1) > LAYERS[top]:
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "layering broken:\n" + "\n".join(wrong)

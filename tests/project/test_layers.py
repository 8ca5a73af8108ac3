"""The internal layering holds, package by package: lower layers never import higher ones,
and nothing below the master imports the master side (so a daemon or an SPMD rank cannot
depend on master-only state). Nor do modules reach around it by duck typing: a channel
never calls into a process group, the collective layer reads a channel's declared
capabilities instead of probing for them, and `_private` names stay in their module.

    foundation  errors, config, arrays, netaddr, netio, procs, tensorfile, staging, unkeyed
    protocol    messages, their codec, keys and handshakes        ops  the op registry
    store       key-value stores and rendezvous                   channels  bytes between ranks
    collective  process groups and the algorithms over channels
    distributed the torch-shaped SPMD facade                      worker  the daemon
    master      the user's side: cluster, tensors, streams, transfers (in layers of its
                own, MASTER_LAYERS below)
    dashboard   the live web page over the master's status() (cli above the master too)
    _api        the public API's names, which the package root loads on first use
    array_api   the Array API standard's namespace over the master's tensors
    torch       the "mwrt" backend for torch.distributed itself, and the names of the
                master's torch-handle constructors (mwrt.torch.zeros), loaded on first use
    testing     the fake GPU and fake NCCL: above everything, so that no module imports a
                test double (the settings name the fake GPU; arrays.gpu_module loads it)
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys

import mwrt

ROOT = os.path.dirname(os.path.abspath(mwrt.__file__))

FOUNDATION = {"errors", "config", "arrays", "netaddr", "netio", "procs", "tensorfile",
              "staging", "unkeyed"}
LAYERS = {**dict.fromkeys(FOUNDATION, 0),
          "protocol": 1, "ops": 1,
          "store": 2, "channels": 2,
          "collective": 3,
          "distributed": 4, "worker": 4,
          "master": 5, "__init__": 5, "_api": 5, "cli": 5,
          "dashboard": 6, "array_api": 6, "torch": 6,
          "testing": 7}
PACKAGE_ROOT = {"__init__", "_api"}  # the package root and the public API it loads on first use
# What each package may import besides the foundation and itself (None: anything lower).
ALLOWED = {
    "protocol": set(),
    "ops": set(),
    "store": {"protocol"},
    "channels": {"protocol"},
    "collective": {"channels", "store"},
    "distributed": None,
    "worker": None,
    "torch": None,
    "master": None,
    "cli": None,
    "dashboard": None,
    "array_api": None,
    "testing": None,
}
# Python's own underscored API, which any module may use.
STDLIB_PRIVATE = {"_exit", "_getframe"}
# torch's, which it names no other way: a tensor's version counter (bumped by in-place ops)
# and the base a view was made from (ops/torchmeta.py learns what a call writes and views).
TORCH_PRIVATE = {"_version", "_base"}


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
    for node in ast.walk(_tree(path)):
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
    assert not unplaced, f"give these modules a layer in tests/project/test_layers.py: {unplaced}"


def test_lower_layers_never_import_higher_ones():
    wrong = []
    for module, path, is_package in _modules():
        top = _top(module)
        if LAYERS[top] == 0 and module != top:
            continue
        for imported in set(_imports(module, path, is_package)) - {top} - FOUNDATION:
            allowed = ALLOWED.get(top)
            too_high = LAYERS.get(imported, 9) >= LAYERS[top] if top not in PACKAGE_ROOT else False
            if too_high or (allowed is not None and imported not in allowed):
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "layering broken:\n" + "\n".join(sorted(wrong))


def test_the_master_never_imports_the_worker():
    """What both sides use (the wire, staging's chunk tags and slots) lies below both."""
    wrong = [f"{module} imports worker" for module, path, is_package in _modules()
             if _top(module) == "master" and "worker" in set(_imports(module, path, is_package))]
    assert not wrong, "the master reaches into the daemon:\n" + "\n".join(wrong)


def _modules_above_the_worker(_array):
    """Run on a worker by mwrt.remote: the modules it loaded that the daemon must not need."""
    import sys

    import numpy

    above = ("mwrt.master", "mwrt.dashboard", "mwrt.array_api", "mwrt._api", "numpy.testing",
             "numpy.f2py", "asyncio", "http.server")
    loaded = sorted(m for m in sys.modules if m.startswith(above))
    return numpy.frombuffer(" ".join(loaded).encode() or b"-", numpy.uint8)


def test_a_worker_daemon_never_loads_the_master_side():
    """A daemon imports the package root, as every process of mwrt does, yet never the
    master, the dashboard or the Array API above it (the root loads its public names on
    first use), nor NumPy's testing and f2py, asyncio or http.server: ~0.5 s of imports
    each of the hundreds of daemons a test run starts would pay. Checked in a live daemon
    after ops and a shipped function."""
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=1, timeout=30)
    try:
        x = mwrt.arange(4.0)
        assert float((x * 2).sum()) == 12.0
        shipped = mwrt.remote(_ship_by_value(_modules_above_the_worker))(x)
        loaded = shipped.numpy().tobytes().decode()
    finally:
        mwrt.shutdown()
    assert loaded == "-", f"a worker daemon loaded: {loaded}"


def test_the_package_root_loads_its_names_on_first_use():
    """`import mwrt` loads no master module; the first `mwrt.NAME`, `mwrt.master` or `from
    mwrt import *` loads the whole API; `dir(mwrt)` and `mwrt.__all__` name it all; and the
    whole API loads none of the modules a start need not pay for (numpy.testing...)."""
    script = (
        "import sys, mwrt\n"
        "assert not [m for m in sys.modules if m.startswith(('mwrt.master', 'mwrt._api'))]\n"
        "assert {'zeros', 'FloatTensor', 'init_master_worker'} <= set(dir(mwrt))\n"
        "assert callable(mwrt.master.cluster.current)\n"  # a master package: the API loads
        "ns = {}\n"
        "exec('from mwrt import *', ns)\n"
        "assert set(mwrt.__all__) <= set(ns) and 'FloatTensor' in mwrt.__all__\n"
        "needless = ('numpy.testing', 'numpy.f2py', 'asyncio', 'http.server',\n"
        "            'importlib.metadata')\n"
        "assert not [m for m in needless if m in sys.modules], sorted(sys.modules)\n"
        "print('ok')\n")
    root = os.path.dirname(ROOT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def _ship_by_value(fn):
    """`fn` as a function of no module, so cloudpickle ships its code (a worker would
    otherwise import this test module to find it)."""
    import types

    return types.FunctionType(fn.__code__, {"__builtins__": __builtins__}, fn.__name__)


def test_the_foundation_imports_only_itself():
    wrong = [f"{module} imports {imported}" for module, path, is_package in _modules()
             if module in FOUNDATION
             for imported in set(_imports(module, path, is_package)) - FOUNDATION]
    assert not wrong, "layering broken:\n" + "\n".join(wrong)


def test_the_root_holds_only_the_foundation_and_the_api():
    stray = sorted(name for name in os.listdir(ROOT) if name.endswith(".py")
                   and name[:-3] not in FOUNDATION | PACKAGE_ROOT)
    assert not stray, f"put these modules in the package of their layer: {stray}"


# -- import circles, and the master's own layers -------------------------------------------

# master/'s layers, lowest first: a module imports its own layer and those below, never one
# above; inside a layer the modules stand in some order too (no circles, tested below). No
# module binds names into another while the program runs (tested below): a lower module that
# must make a handle makes it of its operands' class (Handle.results) or of a class it is given.
MASTER_LAYERS = [
    ("connection", {"limits", "progress", "sites", "waits", "batches", "replies", "client",
                    "forked", "local", "heartbeat", "replacement",
                    "cluster"}),  # the nodes, their sockets and daemons
    ("places", {"context", "ordering", "streams", "queries", "methods", "mesh.device_mesh",
                "mesh.placement", "mesh.plan"}),  # where new work goes, and in which order
    ("verbs", {"handle", "issue", "collectives", "transfer", "inplace", "mesh", "mesh.fetch",
               "mesh.groups", "mesh.moves", "mesh.shapes", "mesh.rules", "mesh.fallback",
               "mesh.twophase", "mesh.slicing", "mesh.runs", "mesh.regroup", "mesh.setting",
               "mesh.sorting", "mesh.selecting", "mesh.products", "mesh.einsums",
               "mesh.dispatch", "remote", "arrayfunc", "flat", "mesh.naming", "layout", "torchissue",
               "torchgrad", "torchacross", "torchmeshgrad", "torchutils",
               "torchmesh"}),  # a handle's fields, and the ops, copies and moves it issues
    ("handles", {"tensorreads", "tensor", "mesh.mesh_creation", "creation", "reattach", "mesh.saving",
                 "torchtensor", "torchcreation", "torchmodule", "torchmeshmodule",
                 "torchfsdp"}),
    ("programs", {"graph", "profile", "checkpoint", ""}),  # "": master/__init__.py
]


def _module_imports(module: str, path: str, is_package: bool):
    """The mwrt modules `module` imports, anywhere in the file ("a.b" for mwrt/a/b.py,
    "__init__" for the package root): `from .x import name` counts x.name where that is a
    module."""
    known = {m for m, _, _ in _modules()}
    package = [] if module == "__init__" else (
        module.split(".") if is_package else module.split(".")[:-1])
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and (node.level or
                                                 (node.module or "").startswith("mwrt")):
            base = package[:len(package) - node.level + 1] if node.level else []
            names = (node.module or "").split(".") if node.module else []
            target = base + (names if node.level else names[1:])
            for alias in node.names:
                yield _known(".".join([*target, alias.name]), known)
        elif isinstance(node, ast.Import):
            yield from (_known(".".join(a.name.split(".")[1:]), known)
                        for a in node.names if a.name.startswith("mwrt"))


def _known(name: str, known: set) -> str:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or "__init__"


def _circles() -> list[list[str]]:
    """The import circles among mwrt's modules (strongly connected sets of more than one)."""
    edges = {m: set(_module_imports(m, p, pkg)) - {m} for m, p, pkg in _modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part: list[str] = []
            while not part or part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_anywhere():
    """Each module imports only what stands below it (imports inside functions count, and
    the package root is a module like any other): a reader can tell what depends on what. A
    name a lower module needs moves down: ops' registry, worker/tensors.py, testing/fakecuda.py."""
    circles = _circles()
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def _master_layer(module: str) -> int:
    name = module.removeprefix("master").removeprefix(".")
    for i, (_, names) in enumerate(MASTER_LAYERS):
        if name in names:
            return i
    raise AssertionError(f"{module}: give it a layer in MASTER_LAYERS (tests/project/test_layers.py)")


def test_the_master_imports_only_downward():
    """connection < places < verbs < handles < programs: see MASTER_LAYERS."""
    wrong = []
    for module, path, is_package in _modules():
        if _top(module) != "master":
            continue
        for imported in set(_module_imports(module, path, is_package)) - {module}:
            if _top(imported) == "master" and _master_layer(imported) > _master_layer(module):
                wrong.append(f"{module} ({MASTER_LAYERS[_master_layer(module)][0]}) imports "
                             f"{imported} ({MASTER_LAYERS[_master_layer(imported)][0]})")
    assert not wrong, ("master/ imports upward; move the name down, or pass it in:\n"
                       + "\n".join(sorted(wrong)))


def test_the_layers_above_the_foundation_never_import_the_package_root():
    """mwrt/__init__.py is the public API over everything: a module that needs a name
    imports it from where it is defined (the cli, above the master, may use the API)."""
    wrong = sorted(f"{module} imports the package root" for module, path, is_package
                   in _modules() if module not in ("__init__", "cli") and _top(module) != "cli"
                   and "__init__" in set(_module_imports(module, path, is_package)))
    assert not wrong, "\n".join(wrong)


# Code bound into a module of another package, or of a lower layer of the master, while the
# program runs, which no import shows: the one left, by its caller and the binder it calls.
# mwrt.array_api, above the master, gives tensors their Array API namespace: its functions
# make tensors, and a tensor's __array_namespace__() returns it, so each needs the other;
# loading it by name from tensor.py would hide the edge from the circle check, not remove it.
CODE_BINDING_ALLOWED = {("array_api", "master.tensor.set_array_namespace")}


def _late_bindings(module: str, tree: ast.AST):
    """Where `module` assigns into another module's attributes or an imported class's
    (`other.name = ...`, `Class.name = ...`, setattr(other, ...)), or binds names through a
    table (unbound()/bind() up-calls, a module-level list filled from outside, an install()
    that sets a class's methods)."""
    modules = {m.rpartition(".")[2] for m in _listed()}  # mwrt's, by their last name
    imported = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
                if (isinstance(node, ast.ImportFrom) and (node.level or (
                    node.module or "").startswith("mwrt"))) or (
                    isinstance(node, ast.Import) and node.names[0].name.startswith("mwrt"))
                for alias in node.names if alias.name.rpartition(".")[2] in modules}
    imported |= {local for local, (source, name) in _imported_names(module, tree).items()
                 if name in _classes(_listed().get(source, (None,))[0])}  # and classes
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                    target.value.id in imported:
                yield node.lineno, f"assigns {ast.unparse(target)}"
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute) \
                    and isinstance(target.value.value, ast.Name) and \
                    target.value.value.id in imported:
                yield node.lineno, f"assigns into {ast.unparse(target.value)}"
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            last = name.rpartition(".")[2]
            if last == "setattr" and node.args and isinstance(node.args[0], ast.Name) and \
                    node.args[0].id in imported:
                yield node.lineno, f"setattr on {node.args[0].id}"
            elif last in ("unbound", "install"):
                yield node.lineno, f"binds through {name}()"
            elif last == "bind" and "upcalls" in name:
                yield node.lineno, f"binds through {name}()"
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" and \
                len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and \
                node.args[1].value in ("_sharded",):
            yield node.lineno, f"reads the marker {node.args[1].value!r} by duck typing"


def test_no_module_binds_names_into_another_while_running():
    """Every edge is an import a reader (and test_no_import_circles_anywhere) can see: no
    up-call tables, no module attributes patched from outside, no methods installed on a
    class from another module, no duck-typed marker attributes."""
    wrong = [f"{module}:{line} {what}" for module, path, _ in _modules()
             for line, what in _late_bindings(module, _tree(path))]
    assert not wrong, ("late binding (import the name from below instead, or pass it in):\n"
                       + "\n".join(sorted(wrong)))


def _imported_names(module: str, tree: ast.AST) -> dict:
    """{local name: (mwrt module, None)} of the modules `module` imports by name, and
    {local name: (mwrt module, name)} of the names it takes from them."""
    known = _listed()
    package = [] if module == "__init__" else (
        module.split(".") if known.get(module, (0, False))[1] else module.split(".")[:-1])
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or
                                                 (node.module or "").startswith("mwrt")):
            base = package[:len(package) - node.level + 1] if node.level else []
            parts = (node.module or "").split(".") if node.module else []
            target = ".".join(base + (parts if node.level else parts[1:])) or "__init__"
            for alias in node.names:
                full = f"{target}.{alias.name}".removeprefix("__init__.")
                names[alias.asname or alias.name] = (full, None) if full in known else (
                    target, alias.name)
    return names


@functools.cache
def _listed() -> dict:
    """{module: (path, is_package)} of every mwrt module."""
    return {m: (p, pkg) for m, p, pkg in _modules()}


@functools.cache
def _classes(path: str | None) -> frozenset:
    """The classes a module defines at its top level."""
    return frozenset() if path is None else frozenset(
        n.name for n in _tree(path).body if isinstance(n, ast.ClassDef))


def _binders() -> set:
    """(module, function) of each module-level function that keeps an argument in its
    module's state: stores a parameter in a module-level name (global, item or attribute,
    a container's append/add/update/setdefault/extend/insert, setattr)."""
    found = set()
    for module, path, _ in _modules():
        tree = _tree(path)
        state = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                 if isinstance(t, ast.Name)}
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef) and _keeps(fn, state):
                found.add((module, fn.name))
    return found


def _keeps(fn: ast.FunctionDef, state: set) -> bool:
    """True if fn stores one of its parameters in module-level state (`state`, or a name it
    declares global)."""
    params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    nodes = list(ast.walk(fn))
    kept = {name for g in nodes if isinstance(g, ast.Global) for name in g.names}
    return any(_stores(node, params, kept, state) for node in nodes)


def _stores(node: ast.AST, params: set, kept: set, state: set) -> bool:
    def uses(value) -> bool:
        return any(isinstance(x, ast.Name) and x.id in params for x in ast.walk(value))
    if isinstance(node, ast.Assign) and uses(node.value):
        return any((isinstance(t, ast.Name) and t.id in kept) or (
            isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name)
            and t.value.id in state) for t in node.targets)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Name) and node.func.value.id in state and \
            node.func.attr in ("append", "add", "update", "setdefault", "extend", "insert"):
        return any(uses(a) for a in node.args)
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
        node.func.id == "setattr" and any(uses(a) for a in node.args[2:])


def _code_bindings():
    """(caller, line, binder) of each call that passes code (a module, a lambda, or a
    function or class the caller defines) to a binder (_binders) of another package, or of
    a lower layer of the master: the caller's code, kept below it, called from there."""
    binders = _binders()
    for module, path, is_package in _modules():
        tree = _tree(path)
        names = _imported_names(module, tree)
        defined = {n.name for n in tree.body
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and names.get(func.id, (0, None))[1] is not None:
                target = names[func.id]
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                    func.value.id in names and names[func.value.id][1] is None:
                target = (names[func.value.id][0], func.attr)
            else:
                continue
            if target not in binders or not _across(module, target[0]):
                continue
            if any(_is_code(a, defined, names) for a in
                   [*node.args, *(k.value for k in node.keywords)]):
                yield module, node.lineno, ".".join(target)


def _across(caller: str, binder: str) -> bool:
    """True if `binder`'s module is in another package than `caller`, or in a lower layer
    of the master."""
    if _top(caller) != _top(binder):
        return True
    return _top(caller) == "master" and _master_layer(binder) < _master_layer(caller)


def _is_code(arg: ast.AST, defined: set, names: dict) -> bool:
    if isinstance(arg, ast.Lambda) or (isinstance(arg, ast.Name) and (
            arg.id in defined or names.get(arg.id, (0, 0))[1] is None)):
        return True
    return isinstance(arg, ast.Subscript) and ast.unparse(arg.value) == "sys.modules"


def test_no_module_binds_code_into_a_lower_one_but_the_one_named():
    """A function that keeps its argument in module state (a registry, a hook), called
    from another package or a higher layer of the master with code (a module, a function,
    a class, a lambda), is an up-call table whatever its name; CODE_BINDING_ALLOWED names
    the one left, which must be found exactly once."""
    found = [(caller, line, binder) for caller, line, binder in _code_bindings()]
    wrong = [f"{caller}:{line} binds code through {binder}()" for caller, line, binder in found
             if (_top(caller), binder) not in CODE_BINDING_ALLOWED]
    assert not wrong, ("code bound into a lower module (import the name from below instead, "
                       "or pass it in):\n" + "\n".join(sorted(wrong)))
    used = [(_top(caller), binder) for caller, _, binder in found]
    for allowed in CODE_BINDING_ALLOWED:
        assert used.count(allowed) == 1, (f"{allowed} is bound {used.count(allowed)} times, "
                                          "expected once: remove it from "
                                          "CODE_BINDING_ALLOWED, or bind it in one place")


def test_the_code_binding_check_sees_a_binder_by_its_effect():
    """Any name: a function of a lower module that keeps an argument, called with code."""
    lower = ast.parse("_HOOKS = []\n_ONE = [None]\n\ndef hook(fn):\n    _HOOKS.append(fn)\n\n"
                      "def point(m):\n    _ONE[0] = m\n\ndef pure(x):\n    return x\n")
    fns = [n for n in lower.body if isinstance(n, ast.FunctionDef)]
    state = {"_HOOKS", "_ONE"}
    kept = {fn.name for fn in fns if _keeps(fn, state)}
    assert kept == {"hook", "point"}
    assert _is_code(ast.parse("sys.modules[__name__]").body[0].value, set(), {})
    assert _is_code(ast.parse("lambda: 1").body[0].value, set(), {})
    assert not _is_code(ast.parse("x + 1").body[0].value, set(), {})


def test_the_late_binding_check_sees_each_mechanism():
    """The check above fails on each way the master's circles were once hidden."""
    samples = {
        "from . import dispatch\ndispatch.ShardedTensor = object\n": "assigns",
        "from . import tensor\ntensor._ARRAY_API[0] = 1\n": "assigns into",
        "from .upcalls import unbound\ncall = unbound('call', 'issue')\n": "binds through",
        "from . import upcalls, tensor\nupcalls.bind(tensor, call=1)\n": "binds through",
        "from . import methods\nmethods.install(object, print)\n": "binds through",
        "from .tensor import DistributedTensor\nDistributedTensor.x = 1\n": "assigns",
        "from . import tensor\nsetattr(tensor, 'x', 1)\n": "setattr",
        "x = getattr(object(), '_sharded', False)\n": "marker",
    }
    for source, what in samples.items():
        found = list(_late_bindings("master.sample", ast.parse(source)))
        assert found and what in found[0][1], (source, found)


# -- duck-typed reaches ----------------------------------------------------------------------


@functools.cache  # every test walks every module: parse each once (read, never changed)
def _tree(module_path: str) -> ast.AST:
    with open(module_path) as f:
        return ast.parse(f.read())


def _package_modules(top: str):
    return [(m, p) for m, p, _ in _modules() if _top(m) == top]


def _methods(top: str, classes=None) -> set[str]:
    """Names of the functions and methods defined in package `top` (or in its `classes`)."""
    names = set()
    for _, path in _package_modules(top):
        for node in ast.walk(_tree(path)):
            scopes = [node] if classes is None else [
                n for n in ([node] if isinstance(node, ast.ClassDef) else [])
                if n.name in classes]
            for scope in scopes:
                names |= {f.name for f in ast.walk(scope)
                          if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def test_channels_never_call_the_collective_layer():
    """A channel moves bytes; it never calls a group's or a collective call's methods (the
    agreement check, sequence numbers, native dispatch): those take what they need from
    the layer above as arguments."""
    # A process group's and a collective call's own methods, and the names they once had.
    theirs = (_methods("collective", {"ProcessGroup", "_Collective"}) - _methods("channels")) | {
        "take_call_check", "check_calls", "current_seq", "natives"}
    wrong = [f"{module}:{node.lineno} uses .{node.attr} (a collective-layer method)"
             for module, path in _package_modules("channels")
             for node in ast.walk(_tree(path))
             if isinstance(node, ast.Attribute) and node.attr in theirs]
    assert not wrong, "channels reach into the collective layer:\n" + "\n".join(wrong)


def test_the_collective_layer_reads_declared_capabilities():
    """No getattr/hasattr on a channel: what it can do is declared on DataChannel."""
    wrong = []
    for module, path in _package_modules("collective"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "hasattr") and node.args and \
                    "channel" in ast.unparse(node.args[0]):
                wrong.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    assert not wrong, "probing a channel; declare the capability on DataChannel:\n" + \
        "\n".join(wrong)


def test_no_private_name_is_imported_across_packages():
    wrong = []
    for module, path, is_package in _modules():
        package = module.split(".") if is_package else module.split(".")[:-1]
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.ImportFrom) or (node.module or "") == "__future__":
                continue
            if node.level:
                source = package[:len(package) - node.level + 1] + (
                    node.module.split(".") if node.module else [])
            elif (node.module or "").startswith("mwrt."):
                source = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and source and source[0] != _top(module):
                    wrong.append(f"{module} imports {alias.name} from {'.'.join(source)}")
    assert not wrong, "private names crossing packages; make them public:\n" + "\n".join(wrong)


def _defined_here(tree: ast.AST) -> set[str]:
    """`_names` a module owns: its functions, classes, module names, attributes it sets on
    self/cls, and __slots__ entries."""
    owned = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owned.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            owned.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            owned.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            owned.add(node.value)  # __slots__
    return owned


def test_no_module_reaches_into_another_modules_private_attributes():
    """Below the master, `obj._name` only where this module owns `_name` (or self/super()).
    The master's handles still share their state across master/ (left to its owners)."""
    wrong = []
    for module, path, _ in _modules():
        if LAYERS[_top(module)] >= LAYERS["master"]:
            continue
        tree = _tree(path)
        owned = _defined_here(tree) | STDLIB_PRIVATE | (
            TORCH_PRIVATE if module == "ops.torchmeta" else set())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")) or \
                    node.attr.startswith("__") or node.attr in owned:
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Call) and ast.unparse(base.func) == "super":
                continue
            wrong.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    assert not wrong, "reaching into another module's private state:\n" + "\n".join(wrong)

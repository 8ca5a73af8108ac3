"""Checkpoints written by the workers: mwrt.save and mwrt.load.

Each worker writes the tensors it holds, one safetensors file per (node, device), in
parallel, on the tensors' streams; the master writes only the manifest (names, shapes,
dtypes, where each tensor lived, its file and CRC32), last, by an atomic rename. A save
goes into a folder of its own generation, and the files of the generation before the
previous one are removed as the new one is written, by the worker of each place, whether
this save writes there or not: a crash mid-save leaves the previous checkpoint whole. The
files a killed save wrote, which no manifest lists, each node removes once they are older
than the generation the manifest in place replaces.
`wait=False` first snapshots the tensors on their streams (a copy, so later in-place
updates are not saved), then writes on a checkpoint stream of each worker while the
program goes on.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import weakref
from typing import Any

import numpy as np

from .. import tensorfile
from ..arrays import HOST
from ..ops import Spec, torchspec
from ..protocol import wire
from . import context, ordering
from .cluster import current
from .mesh import saving
from .mesh.device_mesh import Mesh
from .progress import Progress
from .streams import Stream
from .tensor import DistributedTensor
from .torchissue import from_raw
from .torchtensor import TorchTensor
from .torchtensor import ready as torch_ready

MANIFEST = "manifest.json"
_LAST: dict = {}  # folder -> its latest SaveHandle (a save waits for the one before it)
_FORMAT = "mwrt-checkpoint"
_SAVE_STREAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # node -> {dev: id}


class SaveHandle:
    """A save in progress: wait() returns once the manifest is written; done() asks."""

    def __init__(self, path: str, entries: dict, parts: list, generation: int, started: float,
                 sharded: dict, replaces: list):
        self.path, self._entries, self._parts, self._sharded = path, entries, parts, sharded
        self._replaces = replaces  # the previous generation's files: the next save removes them
        self._written = False  # the manifest is in place
        self._generation, self._started = generation, started
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def done(self) -> bool:
        """True once every worker wrote its part and the manifest is in place."""
        return self._written or (self._thread is not None and not self._thread.is_alive())

    def wait(self) -> str:
        """Wait for every worker's part and the manifest; returns the manifest's path."""
        if self._thread is not None:
            self._thread.join()
            if self._error is not None:
                raise self._error
        elif not self._written:
            self._finish()
        return os.path.join(self.path, MANIFEST)

    def _in_background(self) -> None:
        """Finish on a thread of its own: the manifest's fsync is not the program's wait."""
        def run():
            try:
                self._finish()
            except BaseException as exc:  # noqa: BLE001 - raised by wait(), on the caller
                self._error = exc
        self._thread = threading.Thread(target=run, name="mwrt-save", daemon=True)
        self._thread.start()

    def _finish(self) -> None:
        total = sum(_nbytes(self._entries[n]) for names, *_ in self._parts for n in names)
        with Progress(total, f"mwrt.save {self.path}") as progress:
            for names, crcs_tensor, _, _ in self._parts:  # as each worker's part is written
                for name, crc in zip(names, crcs_tensor.numpy().tolist()):
                    self._entries[name]["crc32"] = int(crc) & 0xFFFFFFFF
                progress.update(sum(_nbytes(self._entries[n]) for n in names))
        _write_manifest(self.path, {
            "format": _FORMAT, "version": 1, "generation": self._generation,
            "files": sorted({rel for _, _, rel, _ in self._parts if rel}),
            "replaces": self._replaces,
            "seconds": round(time.monotonic() - self._started, 3),
            "tensors": self._entries, "sharded": self._sharded})
        self._parts, self._written = [], True  # the CRC tensors may go

    def __repr__(self):
        state = "written" if self.done() else "in progress"
        return f"<SaveHandle {self.path!r} generation {self._generation}: {state}>"


def save(path: str | os.PathLike, tensors: dict, *, wait: bool = True) -> SaveHandle:
    """Have each worker write the tensors it holds under `path`; the master writes the manifest."""
    path = os.path.abspath(os.fspath(path))
    _check_tensors(tensors)
    for name, t in tensors.items():
        if t.name is None:  # what a master re-attaching to a named session finds it by
            t.name = name
    tensors, sharded = _blocks_of_sharded(tensors)
    prior = _LAST.get(path)
    if prior is not None:  # one save per folder at a time: its manifest says what comes next
        prior.wait()
    generation, before, stale = _previous(path)
    older = _older(generation, before)
    generation += 1
    groups: dict = {}
    for name, t in tensors.items():
        groups.setdefault((t._node.index, t._device), []).append((name, t))
    entries, parts = {}, []
    started = time.monotonic()
    for where, members in sorted(groups.items()):
        rel = f"generation-{generation}/node{where[0]}-device{where[1]}.safetensors"
        old = before.get(where, {})
        for name, t in members:  # "replaces": the file the save after this one removes
            entries[name] = {"dtype": _stored_dtype(t).str, "shape": list(t.shape),
                             "where": list(where), "file": rel, "replaces": old.get("file")}
            if t.holds_torch:  # read back as torch: its dtype (the file's too), requires_grad
                entries[name]["torch"] = {"dtype": str(t.dtype),
                                          "requires_grad": bool(t.requires_grad)}
        node = members[0][1]._node
        parts.append(_issue_save(path, rel, stale.pop(where, ()), node, where[1], members, wait,
                                 older))
    parts += _issue_removals(path, stale, wait, older, {where[0] for where in groups})
    for name, entry in sharded.items():
        for block in entry["blocks"]:
            entries[block["name"]]["part_of"] = name
    replaces = sorted({e["file"] for e in before.values() if e.get("file")})
    handle = SaveHandle(path, entries, parts, generation, started, sharded, replaces)
    for node in {t._node for t in tensors.values()}:
        node.flush()  # every worker starts writing before the master waits on the first
    _LAST[path] = handle
    if wait:
        handle.wait()
    else:
        handle._in_background()
    return handle


def load(path: str | os.PathLike, *, node: int | None = None, names: list | None = None,
         mesh: Mesh | None = None) -> dict:
    """The tensors of the checkpoint at `path`, each read by the worker it goes to.

    By default each goes back to the node and device it was saved from, and a sharded
    tensor onto its mesh; `node=` puts every tensor on that node (a sharded one whole,
    as a plain tensor), `mesh=` every sharded one onto that mesh (resharded: each place
    reads the blocks it needs). Reading
    a file on another node than the one that wrote it needs a filesystem both see.
    """
    path = os.path.abspath(os.fspath(path))
    manifest = _read_manifest(path)
    sharded = manifest.get("sharded", {})
    every = {n: e for n, e in manifest["tensors"].items() if "part_of" not in e}
    every.update(dict.fromkeys(sharded))
    wanted = every if names is None else _pick(every, names, path)
    cluster, used = current(), set()
    loaded: dict[str, DistributedTensor] = {}

    def load_at(name: str, node_index: int, device: int) -> DistributedTensor:
        entry = manifest["tensors"][name]
        if node_index >= len(cluster.nodes):
            raise ValueError(f"mwrt.load: {name!r} was saved on node {node_index}, and this "
                             f"session has {len(cluster.nodes)} nodes; load with node=...")
        used.add((node_index, device))
        _inside(path, name, entry.get("file"))
        return _issue_load(cluster.node(node_index), device, path, name, entry)

    for name in wanted:
        if name in sharded and mesh is None and node is not None:  # whole, on that node
            device = sharded[name]["mesh"]["places"][0][1]
            one = Mesh([(node, device)], (1,), ("node",))
            loaded[name] = saving.assemble(name, sharded[name], one, load_at).shards()[0]
        elif name in sharded:
            loaded[name] = saving.assemble(name, sharded[name], mesh, load_at)
        else:
            where = manifest["tensors"][name]["where"]
            loaded[name] = load_at(name, where[0] if node is None else node, where[1])
    total = sum(_nbytes(e) for n, e in manifest["tensors"].items()
                if n in wanted or e.get("part_of") in wanted)
    with Progress(total, f"mwrt.load {path}") as progress:
        for node_index, device in used:  # a missing or damaged file is named now
            Stream(node_index, device, _id=context.stream_for(node_index, device)).synchronize()
            progress.update(total / len(used))
    return loaded


def _issue_load(node, device: int, path: str, name: str, entry: dict) -> DistributedTensor:
    """One LoadTensors: tensor `name` of its file, read by `node` onto `device` (a torch
    tensor's bytes into host memory, then made a torch tensor there)."""
    device = node.check_device(device)
    made = entry.get("torch")
    read_to = HOST if made is not None else device
    stream = context.stream_for(node.index, read_to)
    out = DistributedTensor(node, read_to, next(node.ids), _spec(entry), stream)
    node.issue(wire.LoadTensors(
        id=next(node.ids), stream=stream, outs=(out._id,), folder=path, file=entry["file"],
        names=(name,), expected=((entry["dtype"], tuple(entry["shape"]), entry.get("crc32")),)))
    if made is None:
        return out
    dtype = str(made.get("dtype")) if isinstance(made, dict) else ""
    if dtype not in torchspec.objects():
        raise ValueError(f"mwrt.load: {os.path.join(path, MANIFEST)}: tensor {name!r} names no "
                         f"torch dtype (got {dtype!r:.40}, expected one like 'torch.float32')")
    torch_ready()
    loaded: Any = from_raw(out, dtype, bool(made.get("requires_grad")), device, TorchTensor)
    return loaded


def _blocks_of_sharded(tensors: dict) -> tuple[dict, dict]:
    """(every tensor to write, with sharded ones as their blocks; their manifest entries)."""
    flat: dict = {}
    sharded: dict = {}
    for name, t in tensors.items():
        if isinstance(t, DistributedTensor) and t._mesh is not None:
            sharded[name], parts = saving.blocks(name, t)
            flat.update(parts)
        else:
            flat[name] = t
    return flat, sharded


def _issue_removals(path: str, stale: dict, wait: bool, older: int, saving: set) -> list:
    """A SaveTensors that writes nothing for each place this save leaves out, removing its
    stale files (a place this session lacks keeps them: no worker here wrote them), and for
    each other node where older files may lie (a killed save's, which no manifest lists)."""
    cluster, parts, reached = current(), [], set(saving)
    for (node_index, device), files in sorted(stale.items()):
        if node_index >= len(cluster.nodes):
            continue
        node = cluster.node(node_index)
        try:
            node.check_device(device)
        except ValueError:
            continue
        parts.append(_issue_save(path, "", files, node, device, [], wait, older))
        reached.add(node_index)
    if older > 1:  # (files of generation 1 and later: none is older than 1)
        for node in cluster.nodes:
            if node.index not in reached and node.lost is None:
                parts.append(_issue_save(path, "", (), node, HOST, [], wait, older))
    return parts


def _issue_save(path: str, rel: str, stale, node, device: int, members: list, wait: bool,
                older: int):
    """One SaveTensors for the tensors of one (node, device), removing its `stale` files and
    those of generations before `older`: (names, crc handle, rel, stream)."""
    tensors = [t for _, t in members]
    if not wait:  # a snapshot on the tensors' own streams; later updates go elsewhere
        tensors = [t.detach().clone() if t.holds_torch else t.copy() for t in tensors]
        stream = _save_stream(node, device)
    else:
        stream = context.stream_for(node.index, device)
    now = next(node.ids)
    for t in tensors:
        ordering.use(t, stream, now)
    crcs = DistributedTensor(node, device, next(node.ids), _spec(
        {"dtype": "<i8", "shape": [len(tensors)]}), stream)
    node.issue(wire.SaveTensors(id=now, stream=stream, out=crcs._id, folder=path, file=rel,
                                names=tuple(name for name, _ in members),
                                refs=tuple(t._ref for t in tensors), stale=tuple(stale),
                                older=older))
    return [name for name, _ in members], crcs, rel, Stream(node.index, device, _id=stream)


def _save_stream(node, device: int) -> int:
    """The stream that writes snapshots of (node, device): made once, so saves queue there."""
    streams = _SAVE_STREAMS.setdefault(node, {})
    if device not in streams:
        streams[device] = Stream(node.index, device).id
    return streams[device]


def _stored_dtype(t) -> np.dtype:
    """The NumPy dtype a tensor is written as (a torch dtype NumPy lacks: its bits')."""
    return torchspec.bits_dtype(t.dtype) if t.holds_torch else np.dtype(t.dtype)


def _nbytes(entry: dict) -> int:
    return int(np.prod(entry["shape"], dtype=np.int64)) * np.dtype(entry["dtype"]).itemsize


def _spec(entry: dict):
    return Spec(tuple(entry["shape"]), np.dtype(entry["dtype"]))


def _check_tensors(tensors) -> None:
    if not isinstance(tensors, dict) or not tensors:
        raise TypeError(f"mwrt.save: tensors must be a non-empty dict of name -> "
                        f"DistributedTensor (got {type(tensors).__name__})")
    for name, t in tensors.items():
        if not isinstance(name, str) or not name or name.startswith("__") or "#" in name:
            raise ValueError(f"mwrt.save: tensor names must be non-empty strings without '#' "
                             f"(a sharded tensor's blocks use it) not starting with '__' (got "
                             f"{name!r})")
        if not isinstance(t, DistributedTensor):
            raise TypeError(f"mwrt.save: {name!r} is a {type(t).__name__}, expected a "
                            "DistributedTensor (mwrt.dist_send it first)")


def _pick(every: dict, names, path: str) -> dict:
    missing = [n for n in names if n not in every]
    if missing:
        raise KeyError(f"mwrt.load: {path} has no tensor {missing[0]!r} (it has "
                       f"{', '.join(sorted(every))})")
    return {n: every[n] for n in names}


def _previous(path: str) -> tuple[int, dict, dict]:
    """(the generation of the checkpoint at `path`, 0 for none; its entries by place; the
    files of the generation before it by place, which this save removes), every file it
    names checked to be one a save wrote."""
    previous = _read_manifest(path, missing_ok=True)
    where = os.path.join(path, MANIFEST)
    generation, tensors = previous.get("generation", 0), previous.get("tensors", {})
    replaces = previous.get("replaces", [])
    if (type(generation) is not int or generation < 0 or not isinstance(tensors, dict)
            or not isinstance(replaces, list)):
        raise ValueError(f"mwrt.save: {where}: not a manifest mwrt.save wrote (got generation "
                         f"{generation!r:.40}, tensors of type {type(tensors).__name__} and "
                         f"replaces of type {type(replaces).__name__}, expected an int >= 0, a "
                         "dict and a list); save to a new folder")
    before, stale = {}, {rel: _written(where, "the manifest", "replaces", rel) for rel in replaces}
    for name, entry in tensors.items():
        place = entry.get("where") if isinstance(entry, dict) else None
        if not isinstance(place, list):
            raise ValueError(f"mwrt.save: {where}: tensor {name!r} has no place (got "
                             f"{entry!r:.80}, expected a dict with 'where': [node, device]); "
                             "save to a new folder")
        for key in ("file", "replaces"):  # the file the save after this removes, and this one's
            if entry.get(key) is not None:
                place_of = _written(where, f"tensor {name!r}", key, entry[key])
                stale.update({entry[key]: place_of} if key == "replaces" else {})
        before[tuple(place)] = entry
    by_place: dict = {}
    live = {e.get("file") for e in before.values()}
    for rel, place_of in sorted(stale.items()):
        if rel not in live:  # never a file the checkpoint in place reads
            by_place.setdefault(place_of, []).append(rel)
    return generation, before, by_place


def _older(generation: int, before: dict) -> int:
    """The generation files older than which no manifest lists (a killed save's): older than
    what the manifest in place replaces, and than any file it reads (a copied one's may be)."""
    files = (tensorfile.PART.fullmatch(e.get("file") or "") for e in before.values())
    return min([generation - 1, *(int(found[1]) for found in files if found)])


def _written(where: str, whose: str, key: str, rel) -> tuple[int, int]:
    """The (node, device) whose worker wrote `rel`, if a save wrote it, else a ValueError
    naming the manifest's entry."""
    found = tensorfile.PART.fullmatch(rel) if isinstance(rel, str) else None
    if found is None:
        raise ValueError(
            f"mwrt.save: {where}: {whose} names a file that a later save would remove, and "
            f"mwrt.save did not write it (got {key} {rel!r:.200}, expected one like "
            "'generation-1/node0-device-1.safetensors'); a save removes only older files of "
            "its own folder: restore the manifest, or save elsewhere")
    return int(found[2]), int(found[3])


def _inside(path: str, name: str, rel) -> None:
    """Refuse a manifest entry whose file is not a path inside the checkpoint's folder."""
    reason = tensorfile.outside(rel)
    if reason:
        raise ValueError(f"mwrt.load: {os.path.join(path, MANIFEST)}: tensor {name!r} names a "
                         f"file outside the checkpoint's folder (got file {rel!r:.200}, {reason}; "
                         f"expected a relative path inside {path}); a checkpoint reads the files "
                         "of its own folder only: restore the manifest, or load one you trust")


def _read_manifest(path: str, missing_ok: bool = False) -> dict:
    where = os.path.join(path, MANIFEST)
    try:  # a shared checkpoint's manifest may be a link to anywhere: read none
        with tensorfile.open_inside(path, MANIFEST, "its manifest") as f:
            manifest = json.load(f)
    except tensorfile.TensorFileError as exc:
        raise ValueError(f"mwrt.load: {exc}") from None
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise FileNotFoundError(f"mwrt.load: {where}: no checkpoint there (no manifest; a "
                                "save that never finished leaves none)") from None
    except ValueError as exc:
        raise ValueError(f"mwrt.load: {where}: not a readable manifest ({exc})") from None
    if manifest.get("format") != _FORMAT:
        raise ValueError(f"mwrt.load: {where}: not an mwrt checkpoint manifest (format "
                         f"{manifest.get('format')!r}, expected {_FORMAT!r})")
    return manifest


def _write_manifest(path: str, manifest: dict) -> None:
    """Write the manifest whole or not at all: a temporary file, fsync, then rename."""
    os.makedirs(path, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".manifest-", dir=path)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, os.path.join(path, MANIFEST))
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise

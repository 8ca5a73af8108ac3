"""Every default and MWRT_* environment variable, in one table."""

from __future__ import annotations

import difflib
import logging
import math
import os
from dataclasses import dataclass
from datetime import timedelta

from .errors import ConfigError


@dataclass(frozen=True)
class Setting:
    """One tunable: its variable name, default, type and meaning."""

    env: str
    default: object
    kind: type
    doc: str
    path: bool = False  # a file or folder: `~` and $VARIABLES are expanded


def _host_ram() -> int:
    """Physical memory of this host in bytes (64 GiB where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 36


def _cpus() -> int:
    """CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def stream_capacity() -> int:
    """Streams a worker can run at once: each holds a ZeroMQ socket (1,023 per context by
    default) and a file descriptor; a quarter of the fds stay for connections and files."""
    try:
        import resource

        fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        fds = 1024
    fds = 1 << 16 if fds == -1 else fds
    return max(min(1023 - 64, fds * 3 // 4 - 64), 32)


# The fake GPU of the tests, named here and imported by name only where MWRT_FAKE_GPUS asks for
# it (arrays.gpu_module), so that nothing of the package imports a test double.
FAKE_GPU_MODULE = "mwrt.testing.fakegpu"

SETTINGS = {
    "workers": Setting("MWRT_WORKERS", "", str, "comma-separated host:port of worker daemons"),
    "local_workers": Setting("MWRT_LOCAL_WORKERS", 2, int, "daemons started when none are named"),
    "fork_local_workers": Setting("MWRT_FORK_LOCAL_WORKERS", 1, int,
                                  "1: local worker daemons are forked by one process that has "
                                  "imported their modules (a start of ~0.03 CPU-s, not ~0.3); "
                                  "0: each is a fresh `python -m mwrt.worker`"),
    "registry": Setting("MWRT_REGISTRY", "", str,
                        "directory where `mwrt-worker --register` daemons announce themselves",
                        path=True),
    "listen": Setting("MWRT_LISTEN", "127.0.0.1:7070", str,
                      "HOST:PORT an mwrt-worker serves masters on (port 0 picks a free one)"),
    "num_workers": Setting("MWRT_NUM_WORKERS", 0, int,
                           "registered workers a master waits for (with MWRT_REGISTRY)"),
    "connect_timeout": Setting("MWRT_CONNECT_TIMEOUT", 10.0, float, "seconds to reach a worker"),
    "sync_timeout": Setting("MWRT_SYNC_TIMEOUT", 600.0, float, "seconds a sync point waits"),
    "heartbeat_interval": Setting("MWRT_HEARTBEAT_INTERVAL", 0.5, float, "seconds between pings"),
    "heartbeat_timeout": Setting("MWRT_HEARTBEAT_TIMEOUT", 5.0, float,
                                 "seconds of silence before a peer is declared lost"),
    "torch_import_grace": Setting("MWRT_TORCH_IMPORT_GRACE", 120.0, float,
                                  "seconds of silence allowed a worker after its first torch "
                                  "command (torch's initialisation holds its interpreter)"),
    "torch_threads": Setting("MWRT_TORCH_THREADS", 0, int,
                             "torch's intra-op threads on a worker (0: torch's own count); the "
                             "local workers a master starts get 1, as torchrun gives each of "
                             "several processes on a host (their threads would share the "
                             "host's cores, spinning under load)"),
    "lease_timeout": Setting("MWRT_LEASE_TIMEOUT", 10.0, float,
                             "seconds a worker keeps a silent master's session"),
    "session_grace": Setting("MWRT_SESSION_GRACE", 0.0, float,
                             "seconds workers keep a named session after its master is gone"),
    "max_session_grace": Setting("MWRT_MAX_SESSION_GRACE", 3600.0, float,
                                 "the longest grace a worker grants a named session (a keyed "
                                 "worker; an unkeyed one keeps no session past its master)"),
    "max_sessions": Setting("MWRT_MAX_SESSIONS", 64, int,
                            "sessions a worker holds at once, live or kept for a grace"),
    "progress_after": Setting("MWRT_PROGRESS_AFTER", 2.0, float,
                              "seconds a save, load or start of local workers waits before "
                              "it shows its progress"),
    "batch_size": Setting("MWRT_BATCH_SIZE", 256, int, "commands per batch before a flush"),
    "worker_spin_us": Setting("MWRT_WORKER_SPIN_US", 100, int,
                              "microseconds a worker with idle streams keeps polling for the "
                              "next command before it sleeps: a sync loop's next request "
                              "finds it awake (~40 us off each round trip on a VM), for at "
                              "most that much CPU per message (a spin that found nothing is "
                              "skipped for the next 1, 3, 7 ... turns, up to 63, a hit taking "
                              "one miss back); 0: never "
                              "(the default of local daemons on a host with fewer cores than "
                              "daemons)"),
    "master_spin_us": Setting("MWRT_MASTER_SPIN_US", 200, int,
                              "microseconds a master's wait polls for its reply before it "
                              "sleeps in the read: a small read's reply then finds it awake "
                              "(a sleeping thread's wake-up costs tens of us on a VM), for at "
                              "most that much CPU per wait (skipped after a miss as a "
                              "worker's spin is); 0: never"),
    "lanes": Setting("MWRT_LANES", 1, int,
                     "1: a master and the local daemons it starts move their batches and "
                     "replies off ZeroMQ onto one Unix stream socket each after the Hello (a "
                     "round trip without ZeroMQ's I/O threads: ~60 us less on a VM); 0: "
                     "ZeroMQ alone"),
    "inline_op_elements": Setting("MWRT_INLINE_OP_ELEMENTS", 4096, int,
                                  "an op on an idle host stream whose operands and results "
                                  "hold at most this many elements in all runs on the "
                                  "worker's socket thread, sparing two thread hand-offs "
                                  "(~90 us on a VM); 0: never"),
    "inline_bytes": Setting("MWRT_INLINE_BYTES", 65536, int,
                            "arrays up to this size ride inside commands"),
    "staging_chunk_bytes": Setting("MWRT_STAGING_CHUNK_BYTES", 8 << 20, int,
                                   "chunk size (a power of two) of transfers to and from GPUs, "
                                   "which copy one chunk while the channel sends another"),
    "max_frame_bytes": Setting("MWRT_MAX_FRAME_BYTES", 1 << 20, int,
                               "largest command frame a daemon accepts"),
    "max_tensor_bytes": Setting("MWRT_MAX_TENSOR_BYTES", _host_ram() // 2, int,
                                "largest host tensor one command (or op result) may create "
                                "(default: half of the host's RAM; a GPU's memory bounds "
                                "its own)"),
    "max_unclaimed_bytes": Setting("MWRT_MAX_UNCLAIMED_BYTES", max(1 << 30, _host_ram() // 8),
                                   int, "bytes of messages one peer may have waiting on a "
                                   "data channel that no receive has claimed yet"),
    "session_bytes": Setting("MWRT_SESSION_BYTES", _host_ram() // 2, int,
                             "bytes of host tensors one master may hold on a worker "
                             "(default: half of the host's RAM; a GPU's memory bounds its "
                             "own)"),
    "session_tensors": Setting("MWRT_SESSION_TENSORS", 1 << 20, int,
                               "tensors one master may hold on a worker"),
    "session_streams": Setting("MWRT_SESSION_STREAMS", stream_capacity() // 4, int,
                               "streams (a thread and a socket each) one master may open on a "
                               "worker (default: a quarter of what its fd limit allows)"),
    "worker_slots": Setting("MWRT_WORKER_SLOTS", max(_cpus(), 2), int,
                            "ops (host ops and remote() functions) a worker runs at once "
                            "for all its masters, handed round-robin between masters "
                            "(default: its CPUs, at least 2)"),
    "turn_wait": Setting("MWRT_TURN_WAIT", 10.0, float,
                         "seconds an op waits for one of MWRT_WORKER_SLOTS before it runs "
                         "anyway"),
    "session_inflight_bytes": Setting("MWRT_SESSION_INFLIGHT_BYTES", 1 << 30, int,
                                      "bytes of received commands a worker queues for one "
                                      "master before it refuses more"),
    "session_events": Setting("MWRT_SESSION_EVENTS", 1 << 16, int,
                              "events, and waits on them, one master may keep on a worker"),
    "session_graphs": Setting("MWRT_SESSION_GRAPHS", 1024, int,
                              "captured graphs one master may keep defined on a worker"),
    "session_graph_bytes": Setting("MWRT_SESSION_GRAPH_BYTES", 64 << 20, int,
                                   "bytes of graph definitions one master may keep on a "
                                   "worker"),
    "session_functions": Setting("MWRT_SESSION_FUNCTIONS", 256, int,
                                 "shipped functions a worker keeps unpickled for one master "
                                 "(the least recently used go first; never shared)"),
    "max_world": Setting("MWRT_MAX_WORLD", 1 << 16, int,
                         "largest world a master's Join may name on a worker"),
    "max_joins": Setting("MWRT_MAX_JOINS", 64, int,
                         "Joins a worker runs at once for all its masters (a thread each)"),
    "max_backlog_bytes": Setting("MWRT_MAX_BACKLOG_BYTES", 64 << 20, int,
                                 "the master waits (up to MWRT_SYNC_TIMEOUT) when a worker is "
                                 "this many bytes of commands behind; 0: never waits"),
    "channel": Setting("MWRT_CHANNEL", "auto", str,
                       "data channel of master-worker mode: auto (shm when every node is on "
                       "the master's host, else tcp), or a registered channel name"),
    "master_addr": Setting("MWRT_MASTER_ADDR", "", str,
                           "address workers reach the master's rendezvous store at (default: "
                           "the master's address on the route to the workers)"),
    "advertise_addr": Setting("MWRT_ADVERTISE_ADDR", "", str,
                              "address this process's listeners advertise to peers (default: "
                              "the one on the route to the master or store)"),
    "ifname": Setting("MWRT_IFNAME", "", str,
                      "network interface whose address listeners advertise (as "
                      "GLOO_SOCKET_IFNAME)"),
    "job_secret": Setting("MWRT_JOB_SECRET", "", str,
                          "an SPMD job's shared secret: data-channel connections prove it "
                          "(mwrt-launch makes one for one-node jobs)"),
    "insecure": Setting("MWRT_INSECURE", 0, int,
                        "1: let unkeyed channels listen beyond loopback (a private network "
                        "only: anyone reaching the port can read and feed tensors)"),
    "channel_timeout": Setting("MWRT_CHANNEL_TIMEOUT", 300.0, float,
                               "seconds a data-channel send/recv outside a process group waits "
                               "(master-worker copies between workers); collectives and SPMD "
                               "send/recv wait MWRT_COLLECTIVE_TIMEOUT, or this where that is "
                               "unset"),
    "rendezvous_timeout": Setting("MWRT_RENDEZVOUS_TIMEOUT", 300.0, float,
                                  "seconds ranks wait for each other at init_process_group"),
    "store_max_value_bytes": Setting("MWRT_STORE_MAX_VALUE_BYTES", 16 << 20, int,
                                     "largest value (and request) a TCPStore server accepts; "
                                     "a peer announcing more is disconnected"),
    "store_max_bytes": Setting("MWRT_STORE_MAX_BYTES", 256 << 20, int,
                               "bytes of keys and values a TCPStore server holds in all"),
    "store_max_connections": Setting("MWRT_STORE_MAX_CONNECTIONS", 1024, int,
                                     "connections a TCPStore server serves at once"),
    "two_level": Setting("MWRT_TWO_LEVEL", 1, int,
                         "1: groups spanning hosts with several ranks on one run all_reduce "
                         "and broadcast inside each host first, then across; 0: flat"),
    "small_collective_bytes": Setting("MWRT_SMALL_COLLECTIVE_BYTES", 65536, int,
                                      "collectives up to this size use latency-bound algorithms "
                                      "(recursive doubling, trees); larger ones use rings"),
    "eager_bytes": Setting("MWRT_EAGER_BYTES", 65536, int,
                           "collectives send messages up to this size without waiting for the "
                           "peer (a channel may set its own with an eager_bytes attribute)"),
    "segment_bytes": Setting("MWRT_SEGMENT_BYTES", 4 << 20, int,
                             "large transfers and collectives move in segments of this size"),
    "shm_slots": Setting("MWRT_SHM_SLOTS", 8, int,
                         "shared-memory slots per (sender, receiver) pair of the shm channel"),
    "shm_slot_bytes": Setting("MWRT_SHM_SLOT_BYTES", 1 << 20, int,
                              "bytes per shm slot (at most segment_bytes); ~L2-sized is fastest"),
    "recv_pool_bytes": Setting("MWRT_RECV_POOL_BYTES", min(1 << 30, _host_ram() // 16), int,
                               "bytes of freed receive buffers a worker keeps per master, so a "
                               "dist_send lands in memory already faulted in; 0: off"),
    "recv_pool_min_bytes": Setting("MWRT_RECV_POOL_MIN_BYTES", 1 << 20, int,
                                   "receives from this size take their buffer from that pool"),
    "shm_cma": Setting("MWRT_SHM_CMA", 1, int,
                       "1: shm collectives, messages from MWRT_SHM_CMA_BYTES, and the "
                       "master's large reads from workers of its host read peers' buffers "
                       "in place (process_vm_readv, one copy) when the kernel allows; 0: "
                       "always the socket and slot path"),
    "shm_cma_bytes": Setting("MWRT_SHM_CMA_BYTES", 1 << 20, int,
                             "shm messages from this size are read in place by the receiver "
                             "(one copy) instead of through slots (two)"),
    "shm_stage_bytes": Setting("MWRT_SHM_STAGE_BYTES", 4 << 20, int,
                               "shm all_reduce up to this size goes through shared staging "
                               "areas (in-cache copies beat single-copy reads); 0: off"),
    "stream_order": Setting("MWRT_STREAM_ORDER", "safe", str,
                            "safe: a tensor used on another stream than the one that wrote or "
                            "read it is ordered automatically; manual: CUDA's rule (events)"),
    "strict_placement": Setting("MWRT_STRICT_PLACEMENT", 0, int,
                                "1: a mesh op with no local plan for its operands' placements "
                                "raises PlacementError; 0: the workers redistribute the "
                                "operands to a placement that has one (a PlacementWarning "
                                "once per call site)"),
    # -- hang reports and the collective timeout (issue 17) --
    "collective_timeout": Setting("MWRT_COLLECTIVE_TIMEOUT", 300.0, float,
                                  "seconds a collective or a process group's send/recv waits for "
                                  "a peer before it fails (unset: the channel's, "
                                  "MWRT_CHANNEL_TIMEOUT; per group: new_group(timeout=); for "
                                  "the default group init_process_group(timeout=) wins)"),
    "hang_warning": Setting("MWRT_HANG_WARNING", 30.0, float,
                            "seconds a collective or send/recv may wait before its rank logs "
                            "whom it waits for, and again each time as long; 0: never"),
    "status_dir": Setting("MWRT_STATUS_DIR", "", str,
                          "directory where each rank keeps a file of its current call (set by "
                          "mwrt-launch, which prints them as a table on SIGUSR1 or a hang)"),
    "key_file": Setting("MWRT_KEY_FILE", "", str, "key file for CURVE and HMAC", path=True),
    "log_level": Setting("MWRT_LOG_LEVEL", "WARNING", str, "logging level of daemons"),
    # Tests without a GPU: workers use FAKE_GPU_MODULE (host memory posing as CUDA devices).
    "fake_gpus": Setting("MWRT_FAKE_GPUS", 0, int,
                         "for tests: a worker poses as having this many GPUs (host memory "
                         "behind CuPy's API, mwrt.testing.fakegpu) instead of using CuPy; 0: off"),
    "fake_gpu_bytes": Setting("MWRT_FAKE_GPU_BYTES", 16 << 30, int,
                              "memory of each fake GPU (MWRT_FAKE_GPUS): allocating past it "
                              "raises CuPy's OutOfMemoryError"),
}


# MWRT_* variables that are not settings of this package but of its scripts and tests: never
# warned about as typos.
OTHER_VARIABLES = {
    "MWRT_RUN_DIR": "worker/slurm_workers.sh", "MWRT_PORT": "worker/slurm_workers.sh",
    "MWRT_RESTART_COUNT": "mwrt-launch (the restart a rank runs in)",
    "MWRT_TEST_SEED": "tests", "MWRT_FUZZ_FRAMES": "tests", "MWRT_FUZZ_SEED": "tests",
    "MWRT_LOAD_SECONDS": "tests", "MWRT_LOAD_RATE": "tests", "MWRT_LOAD_SEED": "tests",
}
log = logging.getLogger("mwrt.config")
_checked = False


def expand_path(path: str) -> str:
    """`~` and $VARIABLES of a path setting expanded, as a shell would ("~/keys/master.key")."""
    return os.path.expanduser(os.path.expandvars(path))


def unknown_variables(environ=None) -> list[tuple[str, str | None]]:
    """(variable, closest known name or None) for each MWRT_* variable no setting reads."""
    environ = os.environ if environ is None else environ
    known = [setting.env for setting in SETTINGS.values()]
    return [(name, next(iter(difflib.get_close_matches(name, known, n=1, cutoff=0.6)), None))
            for name in sorted(environ) if name.startswith("MWRT_") and name not in known
            and name not in OTHER_VARIABLES]


def check_environment() -> None:
    """Warn (once per process) about each MWRT_* variable no setting reads: a typo is
    otherwise silent. The first setting read calls it; so do the command lines."""
    global _checked
    if _checked:
        return
    _checked = True
    warn_unknown(os.environ)


def warn_unknown(environ, where: str = "") -> None:
    """Warn about each MWRT_* variable of `environ` that no setting reads (`where`: its file)."""
    for name, closest in unknown_variables(environ):
        hint = f"did you mean {closest}?" if closest else "`mwrt config` lists the known ones"
        log.warning("%s%s: not an mwrt setting, ignored; %s", where, name, hint)


def source(name: str) -> str:
    """Where the setting `name` comes from: 'environment' (its variable is set) or 'default'."""
    return "environment" if os.environ.get(SETTINGS[name].env, "") != "" else "default"


def gpu_stand_in() -> str:
    """The import path of the module that stands in for CuPy, or "" for CuPy itself: the fake
    GPU (host memory behind CuPy's API) when MWRT_FAKE_GPUS > 0."""
    return FAKE_GPU_MODULE if get("fake_gpus") > 0 else ""


def get(name: str):
    """Return the setting `name`, from its MWRT_* variable if set, else its default."""
    check_environment()
    try:
        setting = SETTINGS[name]
    except KeyError:
        raise ConfigError(f"config: unknown setting {name!r} (known: "
                          f"{', '.join(SETTINGS)})") from None
    return _read(setting)


def describe() -> list[dict]:
    """Every setting: name, variable, value (or the error reading it), source and meaning."""
    rows = []
    for name, setting in SETTINGS.items():
        row = {"name": name, "variable": setting.env, "source": source(name),
               "doc": setting.doc, "error": None}
        try:
            row["value"] = _read(setting)
        except ConfigError as exc:
            row["value"], row["error"] = os.environ.get(setting.env), str(exc)
        rows.append(row)
    return rows


def _read(setting: Setting):
    """`setting`'s value from its variable if set (a ConfigError if malformed), else default."""
    raw = os.environ.get(setting.env)
    if raw is None or raw == "":
        return setting.default
    try:
        return expand_path(raw) if setting.path else setting.kind(raw)
    except ValueError:
        raise ConfigError(
            f"{setting.env}: not a valid {setting.kind.__name__} (got {raw!r}); {setting.doc}"
        ) from None


def version() -> str:
    """The installed mwrt's version ("unknown" when it runs from a tree not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("mwrt")
    except PackageNotFoundError:
        return "unknown"


def seconds(timeout, default, what: str = "timeout") -> float:
    """A timeout argument in seconds: a number, a datetime.timedelta (torch passes those), or
    None for `default`; finite and >= 0."""
    if timeout is None:
        timeout = default
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: expected seconds or a datetime.timedelta (got "
                        f"{timeout!r})") from None
    # inf overflows a condition wait, NaN never compares past a deadline: either would park
    # the caller forever.
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: must be a finite number of seconds >= 0 (got {timeout!r}); "
                         "pass e.g. 30.0 or timedelta(minutes=5)")
    return value

"""`mwrt`: look at an mwrt installation from a shell (`mwrt config`, `mwrt status`,
`mwrt dashboard`)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mwrt", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {config.version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    show = commands.add_parser(
        "config", help="every setting, its value and where it came from",
        description="Print every mwrt setting: its name, its MWRT_* variable, the value this "
                    "process would use and its source (default or environment), then any "
                    "MWRT_* variable that no setting reads (a typo: mwrt ignores it).")
    show.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    show.set_defaults(run=config_main)
    look = _as_master(
        commands, "status", "the workers: address, health, memory, sessions, GPUs",
        description="Connect to worker daemons as a master and show each one: its address, "
                    "process, uptime, last heartbeat, sessions and busy streams, its RSS and "
                    "the host's free memory, its GPUs, and the stream commands run and bytes "
                    "moved since it started (--watch: per second). Workers from --workers, else "
                    "MWRT_WORKERS, else MWRT_REGISTRY (with MWRT_NUM_WORKERS: waits for as "
                    "many; without: those registered now); the key from --key, else "
                    "MWRT_KEY_FILE.")
    look.add_argument("--json", action="store_true", help="one JSON list, for scripts")
    look.add_argument("--watch", type=float, metavar="SECONDS",
                      help="refresh every SECONDS until Ctrl-C, with ops/s and MB/s")
    look.set_defaults(run=status_main)
    board = _as_master(
        commands, "dashboard", "a live web page of the workers, on this machine",
        description="Connect to worker daemons as a master and serve a web page of them, "
                    "refreshed every second: liveness, heartbeats, sessions, host and GPU "
                    "memory over time, busy streams, ops/s and MB/s, the last errors. Prints "
                    "its URL, which carries the token every request needs; Ctrl-C stops it. "
                    "Workers and key as for `mwrt status`.")
    board.add_argument("--port", type=int, default=8790,
                       help="port to serve on (0: any free; Dask's dashboard has 8787)")
    board.add_argument("--host", default="127.0.0.1",
                       help="address to serve on (default loopback; beyond it, only the token "
                            "guards the page: prefer an ssh tunnel)")
    board.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                       help="seconds between samples")
    board.set_defaults(run=dashboard_main)
    return parser


def _as_master(commands, name: str, summary: str, description: str):
    """A subcommand that connects to workers as a master: with --workers and --key."""
    command = commands.add_parser(name, help=summary, description=description)
    command.add_argument("--workers", help="comma-separated HOST:PORT of the daemons")
    command.add_argument("--key", help="the master's key file (from mwrt-worker keygen)")
    return command


def _where(args, command: str) -> dict | None:
    """init_master_worker()'s arguments for the workers to look at: --workers, MWRT_WORKERS,
    or MWRT_REGISTRY's daemons (with MWRT_NUM_WORKERS as many as it says, else those
    registered now: init_master_worker() refuses a registry without a count). None, said on
    stderr, where none is named: init_master_worker() would start daemons of its own and show
    them (up 0 s, no work), not the ones a script runs, whose key only that script holds."""
    from ..store import daemon_registry

    directory = config.get("registry")
    if args.workers or config.get("workers") or (directory and config.get("num_workers")):
        return {"workers": args.workers or None, "key": args.key}
    if not directory:
        print(f"mwrt {command}: no workers named (expected --workers HOST:PORT,..., "
              "MWRT_WORKERS or MWRT_REGISTRY); a script's own local workers answer only it: "
              "call mwrt.status() or mwrt.dashboard() in the script", file=sys.stderr)
        return None
    found = daemon_registry.registered(config.expand_path(directory))
    if not found:
        print(f"mwrt {command}: registry {directory}: no worker registered (expected the "
              "files of `mwrt-worker --register` there); start the daemons, or name them "
              "with --workers", file=sys.stderr)
        return None
    return {"workers": found, "key": args.key}


def dashboard_main(args) -> int:
    """`mwrt dashboard`: serve the page until Ctrl-C (or SIGTERM)."""
    import signal
    import threading

    import mwrt

    where = _where(args, "dashboard")
    if where is None:
        return 2
    try:
        mwrt.init_master_worker(**where)
        board = mwrt.dashboard(args.port, args.host, interval=args.interval, timeline=False,
                               quiet=True)
    except (mwrt.MwrtError, ConnectionError, TimeoutError) as exc:
        print(f"mwrt dashboard: {exc}", file=sys.stderr)
        mwrt.shutdown()
        return 1
    print(f"mwrt dashboard: {board.url}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        board.close()
        mwrt.shutdown()
    return 0


def status_main(args) -> int:
    """`mwrt status`: one row per worker, once or every --watch seconds (then with rates)."""
    import time

    import mwrt

    where = _where(args, "status")
    if where is None:
        return 2
    try:
        mwrt.init_master_worker(**where)
    except (mwrt.MwrtError, ConnectionError, TimeoutError) as exc:
        print(f"mwrt status: {exc}", file=sys.stderr)
        return 1
    clear = "\033[H\033[2J" if args.watch and sys.stdout.isatty() else ""
    before = None
    try:
        while True:
            rows = mwrt.status()
            if args.json:
                print(json.dumps(rows, indent=2, default=str), flush=True)
            else:
                table = _status_table(rows, before if args.watch else None, bool(args.watch))
                print(clear + table + ("\n" if args.watch and not clear else ""), flush=True)
            if not args.watch:
                return 0 if all(row["lost"] is None for row in rows) else 1
            before = rows
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
    finally:
        mwrt.shutdown()


def _status_table(rows: list[dict], before: list[dict] | None = None, rates=False) -> str:
    """NODE ADDRESS HOST PID UP HEARTBEAT SESSIONS BUSY OPS IN OUT RSS HOST-FREE GPUS, aligned.

    OPS, IN and OUT are totals since the worker started; with `rates` (--watch), OPS/S, IN/S
    and OUT/S over the time since `before`, the previous snapshot ("-" on the first).
    """
    head = ("NODE", "ADDRESS", "HOST", "PID", "UP", "HEARTBEAT", "SESSIONS", "BUSY",
            *(("OPS/S", "IN/S", "OUT/S") if rates else ("OPS", "IN", "OUT")),
            "RSS", "HOST FREE", "GPUS")
    previous = {row["node"]: row.get("worker", {}) for row in before or ()}
    cells = [head]
    for row in rows:
        w = row.get("worker", {})
        gpus = ", ".join(f"{g.get('name', '?')} {_mib(g.get('free_memory'))} free"
                         for g in w.get("gpus", [])) or "-"
        counts = (_rates(w, previous.get(row["node"])) if rates else
                  (str(w.get("ops", "-")), _mb(w.get("bytes_in")), _mb(w.get("bytes_out"))))
        cells.append((str(row["node"]), row["address"].removeprefix("tcp://"),
                      w.get("hostname", "LOST" if row["lost"] else "?"), str(w.get("pid", "")),
                      f"{w.get('uptime', 0):.0f} s", f"{row['heartbeat_age']:.1f} s ago",
                      str(len(w.get("sessions", ()))), str(w.get("streams_busy", "")),
                      *counts, _mib(w.get("rss")), _mib(w.get("host_free")), gpus))
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in cells)


def _rates(now: dict, then: dict | None) -> tuple[str, str, str]:
    """Ops/s and MB/s in and out between two reports of one worker ("-" without the first,
    or across a restart: its counters started again)."""
    if not now or not then or then.get("incarnation") != now.get("incarnation"):
        return ("-", "-", "-")
    seconds = max(now["uptime"] - then["uptime"], 1e-9)  # the worker's own clock

    def rate(name):
        return (now[name] - then[name]) / seconds

    return (f"{rate('ops'):.0f}", f"{rate('bytes_in') / 1e6:.1f} MB/s",
            f"{rate('bytes_out') / 1e6:.1f} MB/s")


def _mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:.1f} MB"


def _mib(n) -> str:
    return "-" if n is None else f"{n / (1 << 20):.0f} MiB"


def config_main(args) -> int:
    """`mwrt config`: the settings table; exit status 1 if a variable is malformed or unknown."""
    rows = config.describe()
    unknown = config.unknown_variables()
    if args.json:
        print(json.dumps({"settings": rows, "unknown": [{"variable": name, "closest": closest}
                                                        for name, closest in unknown]},
                         indent=2, default=str))
    else:
        print(_table(rows))
        for name, closest in unknown:
            hint = f"did you mean {closest}?" if closest else "no setting is named like it"
            print(f"unknown variable {name}: ignored; {hint}")
        for row in rows:
            if row["error"]:
                print(f"error: {row['error']}")
    return 1 if unknown or any(row["error"] for row in rows) else 0


def _table(rows: list[dict]) -> str:
    """Aligned columns: SETTING VARIABLE SOURCE VALUE (the value last: it may be long)."""
    cells = [("SETTING", "VARIABLE", "SOURCE", "VALUE")]
    cells += [(r["name"], r["variable"], r["source"], repr(r["value"])) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3]
                     for row in cells)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.run(args)
    except BrokenPipeError:  # `mwrt config | head`: the reader left, which is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

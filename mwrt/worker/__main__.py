"""`mwrt-worker`: start a worker daemon (`--listen HOST:PORT`, loopback by default)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import socket
import sys

from .. import config

_SUBCOMMANDS = """subcommands:
  mwrt-worker keygen DIR   write worker.key and master.key that trust each other into DIR
                           (see `mwrt-worker keygen --help`)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mwrt-worker", description=__doc__, epilog=_SUBCOMMANDS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    parser.add_argument("--listen", default=config.get("listen"),
                        help="HOST:PORT to serve masters on (default MWRT_LISTEN, else "
                             "127.0.0.1:7070; port 0 picks a free one)")
    parser.add_argument("--advertise", default=None, metavar="HOST",
                        help="address this worker's data channel gives its peers (default: "
                             "MWRT_ADVERTISE_ADDR, MWRT_IFNAME's, else the one on the route to "
                             "the master)")
    parser.add_argument("--key-file", default=config.get("key_file") or None,
                        help="CURVE/HMAC key file (from `mwrt-worker keygen DIR`); required to "
                             "listen beyond loopback or to run shipped functions")
    parser.add_argument("--register", default=config.get("registry") or None, metavar="DIR",
                        help="announce this daemon in DIR, a directory the master sees, for "
                             "init_master_worker(registry=DIR) (default MWRT_REGISTRY)")
    parser.add_argument("--env-file", default=None, metavar="PATH",
                        help="read MWRT_* settings from PATH (KEY=VALUE lines, as worker.env)")
    parser.add_argument("--log-level", default=config.get("log_level"),
                        help="DEBUG, INFO, WARNING (default MWRT_LOG_LEVEL, else WARNING) or ERROR")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process is gone (used for local workers)")
    parser.add_argument("--ipc", action="store_true",
                        help="also serve masters of this host on a Unix socket in a private "
                             "folder, its address after the tcp one (used for local workers: "
                             "a round trip skips the TCP stack; the key still applies)")
    return parser


def add_version(parser: argparse.ArgumentParser) -> None:
    """`--version`: the installed mwrt's version."""
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s (mwrt {config.version()})")


def build_keygen_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mwrt-worker keygen",
        description="Write worker.key (for workers: --key-file) and master.key (for the master: "
                    "key= or MWRT_KEY_FILE) into DIR, created if missing (mode 0700; the files "
                    "0600). Both trust each other; existing key files are never overwritten.")
    add_version(parser)
    parser.add_argument("dir", metavar="DIR", help="folder for the two key files (~ and "
                                                   "$VARIABLES are expanded)")
    return parser


def read_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines of a systemd-style environment file; '#' starts a comment."""
    settings = {}
    with open(config.expand_path(path)) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip().isidentifier():
                raise ValueError(f"{path}:{number}: expected KEY=VALUE (got {line!r})")
            settings[key.strip()] = value.strip().strip("'\"")
    return settings


def keygen_main(argv) -> int:
    """`mwrt-worker keygen DIR`: write worker.key and master.key that trust each other."""
    from ..errors import AuthError
    from ..protocol.auth import keygen

    args = build_keygen_parser().parse_args(argv)  # exits on --help, --version, bad usage
    try:
        worker, master = keygen(args.dir)
    except AuthError as exc:
        print(f"mwrt-worker: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {worker} (for workers: --key-file) and {master} (for the master: "
          f"MWRT_KEY_FILE or init_master_worker(key=...))")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    config.check_environment()
    if argv[:1] == ["keygen"]:
        return keygen_main(argv[1:])
    # The env file comes first: its settings are the other options' defaults.
    env_file = build_parser().parse_known_args(argv)[0].env_file
    if env_file:
        try:
            settings = read_env_file(env_file)
            os.environ.update(settings)
            config.warn_unknown(settings, where=f"{env_file}: ")
        except (OSError, ValueError) as exc:
            print(f"mwrt-worker: --env-file: {exc}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    if args.advertise:
        os.environ["MWRT_ADVERTISE_ADDR"] = args.advertise  # read by this daemon's channels
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s mwrt-worker[%(process)d] %(levelname)s %(message)s")
    from ..errors import AuthError, ConfigError
    from ..protocol.auth import load_key_file
    from .daemon import Daemon

    try:
        keys = load_key_file(args.key_file) if args.key_file else None
        daemon = Daemon(args.listen, keys=keys, parent_pid=args.parent_pid, ipc=args.ipc)
    except (AuthError, ConfigError, OSError) as exc:
        print(f"mwrt-worker: {exc}", file=sys.stderr)
        return 2

    def stop(signum, frame):
        daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # What the imports made lives as long as the daemon: frozen, the collector never scans
    # it again, and the teardown at exit takes ~15 ms of CPU instead of ~80.
    gc.freeze()
    also = f" {daemon.ipc_address}" if daemon.ipc_address else ""
    print(f"mwrt-worker: listening on {daemon.address}{also}", flush=True)
    # A remote() function's print() reaches whoever reads this (a local daemon's master
    # shows it) line by line, not when a pipe's block buffer fills.
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    announced = _register(args, daemon.address) if args.register else None
    try:
        daemon.serve()
    finally:
        if announced:
            os.unlink(announced)
        _unlink_segments_left()
    logging.getLogger("mwrt.worker").info("stopped")
    return 0


def _unlink_segments_left() -> None:
    """Unlink the /dev/shm segments this daemon made that still have their names."""
    # A stream still running at the stop (serve waits a grace only) may never reach its own
    # unlink, and no reaper would: one removes a dead maker's, and this one lived as long
    # as any daemon of this host looked.
    from ..channels.segments import unlink_own

    left = unlink_own()
    if left:
        logging.getLogger("mwrt.worker").info(
            "removed %d shared-memory segment(s) left at the stop: %s", len(left),
            ", ".join(left[:20]))


def _register(args, endpoint: str) -> str:
    """Announce the daemon in the registry directory under an address masters can reach:
    --advertise, else the address it listens on, else (listening everywhere) its host name."""
    from ..netaddr import join_host_port, split_host_port
    from ..store.daemon_registry import register

    host, port = split_host_port(endpoint.removeprefix("tcp://"), "--listen")
    if args.advertise:
        host = args.advertise
    elif host in ("0.0.0.0", "::", "*"):
        host = socket.gethostname()
    path = register(args.register, join_host_port(host, port))
    print(f"mwrt-worker: registered in {path}", flush=True)
    return path


if __name__ == "__main__":
    sys.exit(main())

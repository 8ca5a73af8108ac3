"""`mwrt-worker`: start a worker daemon (`--listen HOST:PORT`, loopback by default)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from .. import config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mwrt-worker", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:7070",
                        help="HOST:PORT to serve masters on (default 127.0.0.1:7070; port 0 "
                             "picks a free one)")
    parser.add_argument("--key-file", default=config.get("key_file") or None,
                        help="CURVE/HMAC key file (from `mwrt-worker keygen DIR`); required to "
                             "listen beyond loopback or to run shipped functions")
    parser.add_argument("--log-level", default=config.get("log_level"))
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process is gone (used for local workers)")
    return parser


def keygen_main(argv) -> int:
    """`mwrt-worker keygen DIR`: write worker.key and master.key that trust each other."""
    from ..auth import keygen
    from ..errors import AuthError

    if len(argv) != 1:
        print("usage: mwrt-worker keygen DIR", file=sys.stderr)
        return 2
    try:
        worker, master = keygen(argv[0])
    except AuthError as exc:
        print(f"mwrt-worker: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {worker} (for workers: --key-file) and {master} (for the master: "
          f"MWRT_KEY_FILE or init_master_worker(key=...))")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keygen"]:
        return keygen_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s mwrt-worker[%(process)d] %(levelname)s %(message)s")
    from ..auth import load_key_file
    from ..errors import AuthError, ConfigError
    from .daemon import Daemon

    try:
        keys = load_key_file(args.key_file) if args.key_file else None
        daemon = Daemon(args.listen, keys=keys, parent_pid=args.parent_pid)
    except (AuthError, ConfigError, OSError) as exc:
        print(f"mwrt-worker: {exc}", file=sys.stderr)
        return 2

    def stop(signum, frame):
        daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"mwrt-worker: listening on {daemon.address}", flush=True)
    daemon.serve()
    logging.getLogger("mwrt.worker").info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

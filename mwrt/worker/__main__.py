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
    parser.add_argument("--log-level", default=config.get("log_level"))
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process is gone (used for local workers)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s mwrt-worker[%(process)d] %(levelname)s %(message)s")
    from ..errors import ConfigError
    from .daemon import Daemon

    try:
        daemon = Daemon(args.listen, parent_pid=args.parent_pid)
    except (ConfigError, OSError) as exc:
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

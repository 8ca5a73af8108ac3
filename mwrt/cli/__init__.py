"""`mwrt`: look at an mwrt installation from a shell (`mwrt config`; more subcommands to come)."""

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
    return parser


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

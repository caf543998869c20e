"""``python -m torch_ember <command>``: ember's command line.

Commands:
  info [--json]   versions, CPU features, every torch.backends.ember flag,
                  devices and threads (torch_ember/info.py)
"""

from __future__ import annotations

import argparse
import json
import sys


def _info(args: argparse.Namespace) -> int:
    from torch_ember import info

    report = info.collect()
    print(json.dumps(report, indent=2, default=str) if args.json else info.render(report))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m torch_ember", description="ember's tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser(
        "info", help="report versions, CPU features, flags and devices (like collect_env)"
    )
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    info.set_defaults(run=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

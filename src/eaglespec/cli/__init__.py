"""The `eaglespec` command line: one module per command, each adding its parser and a `run(args) -> int`.

A user mistake (`EaglespecError`) is printed as one line, `eaglespec: error: ...`, with exit code 2; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..errors import EaglespecError
from . import bench, chat, check, convert, generate, serve, train, tune

COMMANDS = {"generate": generate, "chat": chat, "serve": serve, "convert": convert, "check": check, "train": train,
            "bench": bench, "tune": tune}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eaglespec", description="EAGLE-3 speculative decoding engine")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(COMMANDS[args.command].run(args) or 0)
    except EaglespecError as e:
        print(f"eaglespec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The `trex` command line. One module per command; each defines `add_parser(subparsers)`.

Heavy imports (torch, transformers) happen inside each command's `run`, so `trex --help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from trex.errors import TrexError

# Command modules under trex.cli, in the order `trex --help` lists them.
COMMANDS: tuple[str, ...] = ("demo", "capture", "estimate", "plan", "calibrate", "eval", "data", "train")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trex",
        description="trex: a compiler for full-parameter post-training of large MoE LLMs.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"trex.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except TrexError as error:
        print(f"trex {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"trex {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

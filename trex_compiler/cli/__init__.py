"""The `trex` command line. One module per command; each defines `add_parser(subparsers)`.

The compiler's own commands live here (`COMMANDS`). Programs built on trex - the workloads (`trex eval`,
`trex data`, ...) or a third party's - add theirs through the entry-point group `trex.commands`
(`name = "package.module:add_parser"` in their pyproject), so this frame never imports them by name.
Heavy imports (torch, transformers) happen inside each command's `run`, so `trex --help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

from trex.errors import TrexError

# The compiler's command modules under trex.cli, in the order `trex --help` lists them.
COMMANDS: tuple[str, ...] = ("demo", "capture", "estimate", "plan", "calibrate", "train")
ENTRY_POINT_GROUP = "trex.commands"


def registered_commands() -> dict[str, Callable[[argparse._SubParsersAction], None]]:
    """Commands other packages register (entry-point group `trex.commands`), by name, sorted."""
    found = {}
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if entry.name in COMMANDS or entry.name in found:
            continue  # the compiler's own commands, and the first registration of a name, win
        found[entry.name] = entry.load()
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trex",
        description="trex: a compiler for full-parameter post-training of large MoE LLMs.",
    )
    from trex import __version__

    parser.add_argument("--version", action="version", version=f"trex {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"trex.cli.{name}").add_parser(subparsers)
    for add_parser in registered_commands().values():
        add_parser(subparsers)
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

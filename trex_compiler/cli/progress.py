"""Progress lines for the CLI's long silent stretches (model build, capture, compile), on stderr.

stdout keeps the command's result (tables, JSON); `--quiet` turns these lines off.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


def progress_printer(command: str, quiet: bool) -> Callable[[str], None]:
    """A function printing `trex COMMAND: <line>` to stderr (flushed), or doing nothing when quiet."""
    if quiet:
        return lambda line: None
    started = time.perf_counter()

    def say(line: str) -> None:
        print(f"trex {command} [{time.perf_counter() - started:5.1f} s]: {line}", file=sys.stderr, flush=True)

    return say

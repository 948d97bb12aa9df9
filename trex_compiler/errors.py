"""Errors trex raises. Each says what was wrong, with the numbers, and what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def plural(noun: str) -> str:
    """English plural of the last word of `noun` ("pass" -> "passes", "model family" -> "model families")."""
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


class TrexError(Exception):
    """Base class of every error trex raises on purpose."""


class UnknownNameError(TrexError, KeyError):
    """A name (backend, target, model, pass, ...) that trex does not know."""

    def __init__(self, kind: str, name: str, valid: Iterable[str], hint: str = ""):
        self.kind, self.name, self.valid = kind, name, sorted(valid)
        close = difflib.get_close_matches(name, self.valid, n=1)
        message = f"unknown {kind} {name!r}; valid {plural(kind)}: {', '.join(self.valid) or '(none registered)'}"
        if close:
            message += f" (did you mean {close[0]!r}?)"
        if hint:
            message += f". {hint}"
        super().__init__(message)

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class CaptureError(TrexError):
    """The model could not be captured as one graph (or at all)."""


class PassError(TrexError):
    """A pass failed; names the pass, the passes before it, and where the reproducer is."""


class BackendError(TrexError):
    """A backend was misdeclared or failed to lower what it claimed to support."""


class SettingError(TrexError):
    """What the user asked for (a memory budget, a limit) cannot be met on this graph. Raised from
    inside a pass but about the request, so the pass manager lets it through as it is rather than
    reporting a pass failure with a reproducer."""

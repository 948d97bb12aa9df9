"""Errors the OR evaluator raises on purpose: each names the file, line and field, or the URL."""

from __future__ import annotations

from trex.errors import TrexError
from trex.workloads.llm_clients.errors import ClientError as _ClientError


class OrEvalError(TrexError):
    """Base class of the OR evaluator's user-facing errors."""


class DataFormatError(OrEvalError):
    """A benchmark, prediction or results file that cannot be read as documented.

    The message always starts with `path:line` (1-based) and names the field when one is at fault.
    """

    def __init__(self, path: str, line: int | None, message: str, field: str | None = None):
        self.path, self.line, self.field = path, line, field
        where = f"{path}:{line}" if line is not None else str(path)
        what = f"field {field!r}: " if field else ""
        super().__init__(f"{where}: {what}{message}")


class UnknownBenchmarkError(OrEvalError):
    """A benchmark name that is neither a known benchmark nor an existing file."""


# A model client failed (server unreachable, retries exhausted, bad response): the shared clients' error.
ClientError = _ClientError


class RunStateError(OrEvalError):
    """An output directory holds results of a different run (other benchmark version or settings)."""

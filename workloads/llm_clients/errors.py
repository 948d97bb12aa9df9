"""The one error the LLM clients raise on purpose."""

from __future__ import annotations

from trex.errors import TrexError


class ClientError(TrexError):
    """A model client failed (server unreachable, retries exhausted, bad response)."""

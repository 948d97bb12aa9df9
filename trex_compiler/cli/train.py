"""`trex train` lives in the runtime (`trex.runtime.cli`); this module wires it into the CLI frame."""

from trex.runtime.cli import add_parser

__all__ = ["add_parser"]

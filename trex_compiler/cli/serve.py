"""`trex serve`: the serving workload's command (trex.workloads.serving.cli)."""

from trex.workloads.serving.cli import add_parser

__all__ = ["add_parser"]

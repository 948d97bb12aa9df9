"""Errors of the serving workload. Each names what was wrong, with the numbers, and what to do."""

from __future__ import annotations

from trex.errors import TrexError


class ServingError(TrexError):
    """Bad serving input: a cluster file, a workload trace, a deployment file, a flag."""


class InfeasibleError(ServingError):
    """No deployment meets the memory limits or the latency SLOs; says how close the best came."""


class WorkerError(ServingError):
    """A worker behind the router failed: unreachable, hung past its timeout, or answered garbage."""

"""Interrupted is not finished: the rule that keeps Ctrl-C from changing a score.

A result may be recorded only for a program that ran to its own end or hit its own limit. A run
the evaluator stopped (Ctrl-C, a closed sandbox, a killed worker) says nothing about the
program, so it is not a result: `Sandbox.run` raises `RunInterrupted` for it, the callers
(`trex eval`, `trex data synth/verify`) record nothing for it, and a resumed run executes it
again. Three pieces make that hold:

- the sandboxed process tree lives in a session of its own (`Sandbox.run` starts it with
  `start_new_session`), so the terminal's SIGINT/SIGQUIT/SIGHUP never reach a program: only
  the evaluator decides when a program is stopped, and then it knows;
- `Sandbox.abort()` stops every program in flight and makes their runs raise `RunInterrupted`;
- worker processes that run programs or solvers leave the terminal's session as well
  (`leave_terminal_session`), so an interrupt reaches only the coordinating process, which
  stops the workers and keeps only what they had finished.

In-process solvers must not swallow the interrupt either: SCIP's `misc/catchctrlc` (on by
default) asks it to catch SIGINT and end the solve with status "userinterrupt", which would pass
for a solver verdict. With the pyscipopt build installed here Python's handler got the signal in
every try, but `scip_without_ctrl_c` turns the setting off so that does not depend on the build.
"""

from __future__ import annotations

import os
import signal

from trex.errors import TrexError


class RunIncomplete(TrexError):
    """A run that produced no outcome of the program. Never a result: callers record nothing
    for it and a resumed run executes the program again."""


class RunInterrupted(RunIncomplete):
    """The run was stopped from outside (an interrupt, a closed sandbox) before the program ended."""


class SandboxFailed(RunIncomplete):
    """The sandbox itself failed to run the program (not the program's fault)."""


def leave_terminal_session() -> None:
    """Put this process in a session of its own and ignore SIGINT: for worker processes, which
    the coordinating process stops itself when the user interrupts it."""
    try:
        os.setsid()
    except OSError:  # already a session leader
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def scip_without_ctrl_c(model) -> None:
    """Keep SCIP from catching SIGINT in this process (its default): an interrupted solve must
    raise KeyboardInterrupt, not return status "userinterrupt" as if that were its verdict."""
    model.setParam("misc/catchctrlc", False)

"""One SCIP instance per process and purpose, emptied between problems instead of rebuilt.

`pyscipopt.Model()` creates a SCIP instance and includes every default plugin (readers,
presolvers, heuristics, separators, branching rules, ...): about 3.4 CPU ms, while solving one
of the pipeline's small models takes about 1.4 ms. The pipeline solves 6-7 models and reads
about 2 LP files per sample in-process (the plan's solve, MIP polish, certificates, IIS
deletion-filter tests, what-if checks, the LP read-back), so building the plugins dominated.

`SCIPfreeProb` (`Model.freeProb`) discards the problem, its transformed copy and the whole
solving state, and `SCIPcreateProbBasic` starts an empty one in the same instance, keeping the
included plugins and the parameters. SCIP's plugins set up their per-solve data (random number
generators from the fixed seed, statistics, the LP solver interface) when a problem is
transformed and free it when it is freed, so a problem solved in an emptied instance follows
the same path as in a new one: `tests/workloads/test_or_data_speed.py` compares status,
objective, every value, node and LP iteration counts on models of every family, and a
1000-sample run wrote the same bytes (bench/RESULTS.md section 6).

Parameters stay set between problems, so each purpose has its own instance, configured once
(the model solves run SCIP's defaults; the LP-file check runs plain branch and bound). An
instance is dropped (and rebuilt on next use) when a solve raises, e.g. on Ctrl-C, and after
`MAX_PROBLEMS` problems: pyscipopt keeps a Python wrapper per variable and constraint address
it has handed out, which `freeProb` does not clear.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

MAX_PROBLEMS = 2000

_INSTANCES: dict[str, list] = {}  # purpose -> [Model, problems created in it]


@contextlib.contextmanager
def empty_scip(purpose: str, name: str, configure: Callable[[object], None]) -> Iterator[object]:
    """An instance holding an empty problem called `name`. `configure(model)` sets the purpose's
    parameters; it runs once, when the instance is created. Use the instance, and read every result
    out of it, inside the `with` block: the next problem of the same purpose replaces this one."""
    entry = _INSTANCES.get(purpose)
    if entry is None or entry[1] >= MAX_PROBLEMS:
        from pyscipopt import Model

        scip = Model(name)
        scip.hideOutput()
        configure(scip)
        entry = _INSTANCES[purpose] = [scip, 1]
    else:
        scip = entry[0]
        scip.freeProb()
        scip.createProbBasic(name)
        entry[1] += 1
    try:
        yield scip
    except BaseException:
        # an interrupted or failed solve may leave the instance mid-stage: start over next time
        if _INSTANCES.get(purpose) is entry:
            del _INSTANCES[purpose]
        raise


def drop_all() -> None:
    """Forget every instance (they are freed with their last reference)."""
    _INSTANCES.clear()

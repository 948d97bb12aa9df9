"""Deprecated alias of `trex.planner` (the planner moved out of `passes/`: it searches configurations
over the cost model's ModelSpec, it is not a graph pass). Kept for one release; import `trex.planner`.

`import trex.passes.parallel.search` and the other submodules resolve to the `trex.planner` modules
of the same name (`planner` -> `trex.planner.planning`).
"""

from __future__ import annotations

import importlib
import sys
import warnings

warnings.warn(
    "trex.passes.parallel is deprecated; import trex.planner instead (same names)", DeprecationWarning, stacklevel=2
)

_SUBMODULES = {
    "baselines": "baselines",
    "planner": "planning",
    "pricing": "pricing",
    "reasons": "reasons",
    "search": "search",
    "space": "space",
    "stage_split": "stage_split",
    "topology": "topology",
}

for _old, _new in _SUBMODULES.items():
    sys.modules[f"{__name__}.{_old}"] = importlib.import_module(f"trex.planner.{_new}")

from trex.planner import *  # noqa: E402,F403
from trex.planner import __all__  # noqa: E402,F401

"""trex: a compiler-style graph optimization layer for full-parameter post-training of MoE LLMs.

    compiled = trex.compile(model)                     # capture, passes, lowering
    loss = compiled(input_ids=ids, labels=ids).loss    # trains like the original
    loss.backward(); optimizer.step()

See README.md and ARCHITECTURE.md for the path of a model through the compiler.

Public names are imported on first use, so `import trex` (and every `trex` command's `--help`)
does not pay for importing torch. `import trex.ops` registers the `torch.ops.trex` operators;
`trex.compile` and everything that captures does so itself.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "compile": "trex.api",
    "CompiledModule": "trex.api",
    "CompileSession": "trex.api",
    "TrexFallbackWarning": "trex.api",
    "Backend": "trex.backends",
    "available_backends": "trex.backends",
    "get_backend": "trex.backends",
    "register_backend": "trex.backends",
    "BackendError": "trex.errors",
    "CaptureError": "trex.errors",
    "PassError": "trex.errors",
    "TrexError": "trex.errors",
    "UnknownNameError": "trex.errors",
    "Decision": "trex.pass_manager",
    "Pass": "trex.pass_manager",
    "PassContext": "trex.pass_manager",
    "PassResult": "trex.pass_manager",
    "explain": "trex.explain",
    "Plan": "trex.plan",
    "plan_parallel": "trex.planner",
    "TARGETS": "trex.targets",
    "Target": "trex.targets",
}

# public sub-modules reachable as `trex.<name>` after a bare `import trex`
_SUBMODULES: dict[str, str] = {"optim": "trex.optim"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
        globals()[name] = value
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trex' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})

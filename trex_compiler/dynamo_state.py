"""Each compiled model keeps its own Dynamo automatic-dynamic memory.

Why: Dynamo remembers, per code object of the frame it compiles (`torch._dynamo.pgo`, keyed by file, line, name
and the code of the frame's closure), the sizes and the int/float attributes it saw there, and on the next compile
of that code marks whatever changed as dynamic: a SymInt instead of a constant. transformers wraps every model's
`forward` in one decorator (`utils.generic.can_return_tuple`), and models whose forward bodies are the same code
(DeepSeek-V3's and DeepSeek-V4's, generated from one modular source) share that memory. So a DeepSeek-V3 compiled
in a process that had compiled DeepSeek-V4 got V4's values of same-named attributes as "changed" (e.g.
`layers.0.self_attn.num_key_value_groups`) and captured them as SymInts on its very first compile: a different
graph than the same model compiled alone, with lowerings that need those sizes as constants not taken (bench/
RESULTS.md 12.5, "found, not fixed"; 12.6). What one model compiles must not depend on which other models the
process compiled before.

`own_automatic_dynamic_memory(holder)` swaps the compiled model's own memory in for the length of its call (a
model's recompiles still learn from its own earlier shapes, which is what automatic dynamic is for) and the
process's back afterwards. A model's first memory is empty, as in a fresh process (or what torch's PGO profile
cache holds, when one is configured: Dynamo loads it into an empty memory as it always does). The swap is of two
module globals and takes no lock: two threads compiling different models at the same moment could see each
other's memory, which changes only which sizes Dynamo treats as dynamic (every compile is still guarded), not
what the model computes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class AutomaticDynamicMemory:
    """One compiled model's Dynamo code state (what `torch._dynamo.pgo` keeps in its module globals)."""

    def __init__(self) -> None:
        self.code_state: Any = None  # None: Dynamo starts a fresh one on the first compile
        self.init_code_state: Any = None

    def __repr__(self) -> str:
        entries = 0 if self.code_state is None else len(self.code_state)
        return f"AutomaticDynamicMemory({entries} code objects)"


@contextlib.contextmanager
def own_automatic_dynamic_memory(memory: AutomaticDynamicMemory) -> Iterator[None]:
    """Run the body with `memory` as Dynamo's automatic-dynamic memory; keep what the body taught it."""
    from torch._dynamo import pgo

    previous = (pgo._CODE_STATE, pgo._INIT_CODE_STATE)
    pgo._CODE_STATE, pgo._INIT_CODE_STATE = memory.code_state, memory.init_code_state
    try:
        yield
    finally:
        memory.code_state, memory.init_code_state = pgo._CODE_STATE, pgo._INIT_CODE_STATE
        pgo._CODE_STATE, pgo._INIT_CODE_STATE = previous

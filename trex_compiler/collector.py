"""While trex compiles, Python's cyclic garbage collector skips the objects that existed before the compile.

Why: a full (generation-2) collection traverses every object the collector tracks: torch's, sympy's and
transformers' modules, the model, the caches - most of them alive long before the compile and after it.
A cold compile allocates millions of objects (FakeTensors, fx nodes, Inductor's IR and sympy expressions),
which triggers a full collection every so often: on tiny DeepSeek-V4 bf16's first call the main thread spent
6.9 s in collections, 5.2 s of it in 8 full ones (torch.compile's first call: 6.5 s; with this module trex's:
3.6 s; `bench/compile_collector.py`, bench/RESULTS.md 11, eleventh session). `gc.freeze()` moves the objects alive at the compile's start to the permanent generation,
which collections skip; `gc.unfreeze()` at the end hands them back to the oldest generation. Garbage made
during the compile is collected as before (it was not alive at the start). With the old objects frozen, the
oldest generation holds only the compile's own, so CPython's rule that defers a full collection until the
objects promoted since the last one exceed 25% of the long-lived ones no longer spaces them out (21 full
collections instead of 8); the compile therefore also runs a full collection only every `_FULL_EVERY`
second-generation collections (CPython's default: 10): 3-5 full collections, for 4% more peak RSS (722 vs
696 MiB) on that first call. Between its stages the compile
freezes again what it has built so far and keeps (`freeze_survivors`: the joint graph after the AOT trace, the
partitioned graphs), which the later stages' full collections would otherwise traverse each time.

Left alone when the process froze objects itself before the compile (`gc.get_freeze_count() > 0`, e.g. a
server that freezes before forking its workers): unfreezing at the end would undo its freeze.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_FULL_EVERY = 100  # gc threshold2 during a compile (see the module docstring)
_depth = 0  # nesting of `skip_existing_objects` (the backward may be lowered inside the forward's compile)


@contextlib.contextmanager
def skip_existing_objects() -> Iterator[None]:
    """Inside: the collector skips the objects that were alive when the outermost such block began."""
    global _depth
    if _depth == 0 and gc.get_freeze_count() > 0:  # the process's own freeze: keep it as it is
        yield
        return
    _depth += 1
    thresholds = gc.get_threshold()
    if _depth == 1:
        gc.freeze()
        gc.set_threshold(thresholds[0], thresholds[1], max(thresholds[2], _FULL_EVERY))
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.set_threshold(*thresholds)
            gc.unfreeze()


def freeze_survivors() -> None:
    """Inside `skip_existing_objects`: the collector skips from now on the objects alive now (what the compile's
    earlier stages built and still holds); outside it, nothing."""
    if _depth > 0:
        gc.freeze()

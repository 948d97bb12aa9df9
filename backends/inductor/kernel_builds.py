"""Wait for the C++ kernels Inductor builds for a graph at the graph's first call, not inside its compile.

Why: Inductor compiles a graph in two parts. The main thread lowers it (scheduling, fusion, C++ code
generation), with the compile threads idle; then, as the generated wrapper module loads, each kernel's C++
build goes to `AsyncCompile`'s compile threads (one per core, `torch._inductor.config.compile_threads`) and
the module's last statement, `async_compile.wait(globals())`, blocks the main thread until every kernel is
built and loaded. On the tiny MoE models most of a cold first call is that wait (bench/RESULTS.md 11, tenth
session: 36.6 of 46.4 s of `compile_fx_inner`), and the main thread's lowering of the next graph could run
during it. torch.compile cannot overlap them: AOTAutograd lowers the backward lazily, at the first backward
call, after the forward has waited for its kernels and run. With `InductorBackend(background_builds=True)`
trex lowers the backward right after the forward (the driver sets AOTAutograd's
`force_non_lazy_backward_lowering` for a backend with `builds_kernels_in_background`) and defers each graph's
wait to the graph's first call, so the backward's lowering runs while the forward's kernels build.

Opt-in, because on the 2-vCPU machine of bench/RESULTS.md it does not pay: the first call was 7-10% slower
(`bench/kernel_build_overlap.py`, four rounds, eleventh session). The same lowering (the same Python calls,
cProfile) took 1.6x the CPU time of the main thread while two C++ compiles ran beside it: the two vCPUs do
not give two cores' throughput, so the overlap only moves work around. It can pay where the compile threads
leave a core free for the main thread (more cores than kernels building at once); measure there with the
script before turning it on.

What deferring changes: nothing the generated code computes. The futures in the module's globals hold the
absolute paths of their sources and binaries (a cold compile's cache directory is kept,
`fresh_cache(delete=False)`); `finish` runs Inductor's own `wait` on the same globals before the wrapper's
`call` first runs, which puts each loaded kernel where the future was. A build error surfaces there, at the
first call, as a `BackendError` naming the region. Not deferred (`can_defer`): compiles that run generated code
while compiling (max-autotune's benchmarks), the C++ wrapper, and non-CPU graphs (Triton's builds go through
another pool, and no GPU has been lent to test them).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


def can_defer(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph with these inputs may have its kernel waits deferred (see the module docstring)."""
    import torch
    import torch._inductor.config as inductor_config

    if inductor_config.max_autotune or inductor_config.max_autotune_gemm or inductor_config.cpp_wrapper:
        return False
    return all(x.device.type == "cpu" for x in example_inputs if isinstance(x, torch.Tensor))


@dataclass
class KernelBuilds:
    """The waits Inductor's generated modules asked for while `deferring` was active, done by `finish`."""

    # (Inductor's AsyncCompile.wait, the module's AsyncCompile instance, the module's globals)
    waits: list[tuple[Callable[..., None], Any, dict[str, Any]]] = field(default_factory=list)
    waited_seconds: float = 0.0  # time `finish` blocked: builds that were not done by the first call
    on_finish: list[Callable[[float], None]] = field(default_factory=list)  # called with the seconds it waited

    @property
    def pending(self) -> bool:
        return bool(self.waits)

    def finish(self) -> None:
        """Block until every deferred kernel is built and loaded into its module (once; later calls return)."""
        start = time.perf_counter()
        waits, self.waits = self.waits, []
        for wait, async_compile, scope in waits:
            wait(async_compile, scope)
        seconds = time.perf_counter() - start
        self.waited_seconds += seconds
        for callback in self.on_finish:
            callback(seconds)

    @contextlib.contextmanager
    def deferring(self) -> Iterator[KernelBuilds]:
        """Inside: a generated module's `async_compile.wait(globals())` is recorded here instead of run.

        Only the calling thread compiles (Inductor's lowering is not thread-safe, and trex does not lower
        from threads); the compile threads never call `wait`."""
        from torch._inductor.async_compile import AsyncCompile

        original = AsyncCompile.wait

        def record(async_compile: Any, scope: dict[str, Any]) -> None:
            self.waits.append((original, async_compile, scope))

        AsyncCompile.wait = record  # type: ignore[method-assign]
        try:
            yield self
        finally:
            AsyncCompile.wait = original  # type: ignore[method-assign]

"""Host cost of the NVTX range naming in Megatron-LM main between 7f9f2bf750 (2025-05-16) and
158951764f (2025-06-09, "Fix perf issues with NVTX range profiling"), the window that holds
1e05700595, the commit of rows Q3-B and Q3-C.

In that window every `nvtx_range_push/pop(suffix=...)` built its range name from the caller's frame
with `inspect.getframeinfo` and `inspect.getmodule` before checking whether NVTX profiling was on, so
the lookup ran in every training step: 18 calls per MoE transformer-layer forward (attention.py 10,
transformer_layer.py 8). This times the same two stdlib lookups from a method two frames up, and an
`nn.Linear(1, 1)` forward for scale (the reference host op of `trex.cost_model.devices`, measured at
13.48 us with its CUDA launch on a DGX H100 host).

    python bench/cost_model/nvtx_name_lookup.py
"""

from __future__ import annotations

import inspect
import time

import torch

CALLS_PER_LAYER_FORWARD = 18


def _range_name() -> str:
    caller = inspect.currentframe().f_back.f_back  # type: ignore[union-attr]
    return f"{inspect.getmodule(caller).__name__}.{inspect.getframeinfo(caller).function}"  # type: ignore[union-attr]


def _push(suffix: str) -> str:
    return f"{_range_name()}.{suffix}"


class _Layer:
    def forward(self) -> str:
        return _push("qkv")


def _per_call_us(fn, n: int) -> float:
    for _ in range(n // 20):
        fn()
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    layer = _Layer()
    linear, x = torch.nn.Linear(1, 1), torch.randn(1, 1)
    lookup = min(_per_call_us(layer.forward, 20000) for _ in range(3))
    reference = min(_per_call_us(lambda: linear(x), 20000) for _ in range(3))
    print(
        f"NVTX-style range name lookup: {lookup:.1f} us per call; x {CALLS_PER_LAYER_FORWARD} calls = "
        f"{lookup * CALLS_PER_LAYER_FORWARD / 1000:.2f} ms of host time per layer forward"
    )
    print(f"for scale, nn.Linear(1, 1) forward on this CPU (no CUDA launch): {reference:.1f} us")


if __name__ == "__main__":
    main()

"""Time a low-precision GEMM node both ways on this CPU: as it is, and in fp32 on exact upcasts.

Why: "this CPU multiplies bf16 natively" (AVX512-BF16, AMX) does not say that the native kernel is the faster
one at a given shape. On the AMD EPYC (AVX512-BF16, no AMX) of bench/RESULTS.md 11 (fourteenth session),
CPU flash attention's bf16 backward took 926 us per call on tiny Qwen3-MoE's 4 x 4 heads x 32 x 16 against
96 us in fp32, and a bf16 `mm` of 32 x 64 x 64 12.5 us against 3.9 us in fp32 - oneDNN's fixed cost per call
at small shapes - while on the Intel AMX CPU of earlier sessions the native kernels were the fast ones. So
`passes.cpu_gemm_precision` asks, per GEMM on a CPU with native units, what both forms cost here, the way
Inductor's max-autotune times GEMM candidates: the node's own op on random operands of the node's shapes,
strides and dtypes, against the same op in fp32 on upcasts of them, the conversions (in and out) included -
in generated code a conversion is usually fused into the operand's producer, so the fp32 form is priced
conservatively. Each distinct (op, operand layouts, other arguments) is timed once per process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

_CACHE: dict[tuple, tuple[float, float]] = {}


def example_tensor(value: torch.Tensor) -> torch.Tensor:
    """A CPU tensor with `value`'s shape, strides and dtype (overlapping strides such as expands included):
    standard normal values for floating dtypes, zeros otherwise."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(value.shape, value.stride()) if size > 0)
    if value.numel() == 0:
        span = 0
    if value.is_floating_point():
        storage = torch.randn(span, dtype=torch.float32).to(value.dtype)
    else:
        storage = torch.zeros(span, dtype=value.dtype)
    return storage.as_strided(tuple(value.shape), tuple(value.stride()))


def best_seconds_per_call(call: Callable[[], Any], rounds: int, calls: int) -> float:
    """Seconds per call: the fastest of `rounds` rounds of `calls` calls, after two warm-up calls (oneDNN
    creates and caches its primitive for a shape at the first call)."""
    call()
    call()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def _key(node: fx.Node) -> tuple:
    def layout(arg: Any) -> Any:
        if isinstance(arg, fx.Node):
            value = arg.meta.get("val")
            if isinstance(value, torch.Tensor):
                return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype)
            return ("node", repr(value))
        return repr(arg)

    return (
        str(node.target),
        tuple(layout(a) for a in node.args),
        tuple((k, layout(v)) for k, v in sorted(node.kwargs.items())),
    )


def native_and_upcast_seconds(
    node: fx.Node, upcast_form: Callable[..., Any], inputs: Sequence[fx.Node], rounds: int = 3, calls: int = 3
) -> tuple[float, float] | None:
    """(seconds per call of `node`'s op as it is, of `upcast_form(*inputs)`), both on example operands;
    None when an operand has no tensor value to build one from (the pass then keeps the node as it is)."""
    key = _key(node)
    if key in _CACHE:
        return _CACHE[key]
    # Real tensors on this CPU, timed as generated code calls them: a pass may run under the pass manager's
    # FakeTensorMode (or a tracing mode), which would time the fake kernels instead, and inside the capture's
    # Python dispatcher and torch-function handling, which add their own cost to every op a form calls
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch._C.DisableTorchFunction(), torch._C._DisablePythonDispatcher():
        _CACHE[key] = _time_both(node, upcast_form, inputs, rounds, calls)
    return _CACHE[key]


def _time_both(
    node: fx.Node, upcast_form: Callable[..., Any], inputs: Sequence[fx.Node], rounds: int, calls: int
) -> tuple[float, float] | None:
    examples: dict[fx.Node, torch.Tensor] = {}
    for arg in node.all_input_nodes:
        value = arg.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            return None
        examples[arg] = example_tensor(value)
    args = fx.node.map_arg(node.args, lambda a: examples[a])
    kwargs = fx.node.map_arg(node.kwargs, lambda a: examples[a])
    operands = [examples[a] for a in inputs]
    with torch.no_grad():
        native = best_seconds_per_call(lambda: node.target(*args, **kwargs), rounds, calls)
        upcast = best_seconds_per_call(lambda: upcast_form(*operands), rounds, calls)
    return native, upcast

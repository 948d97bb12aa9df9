"""CPU flash attention's backward in bf16 three ways, at the tiny models' shapes: what cpu_gemm_precision weighs.

    python bench/cpu_ops/attention_backward_forms.py

1. native: `aten._scaled_dot_product_flash_attention_for_cpu_backward` on the bf16 operands;
2. whole fp32: the same op on whole-operand fp32 upcasts, gradients rounded back to bf16;
3. chunked fp32: `trex.extern_flash_attention_backward_on_upcasts` (fp32 copies of a few heads at a time, the
   form trex compiles in when 2 is timed faster than 1).

The operands have the layouts tiny Qwen3-MoE's graph gives them (q and the output gradient [B, S, H, D] in memory,
GQA keys and values expanded, an additive bf16 mask, logsumexp [B, S, H] in memory). Times are wall microseconds
per call, best of 5 rounds of 20 calls after two warm-up calls, one torch thread; ratios are native / form.
"""

from __future__ import annotations

import torch

import trex.ops  # noqa: F401 - registers torch.ops.trex
from trex.passes.cpu_gemm_precision.timing import best_seconds_per_call  # the timing the pass itself uses

BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def best_us(call) -> float:
    return best_seconds_per_call(call, rounds=5, calls=20) * 1e6


def operands(batch: int, heads: int, kv_heads: int, seq: int, dim: int):
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    q = torch.randn(batch, seq, heads, dim, dtype=bf16).transpose(1, 2)
    kv = torch.randn(batch, kv_heads, 1, seq, dim, dtype=bf16)
    k = kv.expand(batch, kv_heads, heads // kv_heads, seq, dim).reshape(batch, heads, seq, dim)
    v = (kv * 0.5).expand(batch, kv_heads, heads // kv_heads, seq, dim).reshape(batch, heads, seq, dim)
    causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    mask = torch.zeros(batch, 1, seq, seq, dtype=bf16).masked_fill(causal, float("-inf"))
    out, lse = FORWARD(q, k, v, 0.0, False, attn_mask=mask, scale=dim**-0.5)
    grad = torch.randn(batch, seq, heads, dim, dtype=bf16).transpose(1, 2)
    return grad, q, k, v, out, lse, mask, dim**-0.5


def main() -> None:
    torch.set_num_threads(1)
    shapes = {"tiny qwen3-moe (4 x 4 heads x 32 x 16, 2 kv heads)": (4, 4, 2, 32, 16)}
    for name, shape in shapes.items():
        grad, q, k, v, out, lse, mask, scale = operands(*shape)
        forms = {
            "native bf16": lambda: BACKWARD(grad, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=scale),
            "whole fp32": lambda: [
                t.bfloat16()
                for t in BACKWARD(
                    grad.float(),
                    q.float(),
                    k.float(),
                    v.float(),
                    out.float(),
                    lse,
                    0.0,
                    False,
                    attn_mask=mask.float(),
                    scale=scale,
                )
            ],
            "chunked fp32 (trex)": lambda: torch.ops.trex.extern_flash_attention_backward_on_upcasts(
                grad, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=scale
            ),
        }
        times = {form: best_us(call) for form, call in forms.items()}
        print(name)
        for form, us in times.items():
            print(f"  {form:>20}: {us:8.1f} us per call, native / this {times['native bf16'] / us:.2f}x")


if __name__ == "__main__":
    main()

"""The two CPU facts behind trex's cpu_gemm_precision and decompose_moe passes, measured side by side.

    python bench/cpu_ops/gemm_precision_and_op_overhead.py

1. bf16 GEMMs (and CPU flash attention) against the fp32 GEMM on exact upcasts rounded back to bf16,
   at the tiny models' shapes: on CPUs without AVX512-BF16/AMX the bf16 path is the slow one.
2. One grouped GEMM (256 rows, 8 experts, 64 x 64) called as the `trex.grouped_mm` custom op, as the
   autograd-free `trex.extern_grouped_mm`, and as `aten._grouped_mm` directly: the custom-op wrapper's
   cost per call.

Times are CPU time of the calling thread (one torch thread), median of 7 repeats of N calls each, so
other processes on a shared machine inflate them less than wall time.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

import trex.ops  # noqa: F401 - registers torch.ops.trex

CALLS = 100


def cpu_us(fn, calls: int = CALLS) -> float:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(7):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        samples.append((time.thread_time() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16 {native}")
    print("\n| op | shape | bf16 us | fp32 on upcasts, rounded to bf16 us | speedup |")
    print("|---|---|---|---|---|")
    for m, k, n in [(32, 64, 64), (32, 64, 128), (128, 64, 64), (128, 64, 128), (256, 64, 128)]:
        a, b = torch.randn(m, k).bfloat16(), torch.randn(k, n).bfloat16()
        slow = cpu_us(lambda: a @ b)
        fast = cpu_us(lambda: (a.float() @ b.float()).bfloat16())
        print(f"| mm | {m}x{k} @ {k}x{n} | {slow:.1f} | {fast:.1f} | {slow / fast:.1f}x |")
    q, k, v = (torch.randn(4, 4, 32, 32).bfloat16().requires_grad_() for _ in range(3))
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))

    def attention(q, k, v):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum().backward()

    slow = cpu_us(lambda: attention(q, k, v), calls=20)
    fast = cpu_us(lambda: attention(q32, k32, v32), calls=20)
    print(f"| SDPA fwd+bwd | 4 x 4 heads x 32 x 32 | {slow:.1f} | {fast:.1f} (fp32 operands) | {slow / fast:.1f}x |")

    x, w = torch.randn(256, 64), torch.randn(8, 64, 64)
    offsets = torch.arange(32, 257, 32, dtype=torch.int32)
    print("\n| grouped GEMM 256 rows, 8 experts, 64 x 64, fp32 | us per call |")
    print("|---|---|")
    for name, fn in (
        ("trex.grouped_mm (torch.library.custom_op)", lambda: torch.ops.trex.grouped_mm(x, w, offsets)),
        ("trex.extern_grouped_mm (plain dispatcher kernel)", lambda: torch.ops.trex.extern_grouped_mm(x, w, offsets)),
        ("aten._grouped_mm", lambda: torch._grouped_mm(x, w, offs=offsets)),
    ):
        print(f"| {name} | {cpu_us(fn):.1f} |")


if __name__ == "__main__":
    main()

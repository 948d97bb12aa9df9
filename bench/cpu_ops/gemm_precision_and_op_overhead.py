"""The two CPU facts behind trex's cpu_gemm_precision and decompose_moe passes, measured side by side.

    python bench/cpu_ops/gemm_precision_and_op_overhead.py

1. bf16 GEMMs (and CPU flash attention) against the fp32 GEMM on exact upcasts rounded back to bf16,
   at the tiny models' shapes: on CPUs without AVX512-BF16/AMX the bf16 path is the slow one.
2. One grouped GEMM (256 rows, 8 experts, 64 x 64) called as the `trex.grouped_mm` custom op, as the
   autograd-free `trex.extern_grouped_mm`, and as `aten._grouped_mm` directly: the custom-op wrapper's
   cost per call.
3. The same grouped GEMM, forward and weight-gradient forms, inside an Inductor-compiled function: as the fallback
   kernel Inductor makes of `trex.extern_grouped_mm(_weight_grad)` by default (its generated code calls the op,
   the dispatcher runs its Python body) and with trex's lowering (`backends.inductor.grouped_mm_lowering`: the
   generated code calls `torch._grouped_mm` itself), against `torch._grouped_mm` called directly.

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
    inductor_grouped_mm_calls(x, w, offsets)


def inductor_grouped_mm_calls(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> None:
    """Part 3 (see the module docstring). The fallback is compiled first: trex's lowering, once registered,
    stays in Inductor's table for the rest of the process."""
    import torch._inductor.config as inductor_config

    from trex.backends.inductor.grouped_mm_lowering import register_grouped_mm_lowerings

    a, b = torch.randn(x.size(0), x.size(1)), torch.randn(x.size(0), w.size(-1))

    def forward(x, w, offsets):
        return torch.ops.trex.extern_grouped_mm(x, w, offsets)

    def weight_grad(a, b, offsets):
        return torch.ops.trex.extern_grouped_mm_weight_grad(a, b, offsets)

    def compiled(fn):
        torch._dynamo.reset()
        return torch.compile(fn, backend="inductor", fullgraph=True)

    rows = {}
    with inductor_config.patch(force_disable_caches=True):
        fallback = (compiled(forward), compiled(weight_grad))
        rows["Inductor, fallback kernel (the op's Python body)"] = (
            cpu_us(lambda: fallback[0](x, w, offsets)),
            cpu_us(lambda: fallback[1](a, b, offsets)),
        )
        register_grouped_mm_lowerings()
        lowered = (compiled(forward), compiled(weight_grad))
        rows["Inductor, trex's lowering (torch._grouped_mm in the generated code)"] = (
            cpu_us(lambda: lowered[0](x, w, offsets)),
            cpu_us(lambda: lowered[1](a, b, offsets)),
        )
    rows["torch._grouped_mm called directly"] = (
        cpu_us(lambda: torch._grouped_mm(x, w, offs=offsets)),
        cpu_us(lambda: torch._grouped_mm(a.t(), b, offs=offsets)),
    )
    print("\n| inside a compiled function, fp32 | forward form us per call | weight-gradient form us per call |")
    print("|---|---|---|")
    for name, (fwd, wgrad) in rows.items():
        print(f"| {name} | {fwd:.1f} | {wgrad:.1f} |")


if __name__ == "__main__":
    main()

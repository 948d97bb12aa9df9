"""Why cpu_gemm_precision upcasts grouped GEMMs even on CPUs with native bf16 units: the cost of a GEMM
shape met for the first time.

    python bench/cpu_ops/bf16_gemm_new_shapes.py

A grouped GEMM runs one GEMM per expert with that expert's row count, which the routing changes every
step. PyTorch's native bf16 CPU GEMM goes through oneDNN, which generates a kernel per problem shape and
caches it (oneDNN's primitive cache); the fp32 GEMM on exact upcasts (rounded back to bf16) does not
generate kernels. For each path it prints the CPU time per call (one torch thread, calling thread only,
so other processes on a shared machine inflate it less than wall time) for

1. one fixed shape (128 x 64 @ 64 x 64, called 200 times: the cached case),
2. row counts 1..119, each new to the process (the first step of a routing that moves),
3. the same row counts again (the cache warm),
4. `aten._grouped_mm` over 8 experts with random offsets drawn anew each call, against its fp32 form.

On a CPU without AVX512-BF16 / AMX there is no generated bf16 kernel and row 2 shows the slow bf16 path
rather than the shape cost; the script prints which CPU it ran on.
"""

from __future__ import annotations

import time

import torch


def cpu_us_per_call(fn, inputs) -> float:
    start = time.thread_time()
    for x in inputs:
        fn(x)
    return (time.thread_time() - start) / len(inputs) * 1e6


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    weight = torch.randn(64, 64).bfloat16()
    native = torch.mm
    upcast = lambda x: torch.mm(x.float(), weight.float()).bfloat16()  # noqa: E731
    rows = lambda counts: [torch.randn(m, 64).bfloat16() for m in counts]  # noqa: E731
    print(
        f"torch {torch.__version__}; AVX512-BF16 {torch.cpu._is_avx512_bf16_supported()}, "
        f"AMX {torch.cpu._is_amx_tile_supported()}; CPU us per call (thread time)\n"
    )
    print("| case | native bf16 | fp32 on upcasts, rounded | bf16 / fp32 |")
    print("|---|---|---|---|")
    cases = [
        ("fixed shape 128x64 @ 64x64, 200 calls", rows([128] * 200)),
        ("row counts 1..119, each new", rows(range(1, 120))),
        ("row counts 1..119 again (cached)", rows(range(1, 120))),
    ]
    for name, inputs in cases:
        a = cpu_us_per_call(lambda x: native(x, weight), inputs)
        b = cpu_us_per_call(upcast, inputs)
        print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.1f}x |")
    experts = torch.randn(8, 64, 32).bfloat16()
    tokens = torch.randn(256, 64).bfloat16()
    offsets = []
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):  # 8 cumulative expert row counts summing to 256, new each call
        cuts = torch.randint(0, 257, (7,), generator=generator).sort().values
        offsets.append(torch.cat([cuts, torch.tensor([256])]).to(torch.int32))
    a = cpu_us_per_call(lambda offs: torch._grouped_mm(tokens, experts, offs=offs), offsets)
    b = cpu_us_per_call(lambda offs: torch._grouped_mm(tokens.float(), experts.float(), offs=offs).bfloat16(), offsets)
    print(f"| aten._grouped_mm 256x64 @ 8x64x32, new offsets each call | {a:.1f} | {b:.1f} | {a / b:.1f}x |")


if __name__ == "__main__":
    main()

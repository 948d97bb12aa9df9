"""What upcasting a bf16 grouped GEMM one expert at a time costs and saves, against upcasting whole operands.

    python bench/cpu_ops/grouped_gemm_upcast_forms.py

cpu_gemm_precision runs a bf16 grouped GEMM as fp32 GEMMs on exact upcasts (bench/cpu_ops/
bf16_gemm_new_shapes.py says why). Two ways to do it:

* whole: upcast every operand, one `aten._grouped_mm` in fp32, round the whole result (the eighth session's
  form; a code generator fuses the converts, but the fp32 copies of all experts' weights, all sorted rows and
  the whole result are alive around the GEMM);
* per group: `trex.extern_aten_grouped_mm` on the bf16 operands, which upcasts one expert's slices, multiplies
  and rounds that expert's rows before the next (the ninth session's form).

For the tiny models' expert GEMMs (256 sorted rows = 128 tokens x top-2, 8 experts, hidden 64, expert width
64 / 32), in both forms the MoE layer uses (rows grouped: forward and data gradient; reduction grouped: weight
gradient), it prints the CPU time per call (one torch thread, the calling thread's CPU time, median of 7
batches of 200 calls) and the most memory the CPU allocator held during one call above what it held before
(torch.profiler memory events, the measure bench/compile_and_step.py uses for a step), and checks that
both forms give the same bits.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from compile_and_step import peak_step_bytes  # noqa: E402 - the bench's own memory measure

from trex.ops import moe_decompositions  # noqa: E402, F401 - registers trex.extern_aten_grouped_mm


def whole(mat_a, mat_b, offs):
    return torch._grouped_mm(mat_a.float(), mat_b.float(), offs=offs).to(mat_a.dtype)


def per_group(mat_a, mat_b, offs):
    return torch.ops.trex.extern_aten_grouped_mm(mat_a, mat_b, offs)


def cpu_us(fn, args) -> float:
    for _ in range(20):
        fn(*args)
    batches = []
    for _ in range(7):
        start = time.thread_time()
        for _ in range(200):
            fn(*args)
        batches.append((time.thread_time() - start) / 200 * 1e6)
    return statistics.median(batches)


def peak_bytes(fn, args) -> int:
    return peak_step_bytes(types.SimpleNamespace(step=lambda: fn(*args)))


def main() -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    rows, experts, hidden = 256, 8, 64
    ids = torch.randint(0, experts, (rows,), generator=generator).sort().values
    offs = torch.searchsorted(ids, torch.arange(experts), right=True).to(torch.int32)
    cases = []
    for width in (64, 32):  # gate_up (2 x 32) and down's expert widths of the tiny models
        tokens = torch.randn(rows, hidden, generator=generator).bfloat16()
        weight = torch.randn(experts, hidden, width, generator=generator).bfloat16()
        grad = torch.randn(rows, width, generator=generator).bfloat16()
        cases.append((f"rows grouped [{rows},{hidden}] x [{experts},{hidden},{width}]", (tokens, weight, offs)))
        cases.append((f"reduction grouped [{hidden},{rows}] x [{rows},{width}]", (tokens.t(), grad, offs)))
    print(f"torch {torch.__version__}, 1 thread, load average {os.getloadavg()[0]:.1f}")
    print("| GEMM (bf16) | CPU us per call: whole / per group | peak KiB per call: whole / per group | same bits |")
    print("|---|---|---|---|")
    for name, args in cases:
        same = torch.equal(whole(*args)[: int(offs[-1])], per_group(*args)[: int(offs[-1])])
        print(
            f"| {name} | {cpu_us(whole, args):.1f} / {cpu_us(per_group, args):.1f} | "
            f"{peak_bytes(whole, args) / 1024:.1f} / {peak_bytes(per_group, args) / 1024:.1f} | {same} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

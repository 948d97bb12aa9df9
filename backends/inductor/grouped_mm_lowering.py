"""Inductor lowerings for trex's extern grouped GEMMs: the generated code calls `aten._grouped_mm` itself.

`passes.decompose_moe` writes an fp32 grouped GEMM as `trex.extern_grouped_mm(_weight_grad)` because
aten's meta function for `_grouped_mm` - the one tracing runs - takes bf16 only, although its kernels also
compute fp32. Left to Inductor's default handling, such an op is a fallback kernel: the generated code calls
`torch.ops.trex.extern_grouped_mm`, the dispatcher boxes the arguments into the Python body
(`trex.ops.moe.grouped_mm_compute`), which checks dtypes, converts the offsets and calls `torch._grouped_mm`.
That detour costs ~6.5 us of CPU time per call inside generated code (a compiled fp32 grouped GEMM of 256 rows,
8 experts, 64 x 64: 82.8 -> 76.2 us in the forward form, 85.9 -> 79.4 us in the weight-gradient form;
`bench/cpu_ops/gemm_precision_and_op_overhead.py`, bench/RESULTS.md section 11, thirteenth session) - 24 calls
per tiny Qwen3-MoE fp32 step, ~0.16 ms of a ~5.5 ms step.

Tracing is over once Inductor lowers the graph: its lowering of `aten._grouped_mm` (`ExternKernelChoice`
`aten__grouped_mm`) computes the output's layout itself and never runs the meta function. So each extern op
is lowered to that same extern kernel on the operands the Python body would hand it (the weight gradient's
`a` transposed as a view, the offsets as int32), and the generated code calls `torch._grouped_mm` directly:
the same kernel on the same operands, so the values are bit-identical. Operands the body would not send to
`torch._grouped_mm` (other dtypes, mixed dtypes) keep the fallback and its per-group loop.

fp32 operands on the CPU go to trex's own grouped GEMM kernel instead where it was measured faster at the node's
shapes and strides (`cpu_grouped_gemm`: one C++ call for every expert, where aten calls oneMKL once per
expert); the generated code then calls it with the output buffer Inductor allocated.
"""

from __future__ import annotations

import functools

import torch

# The dtypes whose equal-dtype operands `trex.ops.moe.grouped_mm_compute` hands to `torch._grouped_mm`.
_ATEN_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def register_grouped_mm_lowerings() -> None:
    """Register the two lowerings in Inductor's table (once per process; trex's own ops only)."""
    from torch import fx
    from torch._inductor import ir
    from torch._inductor.kernel.mm_grouped import aten__grouped_mm, grouped_mm_args
    from torch._inductor.lowering import fallback_handler, lowerings, register_lowering, to_dtype
    from torch._inductor.select_algorithm import ExternKernelChoice
    from torch._inductor.virtualized import V

    import trex.ops.moe_decompositions  # noqa: F401 - defines the trex.extern_* ops
    from trex.backends.inductor import cpu_grouped_gemm

    aten = torch.ops.aten
    trex = torch.ops.trex
    kernel_forward = ExternKernelChoice(cpu_grouped_gemm.grouped_mm, name="trex_cpu_grouped_mm")
    kernel_weight_grad = ExternKernelChoice(
        cpu_grouped_gemm.grouped_mm_weight_grad, name="trex_cpu_grouped_mm_weight_grad"
    )

    def aten_kernel_takes(mat_a: ir.IRNode, mat_b: ir.IRNode) -> bool:
        return mat_a.get_dtype() in _ATEN_KERNEL_DTYPES and mat_a.get_dtype() == mat_b.get_dtype()

    def on_trex_kernel(weight_grad: bool) -> bool:
        """Whether the FX node being lowered is a grouped GEMM the region's placement put on trex's kernel."""
        node = V.graph.current_node
        values = [arg.meta.get("val") if isinstance(arg, fx.Node) else None for arg in node.args[:3]]
        if not all(isinstance(v, torch.Tensor) for v in values):
            return False
        return cpu_grouped_gemm.on_kernel(values[0], values[1], values[2].shape[0], weight_grad)

    def trex_grouped_mm(choice, operands, size):
        offsets = operands[2]
        if offsets.get_dtype() != torch.int32:
            offsets = to_dtype(offsets, torch.int32)
        inputs = [ir.ExternKernel.realize_input(x) for x in (*operands[:2], offsets)]
        layout = ir.FixedLayout(operands[0].get_device(), torch.float32, size)
        return choice.bind(inputs, layout).output_node()

    def aten_grouped_mm(mat_a, mat_b, offsets):
        if offsets.get_dtype() != torch.int32:
            offsets = to_dtype(offsets, torch.int32)
        _, _, layout, mat_a, mat_b, offsets = grouped_mm_args(mat_a, mat_b, offsets)
        offsets = ir.ExternKernel.realize_input(offsets)
        return aten__grouped_mm.bind([mat_a, mat_b, offsets], layout).output_node()

    @register_lowering(trex.extern_grouped_mm.default, type_promotion_kind=None)
    def extern_grouped_mm(input, weight, offsets):
        if not aten_kernel_takes(input, weight):
            return fallback_handler(trex.extern_grouped_mm.default, add_to_fallback_set=False)(input, weight, offsets)
        if on_trex_kernel(weight_grad=False):
            return trex_grouped_mm(
                kernel_forward, (input, weight, offsets), [input.get_size()[0], weight.get_size()[2]]
            )
        return aten_grouped_mm(input, weight, offsets)

    @register_lowering(trex.extern_grouped_mm_weight_grad.default, type_promotion_kind=None)
    def extern_grouped_mm_weight_grad(a, b, offsets):
        if not aten_kernel_takes(a, b):
            return fallback_handler(trex.extern_grouped_mm_weight_grad.default, add_to_fallback_set=False)(
                a, b, offsets
            )
        if on_trex_kernel(weight_grad=True):
            size = [offsets.get_size()[0], a.get_size()[1], b.get_size()[1]]
            return trex_grouped_mm(kernel_weight_grad, (a, b, offsets), size)
        return aten_grouped_mm(lowerings[aten.permute.default](a, [1, 0]), b, offsets)

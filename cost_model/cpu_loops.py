"""How many loop iterations PyTorch's CPU TensorIterator pays for an element-wise op.

A CPU element-wise kernel walks its operands as TensorIterator lays them out: it orders the
dimensions innermost-first by the input strides (`reorder_dimensions`), merges neighbours whose
strides chain in every operand (`coalesce_dimensions`), and then calls a 2-D loop over the two
innermost dimensions once per index of the rest, which runs a vectorised 1-D loop per row. Two
small tensors with the same bytes can therefore cost very differently: (1024, 2) rows of a
non-coalescable layout pay 1024 row setups; a broadcast in a middle dimension leaves even the
second dimension uncoalesced and pays a 2-D loop call every two rows. `DeviceProfile.op_time`
charges `row_overhead_ns` per row and `loop_call_overhead_ns` per 2-D call beyond the first,
both measured by `trex calibrate`; on accelerators they are zero (one kernel launch does it all).

The emulation follows TensorIterator's rules (at::TensorIteratorBase::reorder_dimensions and
coalesce_dimensions, PyTorch 2.x) from shapes and strides alone, so it works on FakeTensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Operand = tuple[Sequence[int], Sequence[int]]  # (shape, strides in elements)


def tensor_iterator_loops(operands: Sequence[Operand]) -> tuple[int, int]:
    """(rows, calls): inner 1-D loops and 2-D loop calls one element-wise kernel runs.

    `operands` lists the tensors that decide the layout: the inputs, preceded by the output when
    it exists before the kernel runs (copies into a given layout); a freshly allocated output
    follows the inputs and never breaks coalescing. A contiguous op gives (1, 1).
    """
    ndim = max((len(shape) for shape, _ in operands), default=0)
    shape = [1] * ndim
    for op_shape, _ in operands:
        for i, size in enumerate(op_shape):
            if size != 1:
                shape[ndim - len(op_shape) + i] = size
    numel = 1
    for size in shape:
        numel *= size
    if numel == 0 or ndim == 0:
        return (0, 0) if numel == 0 else (1, 1)
    strides = []
    for op_shape, op_strides in operands:  # broadcast: stride 0 where the operand has size 1
        aligned = [0] * ndim
        for i, (size, stride) in enumerate(zip(op_shape, op_strides)):
            aligned[ndim - len(op_shape) + i] = stride if size != 1 else 0
        strides.append(aligned)

    def should_swap(dim0: int, dim1: int) -> int:  # 1: dim0 goes outside dim1, -1: inside, 0: undecided
        for stride in strides:
            a, b = stride[dim0], stride[dim1]
            if a == 0 or b == 0:
                continue
            if a != b:
                return -1 if a < b else 1
            if shape[dim0] > shape[dim1]:
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))  # innermost first
    for i in range(1, ndim):  # insertion sort that tolerates undecided comparisons, as TensorIterator does
        moving = i
        for j in range(i - 1, -1, -1):
            order = should_swap(perm[j], perm[moving])
            if order > 0:
                perm[j], perm[moving] = perm[moving], perm[j]
                moving = j
            elif order < 0:
                break
    sizes: list[int] = []
    merged: list[list[int]] = [[] for _ in strides]
    for dim in perm:
        size = shape[dim]
        if sizes and (sizes[-1] == 1 or size == 1 or all(m[-1] * sizes[-1] == s[dim] for m, s in zip(merged, strides))):
            if sizes[-1] == 1:
                for m, s in zip(merged, strides):
                    m[-1] = s[dim]
            sizes[-1] *= size
            continue
        sizes.append(size)
        for m, s in zip(merged, strides):
            m.append(s[dim])
    inner = sizes[0]
    second = sizes[1] if len(sizes) > 1 else 1
    return numel // inner, numel // (inner * second)


def _layout(value: Any) -> Operand | None:
    shape, stride = getattr(value, "shape", None), getattr(value, "stride", None)
    if shape is None or stride is None:
        return None
    try:
        return tuple(int(s) for s in shape), tuple(int(s) for s in stride())
    except (TypeError, RuntimeError):  # symbolic sizes or a layout without strides
        return None


def node_loops(node: Any, output_first: bool) -> tuple[int, int]:
    """`tensor_iterator_loops` of an fx node from its FakeTensor metadata ((1, 1) when unknown)."""
    from trex.cost_model.op_formulas import node_inputs, node_outputs

    operands = []
    if output_first:
        outputs = node_outputs(node)
        layout = _layout(outputs[0]) if outputs else None
        if layout is None:
            return 1, 1
        operands.append(layout)
    for tensor in node_inputs(node):
        layout = _layout(tensor)
        if layout is None:
            return 1, 1
        operands.append(layout)
    return tensor_iterator_loops(operands) if operands else (1, 1)

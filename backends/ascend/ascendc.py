"""AscendC kernel emission for fused pointwise groups that no torch_npu operator covers.

`find_fusion_groups(gm, skip)` collects connected groups of elementwise aten nodes (every tensor
they read or write has the group's element count; scalars are constants). `emit_kernel(group)`
writes an AscendC C++ kernel for a group: the elements split evenly across the vector cores, each
core's share walked in tiles sized to the unified buffer (UB) with double buffering (two buffers per
input/output queue, so the copy-in of tile i+1 overlaps the compute of tile i), the compute written
with AscendC vector instructions in float32 (bf16/fp16 inputs are cast up once, outputs cast down).
`TilingModel` is the same tiling in Python: `run_numpy` walks the same blocks and tiles over numpy
arrays, computing each tile with the same instruction sequence, so the tiling logic (coverage, tails,
UB budget) is checked on CPU against eager. `compile_kernel` calls CANN's compiler when one is
installed and otherwise says why compilation was skipped.

Device facts (`VECTOR_CORES`): Atlas A2 (910B) and the 910C dies have 48 AI vector cores with a
192 KiB unified buffer each (Ascend C programming guide, "hardware architecture" / platform
`GetCoreMemSize(UB)`); DataCopy moves 32-byte blocks, so tiles are multiples of 32 bytes.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx

aten = torch.ops.aten
BUFFER_NUM = 2  # double buffering
ALIGN_BYTES = 32


@dataclass(frozen=True)
class VectorCoreProfile:
    name: str
    vector_cores: int
    ub_bytes: int


VECTOR_CORES = {
    "ascend-910b": VectorCoreProfile("ascend-910b", 48, 192 * 1024),
    "ascend-910c": VectorCoreProfile("ascend-910c", 48, 192 * 1024),
    "cloudmatrix384": VectorCoreProfile("cloudmatrix384", 48, 192 * 1024),
}

_C_TYPES = {torch.float32: "float", torch.bfloat16: "bfloat16_t", torch.float16: "half"}


# ---------------------------------------------------------------------------------------------
# The elementwise ops a group may hold: how numpy computes them and which AscendC instructions do.
# Values inside a kernel are float32 tensors; a boolean is a float 0/1 mask.


def _sigmoid(a):
    return (1.0 / (1.0 + np.exp(-a))).astype(np.float32)


@dataclass(frozen=True)
class ElementwiseOp:
    numpy: Callable[..., np.ndarray]
    ascendc: Callable[[str, list[str], list[Any]], list[str]]  # (dst, tensor operands, scalar operands) -> C++ lines


def _binary(tensor_tensor: str, tensor_scalar: str | None, numpy_fn, scalar_map=lambda s: s):
    def emit(dst, tensors, scalars):
        if len(tensors) == 2:
            return [f"{tensor_tensor}({dst}, {tensors[0]}, {tensors[1]}, len);"]
        return [f"{tensor_scalar}({dst}, {tensors[0]}, (float){scalar_map(scalars[0])!r}, len);"]

    return ElementwiseOp(numpy_fn, emit)


def _compare(mode: str, numpy_fn):
    def emit(dst, tensors, scalars):
        return [
            f"CompareScalar(maskBuf, {tensors[0]}, (float){scalars[0]!r}, CMPMODE::{mode}, len);",
            f"Select({dst}, maskBuf, oneBuf, zeroBuf, SELMODE::VSEL_TENSOR_TENSOR_MODE, len);",
        ]

    return ElementwiseOp(lambda a, s: numpy_fn(a, s).astype(np.float32), emit)


def _sigmoid_lines(dst, src):
    return [
        f"Muls({dst}, {src}, -1.0f, len);",
        f"Exp({dst}, {dst}, len);",
        f"Adds({dst}, {dst}, 1.0f, len);",
        f"Reciprocal({dst}, {dst}, len);",
    ]


def _clamp_emit(dst, tensors, scalars):
    low, high = scalars
    lines, src = [], tensors[0]
    if low is not None:
        lines.append(f"Maxs({dst}, {src}, (float){low!r}, len);")
        src = dst
    if high is not None:
        lines.append(f"Mins({dst}, {src}, (float){high!r}, len);")
        src = dst
    return lines or [f"Adds({dst}, {src}, 0.0f, len);"]


def _clamp_numpy(a, low, high):
    return np.clip(a, -np.inf if low is None else low, np.inf if high is None else high).astype(np.float32)


def _silu_backward_emit(dst, tensors, scalars):
    grad, x = tensors
    return [
        *_sigmoid_lines("tmpA", x),  # s = sigmoid(x)
        "Duplicate(tmpB, 1.0f, len);",
        "Sub(tmpB, tmpB, tmpA, len);",  # 1 - s
        f"Mul(tmpB, tmpB, {x}, len);",
        "Adds(tmpB, tmpB, 1.0f, len);",  # 1 + x (1 - s)
        "Mul(tmpB, tmpB, tmpA, len);",
        f"Mul({dst}, tmpB, {grad}, len);",
    ]


def _silu_backward_numpy(grad, x):
    s = _sigmoid(x)
    return (grad * s * (1 + x * (1 - s))).astype(np.float32)


ELEMENTWISE: dict[Any, ElementwiseOp] = {
    aten.add.Tensor: _binary("Add", "Adds", lambda a, b: (a + b).astype(np.float32)),
    aten.sub.Tensor: _binary("Sub", "Adds", lambda a, b: (a - b).astype(np.float32), scalar_map=lambda s: -s),
    aten.mul.Tensor: _binary("Mul", "Muls", lambda a, b: (a * b).astype(np.float32)),
    aten.div.Tensor: _binary("Div", "Muls", lambda a, b: (a / b).astype(np.float32), scalar_map=lambda s: 1.0 / s),
    aten.neg.default: ElementwiseOp(lambda a: -a, lambda d, t, s: [f"Muls({d}, {t[0]}, -1.0f, len);"]),
    aten.exp.default: ElementwiseOp(
        lambda a: np.exp(a).astype(np.float32), lambda d, t, s: [f"Exp({d}, {t[0]}, len);"]
    ),
    aten.sigmoid.default: ElementwiseOp(_sigmoid, lambda d, t, s: _sigmoid_lines(d, t[0])),
    aten.silu.default: ElementwiseOp(
        lambda a: (a * _sigmoid(a)).astype(np.float32),
        lambda d, t, s: [*_sigmoid_lines("tmpA", t[0]), f"Mul({d}, {t[0]}, tmpA, len);"],
    ),
    aten.silu_backward.default: ElementwiseOp(_silu_backward_numpy, _silu_backward_emit),
    aten.clamp.default: ElementwiseOp(_clamp_numpy, _clamp_emit),
    aten.le.Scalar: _compare("LE", lambda a, s: a <= s),
    aten.ge.Scalar: _compare("GE", lambda a, s: a >= s),
    aten.lt.Scalar: _compare("LT", lambda a, s: a < s),
    aten.gt.Scalar: _compare("GT", lambda a, s: a > s),
    aten.bitwise_and.Tensor: _binary("Mul", "Muls", lambda a, b: (a * b).astype(np.float32)),  # masks are 0/1 floats
    aten.logical_and.default: _binary("Mul", "Muls", lambda a, b: (a * b).astype(np.float32)),
    aten._to_copy.default: ElementwiseOp(lambda a: a, lambda d, t, s: [f"Adds({d}, {t[0]}, 0.0f, len);"]),
}


def _operands(node: fx.Node) -> tuple[list[Any], list[Any]]:
    """(tensor operands in order, scalar operands in order) of an elementwise node."""
    if node.target is aten.clamp.default:
        low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
        high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
        return [node.args[0]], [low, high]
    tensors = [a for a in node.args if isinstance(a, fx.Node)]
    scalars = [a for a in node.args if not isinstance(a, fx.Node)]
    return tensors, scalars


def _elementwise(node: fx.Node, numel: int | None = None) -> bool:
    if node.op != "call_function" or node.target not in ELEMENTWISE:
        return False
    if node.target is aten._to_copy.default and set(node.kwargs) - {"dtype"}:
        return False
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype not in (*_C_TYPES, torch.bool):
        return False
    tensors, scalars = _operands(node)
    if any(not isinstance(s, (int, float, type(None))) or isinstance(s, bool) for s in scalars):
        return False
    shapes = [t.meta.get("val") for t in tensors]
    if any(not isinstance(v, torch.Tensor) or v.shape != value.shape for v in shapes):
        return False  # broadcasting is left to the eager backend
    return numel is None or value.numel() == numel


@dataclass
class FusionGroup:
    name: str
    nodes: list[fx.Node]
    inputs: list[fx.Node]
    outputs: list[fx.Node]
    numel: int

    def dtype_of(self, node: fx.Node) -> torch.dtype:
        dtype = node.meta["val"].dtype
        return torch.float32 if dtype == torch.bool else dtype


def find_fusion_groups(
    gm: fx.GraphModule, *, skip: set[fx.Node] | None = None, min_nodes: int = 3
) -> list[FusionGroup]:
    """Connected groups of elementwise nodes (same element count) outside `skip`, in graph order."""
    skip = skip or set()
    candidates = [n for n in gm.graph.nodes if n not in skip and _elementwise(n)]
    parent = {n: n for n in candidates}

    def find(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for node in candidates:
        numel = node.meta["val"].numel()
        for other in node.all_input_nodes:
            if other in parent and other.meta["val"].numel() == numel:
                parent[find(node)] = find(other)
    members: dict[fx.Node, list[fx.Node]] = {}
    for node in candidates:
        members.setdefault(find(node), []).append(node)
    groups = []
    for nodes in members.values():
        if len(nodes) < min_nodes:
            continue
        inside = set(nodes)
        inputs = list(dict.fromkeys(i for n in nodes for i in _operands(n)[0] if i not in inside))
        outputs = [n for n in nodes if any(u not in inside for u in n.users)]
        if not outputs:
            continue
        groups.append(FusionGroup(f"trex_group{len(groups)}", nodes, inputs, outputs, nodes[0].meta["val"].numel()))
    return groups


# ---------------------------------------------------------------------------------------------
# Tiling (shared by the C++ kernel and the numpy model)


@dataclass(frozen=True)
class Tiling:
    total: int  # elements
    cores: int  # vector cores used
    block: int  # elements per core (the last core may get fewer)
    tile: int  # elements per tile (aligned to 32 bytes of the widest I/O type)
    ub_bytes_used: int

    def tiles_of(self, core: int) -> list[tuple[int, int]]:
        """(offset, length) of each tile of `core`'s block; the last tile is the tail."""
        start = core * self.block
        end = min(self.total, start + self.block)
        return [(offset, min(self.tile, end - offset)) for offset in range(start, end, self.tile)]


def plan_tiling(group: FusionGroup, profile: VectorCoreProfile, temps: int) -> Tiling:
    io_bytes = sum(group.dtype_of(n).itemsize for n in (*group.inputs, *group.outputs))
    per_element = (
        BUFFER_NUM * io_bytes + 4 * (len(group.inputs) + len(group.outputs)) + 4 * temps + 1
    )  # queues, fp32 views, temps, mask
    align = ALIGN_BYTES // 2  # elements in 32 bytes of the narrowest (2-byte) type: aligned for every type here
    budget = profile.ub_bytes - 3 * ALIGN_BYTES * 8  # the 0/1 constants and the mask's alignment
    tile = max(align, (budget // per_element) // align * align)
    cores = max(1, min(profile.vector_cores, math.ceil(group.numel / align)))
    block = math.ceil(math.ceil(group.numel / cores) / align) * align
    cores = math.ceil(group.numel / block)
    tile = min(tile, block)
    return Tiling(group.numel, cores, block, tile, tile * per_element)


# ---------------------------------------------------------------------------------------------


@dataclass
class Kernel:
    group: FusionGroup
    tiling: Tiling
    source: str
    program: list[tuple[fx.Node, str, list[str], list[Any]]]  # (node, dst buffer, tensor operands, scalars)
    values: dict[fx.Node, str] = field(default_factory=dict)


def _buffer_names(group: FusionGroup) -> tuple[dict[fx.Node, str], int]:
    names = {n: f"x{i}" for i, n in enumerate(group.inputs)}
    temps = 0
    for node in group.nodes:
        if node in group.outputs:
            names[node] = f"y{group.outputs.index(node)}"
        else:
            names[node] = f"t{temps}"
            temps += 1
    return names, temps


def emit_kernel(group: FusionGroup, target: str | VectorCoreProfile = "ascend-910c") -> Kernel:
    profile = target if isinstance(target, VectorCoreProfile) else VECTOR_CORES[target]
    names, temps = _buffer_names(group)
    tiling = plan_tiling(group, profile, temps + 2)
    program = []
    body: list[str] = []
    for node in group.nodes:
        tensors, scalars = _operands(node)
        operands = [names[t] for t in tensors]
        program.append((node, names[node], operands, scalars))
        body.append(f"// {node.name} = {node.target}")
        body += ELEMENTWISE[node.target].ascendc(names[node], operands, scalars)
    source = _render(group, tiling, names, temps, body)
    return Kernel(group, tiling, source, program, names)


def _render(group: FusionGroup, tiling: Tiling, names: dict[fx.Node, str], temps: int, body: list[str]) -> str:
    c = lambda n: _C_TYPES[group.dtype_of(n)]  # noqa: E731
    ins, outs = group.inputs, group.outputs
    params = ", ".join([f"GM_ADDR in{i}" for i in range(len(ins))] + [f"GM_ADDR out{i}" for i in range(len(outs))])
    lines = [
        f"// trex: AscendC kernel for fusion group {group.name} ({len(group.nodes)} elementwise aten nodes:",
        f"//   {', '.join(n.name for n in group.nodes)})",
        f"// Tiling: {tiling.total} elements over {tiling.cores} vector cores, {tiling.block} per core, "
        f"tiles of {tiling.tile} "
        f"({BUFFER_NUM} buffers per queue; {tiling.ub_bytes_used} UB bytes per tile).",
        '#include "kernel_operator.h"',
        "using namespace AscendC;",
        "",
        f"constexpr int32_t BUFFER_NUM = {BUFFER_NUM};",
        f"constexpr uint32_t TOTAL = {tiling.total}, BLOCK = {tiling.block}, TILE = {tiling.tile};",
        "",
        f"class Kernel_{group.name} {{",
        "public:",
        f"    __aicore__ inline void Init({params}) {{",
        "        uint32_t start = BLOCK * GetBlockIdx();",
        "        length = (start + BLOCK <= TOTAL) ? BLOCK : TOTAL - start;",
    ]
    for i, node in enumerate(ins):
        lines += [
            f"        in{i}Gm.SetGlobalBuffer((__gm__ {c(node)} *)in{i} + start, length);",
            f"        pipe.InitBuffer(inQ{i}, BUFFER_NUM, TILE * sizeof({c(node)}));",
            f"        pipe.InitBuffer(f{i}Buf, TILE * sizeof(float));",
        ]
    for i, node in enumerate(outs):
        lines += [
            f"        out{i}Gm.SetGlobalBuffer((__gm__ {c(node)} *)out{i} + start, length);",
            f"        pipe.InitBuffer(outQ{i}, BUFFER_NUM, TILE * sizeof({c(node)}));",
            f"        pipe.InitBuffer(g{i}Buf, TILE * sizeof(float));",
        ]
    lines += [
        f"        pipe.InitBuffer(tBuf, TILE * sizeof(float) * {temps + 2});",
        "        pipe.InitBuffer(mBuf, TILE * sizeof(uint8_t));",
        "        pipe.InitBuffer(cBuf, TILE * sizeof(float) * 2);",
        "    }",
        "    __aicore__ inline void Process() {",
        "        for (uint32_t offset = 0; offset < length; offset += TILE) {",
        "            uint32_t len = (length - offset < TILE) ? length - offset : TILE;  // the tail tile",
        "            CopyIn(offset, len);",
        "            Compute(len);",
        "            CopyOut(offset, len);",
        "        }",
        "    }",
        "",
        "private:",
        "    __aicore__ inline void CopyIn(uint32_t offset, uint32_t len) {",
        "        DataCopyExtParams params{1, (uint32_t)(len * sizeof(float)), 0, 0, 0};",
    ]
    for i, node in enumerate(ins):
        lines += [
            f"        LocalTensor<{c(node)}> a{i} = inQ{i}.AllocTensor<{c(node)}>();",
            f"        DataCopyPad(a{i}, in{i}Gm[offset], {{1, (uint32_t)(len * sizeof({c(node)})), 0, 0, 0}}, "
            "{false, 0, 0, 0});",
            f"        inQ{i}.EnQue(a{i});",
        ]
    lines += [
        "    }",
        "    __aicore__ inline void Compute(uint32_t len) {",
        "        LocalTensor<float> tmp = tBuf.Get<float>();",
        "        LocalTensor<float> tmpA = tmp, tmpB = tmp[TILE];",
        *[f"        LocalTensor<float> t{k} = tmp[TILE * {k + 2}];" for k in range(temps)],
        "        LocalTensor<uint8_t> maskBuf = mBuf.Get<uint8_t>();",
        "        LocalTensor<float> oneBuf = cBuf.Get<float>(), zeroBuf = oneBuf[TILE];",
        "        Duplicate(oneBuf, 1.0f, len);",
        "        Duplicate(zeroBuf, 0.0f, len);",
    ]
    for i, node in enumerate(ins):
        lines += [
            f"        LocalTensor<{c(node)}> a{i} = inQ{i}.DeQue<{c(node)}>();",
            f"        LocalTensor<float> x{i} = f{i}Buf.Get<float>();",
        ]
        lines.append(
            f"        Adds(x{i}, a{i}, 0.0f, len);"
            if c(node) == "float"
            else f"        Cast(x{i}, a{i}, RoundMode::CAST_NONE, len);"
        )
    for i, _ in enumerate(outs):
        lines.append(f"        LocalTensor<float> y{i} = g{i}Buf.Get<float>();")
    lines += ["        " + line for line in body]
    for i, node in enumerate(outs):
        lines += [
            f"        LocalTensor<{c(node)}> b{i} = outQ{i}.AllocTensor<{c(node)}>();",
            f"        Adds(b{i}, y{i}, 0.0f, len);"
            if c(node) == "float"
            else f"        Cast(b{i}, y{i}, RoundMode::CAST_RINT, len);",
            f"        outQ{i}.EnQue(b{i});",
        ]
    lines += [f"        inQ{i}.FreeTensor(a{i});" for i in range(len(ins))]
    lines += ["    }", "    __aicore__ inline void CopyOut(uint32_t offset, uint32_t len) {"]
    for i, node in enumerate(outs):
        lines += [
            f"        LocalTensor<{c(node)}> b{i} = outQ{i}.DeQue<{c(node)}>();",
            f"        DataCopyPad(out{i}Gm[offset], b{i}, {{1, (uint32_t)(len * sizeof({c(node)})), 0, 0, 0}});",
            f"        outQ{i}.FreeTensor(b{i});",
        ]
    lines += ["    }", "", "    TPipe pipe;"]
    lines += [f"    TQue<QuePosition::VECIN, BUFFER_NUM> inQ{i};" for i in range(len(ins))]
    lines += [f"    TQue<QuePosition::VECOUT, BUFFER_NUM> outQ{i};" for i in range(len(outs))]
    lines += [
        "    TBuf<QuePosition::VECCALC> "
        + ", ".join(
            [f"f{i}Buf" for i in range(len(ins))] + [f"g{i}Buf" for i in range(len(outs))] + ["tBuf", "mBuf", "cBuf"]
        )
        + ";"
    ]
    lines += [f"    GlobalTensor<{c(n)}> in{i}Gm;" for i, n in enumerate(ins)]
    lines += [f"    GlobalTensor<{c(n)}> out{i}Gm;" for i, n in enumerate(outs)]
    lines += [
        "    uint32_t length;",
        "};",
        "",
        f'extern "C" __global__ __aicore__ void {group.name}({params}) {{',
        f"    Kernel_{group.name} op;",
        f"    op.Init({', '.join([f'in{i}' for i in range(len(ins))] + [f'out{i}' for i in range(len(outs))])});",
        "    op.Process();",
        "}",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


class TilingModel:
    """The kernel's tiling and instruction sequence run on numpy: block per core, tiles, tails."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel

    def run_numpy(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        kernel, group, tiling = self.kernel, self.kernel.group, self.kernel.tiling
        flat = [np.ascontiguousarray(a, dtype=np.float32).reshape(-1) for a in inputs]
        outputs = [np.zeros(tiling.total, dtype=np.float32) for _ in group.outputs]
        written = np.zeros(tiling.total, dtype=np.int64)
        for core in range(tiling.cores):
            for offset, length in tiling.tiles_of(core):
                assert 0 < length <= tiling.tile
                values = {kernel.values[n]: flat[i][offset : offset + length] for i, n in enumerate(group.inputs)}
                for node, dst, operands, scalars in kernel.program:
                    args = [values[o] for o in operands]
                    if node.target is aten.clamp.default:
                        values[dst] = ELEMENTWISE[node.target].numpy(*args, *scalars)
                    elif node.target in (aten.le.Scalar, aten.ge.Scalar, aten.lt.Scalar, aten.gt.Scalar):
                        values[dst] = ELEMENTWISE[node.target].numpy(args[0], scalars[0])
                    else:
                        ordered = [
                            values[kernel.values[a]] if isinstance(a, fx.Node) else a
                            for a in node.args
                            if a is not None
                        ]
                        values[dst] = np.asarray(ELEMENTWISE[node.target].numpy(*ordered), dtype=np.float32)
                for i, node in enumerate(group.outputs):
                    outputs[i][offset : offset + length] = values[kernel.values[node]]
                written[offset : offset + length] += 1
        if not (written == 1).all():
            raise AssertionError(
                f"{group.name}: the tiling covers {int((written == 0).sum())} elements never "
                f"and {int((written > 1).sum())} twice"
            )
        shapes = [n.meta["val"].shape for n in group.outputs]
        return [o.reshape(tuple(s)) for o, s in zip(outputs, shapes)]


def run_eager(group: FusionGroup, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The group's aten nodes run by PyTorch (the reference the numpy model is compared with)."""
    env = dict(zip(group.inputs, inputs))
    for node in group.nodes:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
        env[node] = node.target(*args, **kwargs)
    return [env[n] for n in group.outputs]


# ---------------------------------------------------------------------------------------------


def cann_compiler() -> tuple[list[str] | None, str]:
    """(compiler command, '') when CANN's AscendC compiler is installed, else (None, why not)."""
    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    candidates = [shutil.which("bisheng"), shutil.which("ccec")]
    if home:
        candidates += [str(p) for p in (Path(home) / "compiler" / "ccec_compiler" / "bin" / "bisheng",) if p.exists()]
    found = next((c for c in candidates if c), None)
    if found is None:
        return None, (
            "compilation skipped: the CANN toolkit is not installed here (ASCEND_HOME_PATH/ASCEND_TOOLKIT_HOME unset, "
            "no bisheng or ccec on PATH); install CANN (Ascend-cann-toolkit) to compile"
        )
    return [found], ""


@dataclass
class CompileResult:
    compiled: bool
    message: str
    output: Path | None = None


def compile_kernel(kernel: Kernel, directory: Path, soc: str = "Ascend910B1") -> CompileResult:
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"{kernel.group.name}.cpp"
    source.write_text(kernel.source)
    command, why = cann_compiler()
    if command is None:
        return CompileResult(False, why)
    home = os.environ.get("ASCEND_HOME_PATH", "")
    output = directory / f"{kernel.group.name}.o"
    result = subprocess.run(
        [
            *command,
            "-c",
            "-O2",
            "-std=c++17",
            "--cce-aicore-arch=dav-c220-vec",
            "--cce-aicore-only",
            f"-I{home}/compiler/tikcpp/tikcfw",
            f"-I{home}/compiler/tikcpp/tikcfw/impl",
            f"-I{home}/compiler/tikcpp/tikcfw/interface",
            str(source),
            "-o",
            str(output),
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        return CompileResult(False, f"{command[0]} failed for {soc}: {result.stderr[-2000:]}")
    return CompileResult(True, f"compiled with {command[0]}", output)

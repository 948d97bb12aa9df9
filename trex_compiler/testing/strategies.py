"""Hypothesis strategies for property-testing passes: random valid graphs and tiny MoE configs.

`graphs()` draws a small straight-line program over MoE-shaped tensors (tokens x hidden
activations, weights, router logits) from pointwise ops, reductions, matmuls, routing-like
gather/scatter (top-k, gather, index_select, index_add) and the fused trex MoE op, and traces it
with make_fx into an aten graph with FakeTensor metadata, exactly the form captured graphs have.
With `joint=True` the program also differentiates its outputs, so the graph holds forward and
backward ops like an AOTAutograd joint graph. Every drawn case prints as the program it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from trex.models import TINY_FAMILIES

DTYPES = (torch.float32, torch.bfloat16)

# Ops on one [T, H] activation that keep its shape (bounded, so long chains stay finite).
UNARY = {
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "neg": torch.neg,
    "exp_tanh": lambda x: torch.exp(torch.tanh(x)),
    "rsqrt_abs": lambda x: torch.rsqrt(x.abs() + 1.0),
    "scale": lambda x: x * 0.5,
    "rms_norm": lambda x: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype),
}
BINARY = {"add": torch.add, "mul": torch.mul, "sub": torch.sub}
REDUCTIONS = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}


@dataclass(frozen=True)
class Step:
    """One statement of a drawn program: `values.append(op(values[i], ...))`."""

    op: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.op}{self.args}"


@dataclass
class Program:
    """A straight-line program over MoE-shaped tensors; `run` executes it, `str` prints it."""

    dtype: torch.dtype
    tokens: int
    hidden: int
    experts: int
    top_k: int
    steps: list[Step] = field(default_factory=list)
    outputs: tuple[int, ...] = ()

    def input_shapes(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        t, h, e = self.tokens, self.hidden, self.experts
        return [
            ((t, h), self.dtype),  # x: activations
            ((h, h), self.dtype),  # w: a dense weight
            ((h, e), self.dtype),  # router weight
            ((e, 2 * h, h), self.dtype),  # experts gate_up_proj [E, 2I, H] with I = H
            ((e, h, h), self.dtype),  # experts down_proj [E, H, I]
        ]

    def make_inputs(self, seed: int = 0, requires_grad: bool = False) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        inputs = []
        for shape, dtype in self.input_shapes():
            scale = 1.0 if len(shape) == 2 and shape[0] == self.tokens else shape[-1] ** -0.5
            inputs.append((torch.randn(shape, generator=generator) * scale).to(dtype).requires_grad_(requires_grad))
        return inputs

    def run(self, x, w, router, gate_up_proj, down_proj):
        values = [x]
        for step in self.steps:
            values.append(_apply(step, values, w, router, gate_up_proj, down_proj, self))
        return tuple(values[i] for i in self.outputs)

    def __str__(self) -> str:
        lines = [
            f"program(dtype={self.dtype}, tokens={self.tokens}, hidden={self.hidden}, experts={self.experts}, top_k={self.top_k})"
        ]
        lines += [f"  v{i + 1} = {s}" for i, s in enumerate(self.steps)]
        lines.append(f"  return {', '.join(f'v{i}' for i in self.outputs)}")
        return "\n".join(lines)


def _route(x: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = x @ router
    weights, index = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1)
    return index, (weights / weights.sum(-1, keepdim=True)).to(x.dtype)


def _apply(
    step: Step, values: list[torch.Tensor], w, router, gate_up_proj, down_proj, program: Program
) -> torch.Tensor:
    a = values[step.args[0]]
    if step.op in UNARY:
        return UNARY[step.op](a)
    if step.op in BINARY:
        return BINARY[step.op](a, values[step.args[1]])
    if step.op in REDUCTIONS:  # reduce over hidden, broadcast back so the pool keeps [T, H]
        return a - REDUCTIONS[step.op](a, dim=-1, keepdim=True)
    if step.op == "matmul":
        return a @ w
    if step.op == "softmax":
        return torch.softmax(a, dim=-1)
    if step.op == "topk_gather":  # keep the top-k features of every token, scattered back in place
        values_k, index = torch.topk(a, step.args[1], dim=-1)
        return torch.zeros_like(a).scatter(-1, index, torch.gather(a, -1, index) * 2.0 + values_k * 0.0)
    if step.op == "permute_rows":  # route rows by a data-dependent order, then add them back
        order = torch.argsort(a.sum(-1))
        return torch.zeros_like(a).index_add(0, order, a.index_select(0, order) * 0.5)
    if step.op == "moe":
        index, weights = _route(a, router, program.top_k)
        out, *_ = torch.ops.trex.moe_experts(
            a, index, weights, gate_up_proj, down_proj, step.args[1], step.args[2], False
        )
        return out
    raise ValueError(f"unknown op {step.op}")


@st.composite
def programs(
    draw, *, max_steps: int = 8, dtypes: tuple[torch.dtype, ...] = DTYPES, moe: bool = True, require_moe: bool = False
) -> Program:
    """Programs of 1..max_steps steps; `require_moe` makes the last step a fused MoE layer."""
    program = Program(
        dtype=draw(st.sampled_from(dtypes)),
        tokens=draw(st.sampled_from((8, 16, 32))),
        hidden=draw(st.sampled_from((8, 16, 32))),
        experts=draw(st.sampled_from((2, 4, 8))),
        top_k=1,
    )
    program.top_k = draw(st.integers(1, min(2, program.experts)))
    ops = [*UNARY, *BINARY, *REDUCTIONS, "matmul", "softmax", "topk_gather", "permute_rows"] + (
        ["moe"] * 3 if moe else []
    )
    num_steps = draw(st.integers(1, max_steps))
    for length in range(1, num_steps + 1):
        op = "moe" if require_moe and length == num_steps else draw(st.sampled_from(ops))
        source = draw(st.integers(0, length - 1))
        if op in BINARY:
            args = (source, draw(st.integers(0, length - 1)))
        elif op == "topk_gather":
            args = (source, draw(st.integers(1, program.hidden)))
        elif op == "moe":
            args = (source, draw(st.sampled_from(("silu", "gelu", "relu"))), draw(st.sampled_from((0.0, 1.0))))
        else:
            args = (source,)
        program.steps.append(Step(op, args))
    count = len(program.steps)
    extra = draw(st.lists(st.integers(0, count), max_size=2, unique=True))
    program.outputs = tuple(dict.fromkeys([count, *extra]))
    return program


@dataclass
class GraphCase:
    """A drawn graph: the aten GraphModule (meta['val'] on every node), real inputs, its program."""

    gm: fx.GraphModule
    inputs: list[torch.Tensor]
    program: Program
    joint: bool

    def __repr__(self) -> str:
        return f"GraphCase(joint={self.joint}, nodes={len(self.gm.graph.nodes)})\n{self.program}"


def trace_program(program: Program, *, joint: bool = False, seed: int = 0) -> GraphCase:
    """Trace `program` to an aten graph; with `joint`, also its gradients w.r.t. every input."""
    if joint:

        def fn(x, w, router, gate_up_proj, down_proj, *cotangents):
            inputs = (x, w, router, gate_up_proj, down_proj)
            outputs = program.run(*inputs)
            grads = torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)
            return (*outputs, *(g if g is not None else torch.zeros_like(i) for g, i in zip(grads, inputs)))

        primals = program.make_inputs(seed, requires_grad=True)
        with torch.no_grad():
            outputs = program.run(*primals)
        generator = torch.Generator().manual_seed(seed + 1)
        cotangents = [torch.randn(o.shape, generator=generator).to(o.dtype) for o in outputs]
        inputs = [*primals, *cotangents]
    else:

        def fn(x, w, router, gate_up_proj, down_proj):
            return program.run(x, w, router, gate_up_proj, down_proj)

        inputs = program.make_inputs(seed)
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    inputs = [i.detach().requires_grad_(i.requires_grad) for i in inputs]
    return GraphCase(gm, inputs, program, joint)


@st.composite
def graphs(
    draw,
    *,
    joint: bool | None = None,
    max_steps: int = 8,
    dtypes: tuple[torch.dtype, ...] = DTYPES,
    moe: bool = True,
    require_moe: bool = False,
) -> GraphCase:
    """Random valid aten graphs (forward-only or joint forward+backward) with FakeTensor metadata."""
    program = draw(programs(max_steps=max_steps, dtypes=dtypes, moe=moe, require_moe=require_moe))
    is_joint = draw(st.booleans()) if joint is None else joint
    return trace_program(program, joint=is_joint, seed=draw(st.integers(0, 2**16)))


@dataclass(frozen=True)
class TinyMoeCase:
    family: str
    num_experts: int
    top_k: int
    hidden_size: int
    num_layers: int
    dtype: torch.dtype

    def config(self):
        from trex.models import tiny_config

        return tiny_config(
            self.family,
            num_experts=self.num_experts,
            top_k=self.top_k,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
        )

    def build(self, seed: int = 0):
        from trex.models import build_model

        return build_model(self.config(), dtype=self.dtype, seed=seed)


@st.composite
def moe_configs(
    draw, *, families: tuple[str, ...] = TINY_FAMILIES, dtypes: tuple[torch.dtype, ...] = DTYPES
) -> TinyMoeCase:
    """Tiny configurations of DeepSeek-V4, DeepSeek-V3 and Qwen3-MoE (every structural feature)."""
    num_experts = draw(st.sampled_from((2, 4, 8)))
    return TinyMoeCase(
        family=draw(st.sampled_from(families)),
        num_experts=num_experts,
        top_k=draw(st.integers(1, min(num_experts, 3))),
        hidden_size=draw(st.sampled_from((32, 64))),
        num_layers=draw(st.integers(2, 3)),
        dtype=draw(st.sampled_from(dtypes)),
    )

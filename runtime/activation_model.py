"""Activation memory of the program a rank of `trex train` runs: what its forward keeps for the backward.

The cost model's activation formula (`cost_model.layer_cost`) prices production kernels: a fused
RMSNorm keeps its input and one rstd per token, flash attention keeps q, k, v, its output and the
log-sum-exp, a fused SwiGLU keeps its input only, Megatron's sequence parallelism keeps the sequence
*shard* of a GEMM input and all-gathers it again in the backward. That is the right price for ranking
plans of a production run, and the planner keeps it.

A rank of the runtime executes something else: transformers' eager modules, run op by op, where
autograd keeps every tensor some op's derivative formula reads. This module describes those tensors
for the implementation that actually runs, op by op, so the runtime's prediction
(`predicted_memory_per_rank_bytes`) prices the program the rank executes. Each entry below is one
tensor autograd saves, named after the op whose backward reads it (torch's `derivatives.yaml` says
which inputs or outputs each op keeps), with its element count and dtype. Tensors are counted once per
storage: a view of a saved tensor (a reshape before a matmul, a transpose of SDPA's output) is the
same memory and is not repeated.

Per decoder layer of Qwen3-MoE (transformers `Qwen3MoeDecoderLayer`, fp32, t tokens on this rank):

  RMSNorm (eager: `x.pow(2).mean()`, `x * rsqrt(var + eps)`, `weight * normed`), four per layer
  counting the per-head q/k norms: pow keeps its input x; rsqrt keeps its output (one per row);
  `x * rstd` keeps x and rstd; `weight * normed` keeps `normed` (the weight's gradient reads it).
  The norm's output itself is kept by whichever op reads it next (a Linear keeps its input).
  Attention (`sdpa`): q/k/v projections keep their common input; the q/k norms keep the per-head
  projections; RoPE's `q * cos + rotate_half(q) * sin` keeps cos and sin (computed once per forward,
  shared by every layer); SDPA (the CPU flash kernel) keeps q and k after RoPE, v, its output and a
  float32 log-sum-exp per query and head. `o_proj` reads a view of SDPA's output.
  Router (`Qwen3MoeTopKRouter`): the linear keeps its input; the float32 softmax keeps its output;
  topk keeps its indices (int64); the in-place normalisation keeps the row sum and the result.
  Routed experts, transformers' `grouped_mm` implementation (ep = 1): the row gather keeps its index
  (int64), the weight gather its permutation, the un-permute its index; `grouped_mm` keeps the sorted
  rows and the int32 offsets; SiLU keeps gate_up's output; the gate*up product keeps both factors;
  the down `grouped_mm` keeps the product; the weighting keeps the expert output and the weights.
  Routed experts under ep > 1 (runtime.expert_parallel, split graph nodes): `trex.moe_dispatch` keeps the
  permutation (int64); each `trex.ep_exchange` keeps its send and receive row counts (ep int64 each; the
  combine's exchange keeps the dispatch's two, swapped); `trex.ep_experts_local` keeps the received
  counts per (rank, local expert) (E int64), its regroup index (int64), the received rows regrouped by
  expert and their gate_up output (the activation is recomputed in its backward); `trex.moe_combine`
  keeps the combine exchange's output (the expert output, one row per (token, slot)), the permutation
  again and the routing weights.
  Dense MLP (layers in `mlp_only_layers`): gate/up keep their input; SiLU its input; the product both
  factors; down its input.
  Ends: the embedding keeps the token ids (int64); the final norm as above; the LM head its input;
  `cross_entropy` keeps its float32 log-softmax over the vocabulary, the targets and the scalar weight
  total. Ids and targets are row slices of the step's global batch, which every rank holds whole
  (`runtime.data`): the storage they keep alive is the global batch's, gbs x seq int64 each.

Tensor parallelism (runtime.tensor_parallel, DTensor styles with sequence parallelism): the embedding is
vocabulary-parallel (runtime.vocab_parallel: its lookup keeps the shifted ids, its mask the bool mask); norms, routers
and routed experts run on this rank's t = T/tp tokens; attention and the dense MLP all-gather the
sequence and their projections keep the *gathered* input (T tokens: eager DTensor keeps what the
matmul read, it does not re-gather in the backward); heads and MLP columns are 1/tp per rank; the
LM head keeps its gathered input and the loss (runtime.vocab_parallel's cross-entropy) the softmax of its vocabulary
shard and the targets.

Expert parallelism: each rank receives as many rows as it sends under balanced routing (the
expectation); a measured rank that received more rows than it sent keeps proportionally more in the
experts op, which is the routing's imbalance, not a modelling error.

bf16 (`torch.autocast`, Qwen3-MoE): every Linear casts its float32 input to a bf16 copy of its
own (autocast caches casts of leaf weights only, so q/k/v make three copies of one input) and keeps it with
a bf16 copy of its weight; projections and SDPA produce bf16, so SDPA's q, k, v and output are bf16; the
q/k norms upcast their bf16 input (a float32 copy) and keep the normalized tensor in bf16; the router
restores its bf16 output dtype after the float32 softmax, so the experts' weighting keeps bf16 weights;
the residual stream, the other norms and the grouped-GEMM experts stay float32. Under tp the same copies are
made of the gathered sequence by each rank's column/row shards (a DTensor Linear casts its local shard and its
local input like a plain one), so the tp description with bf16 itemsizes is the program (measured = predicted
on 2 ranks, Qwen3-MoE and DeepSeek-V3, one and two sequences per micro-batch).

DeepSeek-V3 under autocast keeps the same kinds of copies (its MLA projections, router, shared experts and
dense MLP are Linears), while its SDPA math path stays float32 (v becomes a float32 copy).

DeepSeek-V4 (see `_deepseek_v4`): mHC hyper-connections, CSA/HCA compressors, eager attention with sinks,
hash-routed and top-k MoE layers with the SwiGLU clamps; the lightning indexer's branch only picks integer
indices, reaches no loss and is freed before the backward. Under bf16 autocast its Linears, the mHC mixes'
matmuls and the attention's probabilities keep bf16 copies while the streams, Sinkhorn and softmaxes stay
float32; under tp (runtime.tensor_parallel_heads) attention and the shared expert read the gathered
sequence, the compressors run replicated on it, q_b/o_a/o_b/sinks hold this rank's heads and groups, and the
hyper-connections, norms, router and routed experts run on this rank's sequence shard.

Covered: Qwen3-MoE, DeepSeek-V3 (MLA; see `_deepseek_v3`) and DeepSeek-V4, fp32 and bf16 autocast, any
dp/ZeRO/ep/tp plan the runtime executes; eager (not `--compile`, whose partitioner chooses its own saved set).
Anything else raises NotCovered with the reason, and the prediction falls back to the production-kernel
formula, saying so. Counted is what is alive when the forward ends, as `runtime.memory_accounting` measures
it: a branch of the forward that reaches no loss is freed with what it saved before the backward starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trex.cost_model.parallel import ParallelConfig

INT64, INT32, FP32, BF16, BOOL = 8, 4, 4, 2, 1


@dataclass(frozen=True)
class Kept:
    """One tensor autograd keeps for the backward: `elements` of `itemsize` bytes, in `count` layers."""

    part: str  # where it is kept: "embedding", "attention", "moe", "mlp", "head", ...
    what: str  # the op that keeps it, and which tensor
    elements: float
    itemsize: int
    count: int = 1

    @property
    def nbytes(self) -> float:
        return self.elements * self.itemsize * self.count


@dataclass(frozen=True)
class ActivationModel:
    """The tensors one micro-batch's forward keeps on one rank, and what implementation they describe."""

    implementation: str
    kept: tuple[Kept, ...]

    @property
    def total_bytes(self) -> float:
        return sum(k.nbytes for k in self.kept)

    def by_part(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in self.kept:
            out[k.part] = out.get(k.part, 0.0) + k.nbytes
        return out


class NotCovered(Exception):
    """The program this plan runs is not described here (the reason is the message)."""


def eager_activations(config: Any, plan: ParallelConfig, *, compiled: bool = False) -> ActivationModel:
    """What one micro-batch keeps on one rank of `trex train` running `config` under `plan`.

    Raises NotCovered (with the reason) for programs this description does not cover."""
    model_type = getattr(config, "model_type", "")
    if compiled:
        raise NotCovered("a compiled rank keeps what the partitioner chose, not the eager implementation's tensors")
    if plan.precision not in ("fp32", "bf16"):
        raise NotCovered(f"precision {plan.precision} is not executed by the runtime's eager path")
    if plan.pp > 1 or plan.cp > 1:
        raise NotCovered("pipeline and context parallelism are not executed by the runtime")
    if model_type == "qwen3_moe":
        return _qwen3_moe(config, plan)
    if model_type == "deepseek_v3":
        return _deepseek_v3(config, plan)
    if model_type == "deepseek_v4":
        return _deepseek_v4(config, plan)
    raise NotCovered(
        f"the eager implementation of {model_type or 'this model'} is not described (covered: {', '.join(COVERED)})"
    )


COVERED = ("qwen3_moe", "deepseek_v3", "deepseek_v4")


# -- building blocks: one function per transformers module, returning what it keeps ---------------------


def _rms_norm(
    part: str, name: str, rows: float, width: int, count: int, *, keeps_input: bool = True, normalized: int = FP32
) -> list[Kept]:
    """Eager RMSNorm over `rows` rows of `width`: its input (pow and `x * rstd`, upcast to float32), rstd, the
    normalized tensor (`weight * normed`), cast back to the input's dtype (`normalized`: its itemsize; bf16 for a
    norm of a bf16 projection's output under autocast). `keeps_input=False` when another op keeps the input."""
    out = [Kept(part, f"{name}: input (pow, x*rstd; float32)", rows * width, FP32, count)] if keeps_input else []
    return out + [
        Kept(part, f"{name}: rstd (rsqrt output)", rows, FP32, count),
        Kept(part, f"{name}: normalized (weight*normed)", rows * width, normalized, count),
    ]


def _autocast_linears(part: str, name: str, rows: float, weights: list[float], count: int) -> list[Kept]:
    """Linears under bf16 autocast reading one float32 tensor: each call casts its input to bf16 (autocast
    caches casts of leaf weights only, so Linears sharing an input make one copy each) and its weight (a
    cached bf16 copy, kept by the matmul like an activation); `weights` are their weights' element counts."""
    return [Kept(part, f"{name}: bf16 copy of the input (one per Linear)", rows, BF16, count * len(weights))] + [
        Kept(part, f"{name}: bf16 copy of the weight", elements, BF16, count) for elements in weights
    ]


def _gated_mlp(part: str, rows: float, hidden: int, width: float, count: int, *, bf16: bool = False) -> list[Kept]:
    """`down(act(gate(x)) * up(x))` as separate Linears: x, gate's output (SiLU's input), SiLU's output and
    up's output (the product's factors), the product (down's input). Under bf16 autocast gate and up each
    cast x and their weights, their outputs are bf16 and down casts its weight (its input already bf16)."""
    act = BF16 if bf16 else FP32
    inputs = (
        _autocast_linears(part, "gate/up proj", rows * hidden, [hidden * width] * 2, count)
        if bf16
        else [Kept(part, "gate/up proj: input", rows * hidden, FP32, count)]
    )
    down = [Kept(part, "down proj: bf16 copy of the weight", width * hidden, BF16, count)] if bf16 else []
    return (
        inputs
        + [
            Kept(part, "silu: input (gate output)", rows * width, act, count),
            Kept(part, "mul: silu output", rows * width, act, count),
            Kept(part, "mul: up output", rows * width, act, count),
            Kept(part, "down proj: input", rows * width, act, count),
        ]
        + down
    )


def _router(
    tokens: float, hidden: int, experts: int, top_k: int, normalize: bool, count: int, *, bf16: bool = False
) -> list[Kept]:
    linear = (
        _autocast_linears("moe", "router linear", tokens * hidden, [hidden * experts], count)
        if bf16
        else [Kept("moe", "router linear: input", tokens * hidden, FP32, count)]
    )
    out = linear + [
        Kept("moe", "softmax (float32): output", tokens * experts, FP32, count),
        Kept("moe", "topk: indices", tokens * top_k, INT64, count),
    ]
    if normalize:
        out += [
            Kept("moe", "top-k normalisation: row sum", tokens, FP32, count),
            Kept("moe", "top-k normalisation: result", tokens * top_k, FP32, count),
        ]
    return out


def _grouped_mm_experts(
    rows: float, hidden: int, width: int, experts: int, count: int, weights: int = FP32, *, clamped: bool = False
) -> list[Kept]:
    """transformers' `grouped_mm_experts_forward` over `rows` (token, slot) pairs (float32 under autocast too:
    the grouped GEMMs are not on autocast's list). `weights`: the routing weights' itemsize (bf16 when the
    router's output dtype, bf16 under autocast, is restored after its float32 softmax). `clamped`: the gate
    applies DeepSeek-V4's SwiGLU limit (`gate.clamp(max)`, `up.clamp(min, max)`) before SiLU and the product,
    so SiLU's input and the product's `up` factor are the clamps' own outputs."""
    clamps = (
        [Kept("moe", "clamp outputs (SiLU's input, the product's up factor)", 2 * rows * width, FP32, count)]
        if clamped
        else []
    )
    return clamps + [
        Kept("moe", "row gather / weight gather / un-permute: indices", 3 * rows, INT64, count),
        Kept("moe", "grouped_mm: offsets", experts, INT32, count),
        Kept("moe", "gate_up grouped_mm: sorted rows", rows * hidden, FP32, count),
        Kept("moe", "silu: gate_up output (gate and up halves)", rows * 2 * width, FP32, count),
        Kept("moe", "mul: silu output", rows * width, FP32, count),
        Kept("moe", "down grouped_mm: gated product", rows * width, FP32, count),
        Kept("moe", "weighting: routing weights", rows, weights, count),
        Kept("moe", "weighting: expert output", rows * hidden, FP32, count),
    ]


def _expert_parallel_experts(
    tokens: float, top_k: int, hidden: int, width: int, experts: int, ep: int, count: int, weights: int = FP32
) -> list[Kept]:
    """What the split expert-parallel layer's nodes keep; received rows = sent rows (balanced routing)."""
    rows = tokens * top_k
    received = rows
    return [
        Kept("moe", "moe_dispatch: permutation (moe_combine keeps it too)", rows, INT64, count),
        Kept("moe", "ep_exchange: send and receive row counts per rank", 2 * ep, INT64, count),
        Kept("moe", "ep_experts_local: received counts per (rank, local expert)", experts, INT64, count),
        Kept("moe", "ep_experts_local: regroup index", received, INT64, count),
        Kept("moe", "ep_experts_local: received rows by expert", received * hidden, FP32, count),
        Kept("moe", "ep_experts_local: gate_up output", received * 2 * width, FP32, count),
        Kept("moe", "moe_combine: expert output (the combine exchange's)", rows * hidden, FP32, count),
        Kept("moe", "moe_combine: routing weights", tokens * top_k, weights, count),
    ]


def _qwen3_moe(config: Any, plan: ParallelConfig) -> ActivationModel:
    hidden = config.hidden_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    tp = plan.tp
    tokens = plan.mbs * plan.seq  # T: the micro-batch's tokens (the gathered sequence under tp)
    local = tokens / tp  # t: this rank's sequence shard (all tokens when tp = 1)
    q_width, kv_width = heads * head_dim / tp, kv_heads * head_dim / tp
    h_local, kv_local = heads / tp, kv_heads / tp
    layers = config.num_hidden_layers
    dense_layers = {
        i
        for i in range(layers)
        if i in set(getattr(config, "mlp_only_layers", None) or [])
        or (i + 1) % (getattr(config, "decoder_sparse_step", 1) or 1)
    }
    moe_layers = layers - len(dense_layers)
    bf16 = plan.precision == "bf16"  # autocast
    act = BF16 if bf16 else FP32  # what the projections and SDPA produce
    kept = _embedding(plan, tokens)
    # Attention, every layer
    kept += _rms_norm("attention", "input_layernorm", local, hidden, layers)
    if bf16:
        projections = [hidden * q_width, hidden * kv_width, hidden * kv_width]
        kept += _autocast_linears("attention", "q/k/v proj", tokens * hidden, projections, layers)
        kept.append(Kept("attention", "o_proj: bf16 copy of the weight", q_width * hidden, BF16, layers))
    else:
        kept.append(
            Kept("attention", "q/k/v proj: input (the gathered sequence under tp)", tokens * hidden, FP32, layers)
        )
    # the q/k norms read the bf16 projections under autocast: float32 input copy, bf16 normalized tensor
    kept += _rms_norm("attention", "q_norm", tokens * h_local, head_dim, layers, normalized=act)
    kept += _rms_norm("attention", "k_norm", tokens * kv_local, head_dim, layers, normalized=act)
    kept.append(Kept("attention", "rope: cos and sin (shared by every layer)", 2 * plan.seq * head_dim, FP32))
    # under autocast RoPE's float32 q/k (the norm's float32 weight times bf16) are cast to bf16 for SDPA
    kept += [
        Kept("attention", "sdpa: q after rope", tokens * q_width, act, layers),
        Kept("attention", "sdpa: k after rope", tokens * kv_width, act, layers),
        Kept("attention", "sdpa: v", tokens * kv_width, act, layers),
        Kept("attention", "sdpa: output (o_proj reads a view)", tokens * q_width, act, layers),
        Kept("attention", "sdpa: log-sum-exp (float32)", tokens * h_local, FP32, layers),
    ]
    kept += _rms_norm("mlp", "post_attention_layernorm", local, hidden, layers)
    if moe_layers:
        experts, top_k = config.num_experts, config.num_experts_per_tok
        width = config.moe_intermediate_size
        normalize = bool(getattr(config, "norm_topk_prob", False))
        kept += _router(local, hidden, experts, top_k, normalize, moe_layers, bf16=bf16)
        if plan.ep > 1:
            kept += _expert_parallel_experts(local, top_k, hidden, width, experts, plan.ep, moe_layers, act)
        else:
            kept += _grouped_mm_experts(local * top_k, hidden, width, experts, moe_layers, act)
    if dense_layers:
        kept += _gated_mlp("mlp", tokens, hidden, config.intermediate_size / tp, len(dense_layers), bf16=bf16)
    kept += _head(plan, config, tokens, local, bf16=bf16)
    experts_impl = "trex.ep_exchange/ep_experts_local" if plan.ep > 1 else "transformers grouped_mm"
    style = ", DTensor sequence parallelism" if tp > 1 else ""
    precision = "bf16 autocast" if bf16 else "fp32"
    return ActivationModel(f"transformers eager qwen3_moe (sdpa, {experts_impl}{style}), {precision}", tuple(kept))


def _embedding(plan: ParallelConfig, tokens: float) -> list[Kept]:
    """The lookup keeps its ids; under tp (runtime.vocab_parallel) the shifted ids and the bool mask.

    The micro-batch's ids and targets are row slices (views) of the step's global batch, which every rank
    holds whole (runtime.data.as_global_batch): the storage the embedding and the loss keep is gbs x seq."""
    if plan.tp > 1:
        return [
            Kept("embedding", "vocab-parallel lookup: this rank's row ids", tokens, INT64),
            Kept("embedding", "vocab-parallel masked_fill: mask (bool)", tokens, BOOL),
        ]
    return [Kept("embedding", "embedding: token ids (a view of the global batch)", plan.gbs * plan.seq, INT64)]


def _head(plan: ParallelConfig, config: Any, tokens: float, local: float, *, bf16: bool = False) -> list[Kept]:
    hidden = config.hidden_size
    lm_head = (
        _autocast_linears("head", "lm_head", tokens * hidden, [hidden * config.vocab_size / plan.tp], 1)
        if bf16
        else [Kept("head", "lm_head: input (the gathered sequence under tp)", tokens * hidden, FP32)]
    )
    targets = Kept("head", "cross_entropy: targets (a view of the global batch)", plan.gbs * plan.seq, INT64)
    if plan.tp > 1:  # runtime.vocab_parallel.VocabParallelCrossEntropy: its softmax over this rank's columns
        loss = [
            Kept(
                "head",
                "vocab-parallel cross_entropy: softmax (float32, this rank's vocabulary)",
                tokens * config.vocab_size / plan.tp,
                FP32,
            ),
            targets,
        ]
    else:
        loss = [
            Kept("head", "cross_entropy: log-softmax (float32)", tokens * config.vocab_size, FP32),
            targets,
            Kept("head", "cross_entropy: total weight", 1, FP32),
        ]
    return _rms_norm("head", "final norm", local, hidden, 1) + lm_head + loss


def _deepseek_v3(config: Any, plan: ParallelConfig) -> ActivationModel:
    """DeepSeek-V3 (transformers `DeepseekV3DecoderLayer`, MLA) in fp32, under runtime.tensor_parallel_heads.

    Differences from Qwen3-MoE, op by op: MLA's q_a/kv_a projections share the (gathered, under tp) norm
    output; q_a_layernorm and kv_a_layernorm run on the latents of every token of the gathered sequence
    (replicated over tp), kv_a_layernorm's input being a view of kv_a's whole output (latent + rope);
    q_b/kv_b keep their norms' outputs. SDPA with a value head narrower than the query/key head runs
    torch's math path on CPU, whose decomposition keeps the scaled q and the transposed k of the first
    bmm, the softmax output (heads x seq x seq per sequence) and v; `o_proj` keeps a contiguous copy of the
    output. The router (sigmoid, grouped top-k) keeps its input, the float32 sigmoid, the top-k indices
    (read by the gather of the chosen scores), the normalisation's denominator and result; the group
    selection (per-group top-2 sums, the groups' top-k, the mask of the other groups) saves tensors too,
    but only its indices are used, so that branch reaches no loss and autograd frees it, with what it
    saved, during the forward (`runtime.memory_accounting` counts what is alive when the forward ends). Shared
    experts are a gated MLP on the MoE block's input (the
    same tensor as the router's without tp; the gathered sequence under tp, 1/tp of its width). Under tp
    the first layer's input is a slice (a view) of the embedding's all-gathered whole sequence, so the
    storage its norm keeps is the whole sequence's."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    tp = plan.tp
    tokens = plan.mbs * plan.seq
    local = tokens / tp
    h_local = heads / tp
    q_lora, kv_lora = config.q_lora_rank, config.kv_lora_rank
    nope, rope, v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    layers = config.num_hidden_layers
    dense = min(config.first_k_dense_replace, layers)
    moe_layers = layers - dense
    bf16 = plan.precision == "bf16"  # autocast
    act = BF16 if bf16 else FP32
    kept = _embedding(plan, tokens)
    kept += _rms_norm("attention", "input_layernorm", local, hidden, layers - 1)
    first_input = tokens if tp > 1 else local  # under tp: a view of the all-gathered embedding output
    kept.append(Kept("attention", "input_layernorm (layer 0): input", first_input * hidden, FP32))
    kept += _rms_norm("attention", "input_layernorm (layer 0)", local, hidden, 1, keeps_input=False)
    if bf16:
        down = [hidden * q_lora] if q_lora else []
        kept += _autocast_linears(
            "attention", "q_a/kv_a proj", tokens * hidden, down + [hidden * (kv_lora + rope)], layers
        )
    else:
        kept.append(
            Kept("attention", "q_a/kv_a proj: input (the gathered sequence under tp)", tokens * hidden, FP32, layers)
        )
    q_width = h_local * (nope + rope)
    if q_lora:
        kept += _rms_norm("attention", "q_a_layernorm", tokens, q_lora, layers, normalized=act)
        if bf16:  # the norm's output is float32 (its weight times the bf16 normalized): q_b casts it
            kept += _autocast_linears("attention", "q_b_proj", tokens * q_lora, [q_lora * q_width], layers)
        else:
            kept.append(Kept("attention", "q_b_proj: input", tokens * q_lora, FP32, layers))
    if bf16:
        # the norm upcasts the latent slice of kv_a's bf16 output (a float32 copy of kv_lora columns)
        kept += _rms_norm("attention", "kv_a_layernorm", tokens, kv_lora, layers, normalized=BF16)
        kept += _autocast_linears(
            "attention", "kv_b_proj", tokens * kv_lora, [kv_lora * h_local * (nope + v_dim)], layers
        )
    else:
        kept += [
            Kept(
                "attention", "kv_a_layernorm: input (a view of kv_a's output)", tokens * (kv_lora + rope), FP32, layers
            ),
            Kept("attention", "kv_a_layernorm: rstd", tokens, FP32, layers),
            Kept("attention", "kv_a_layernorm: normalized", tokens * kv_lora, FP32, layers),
            Kept("attention", "kv_b_proj: input", tokens * kv_lora, FP32, layers),
        ]
    # SDPA's math path runs in float32 under autocast too (q and k are float32 once RoPE's float32 part is
    # concatenated; v arrives as a float32 copy), so only v's storage changes: its own copy, not kv_b's output
    v_view = (plan.mbs == 1 or h_local == 1) and not bf16  # folding [B, H] is a view when either is 1
    v_kept = tokens * h_local * (nope + v_dim if v_view else v_dim)
    kept += [
        Kept("attention", "rope: cos and sin (shared by every layer)", 2 * plan.seq * rope, FP32),
        Kept("attention", "sdpa (math): scaled q", tokens * q_width, FP32, layers),
        Kept("attention", "sdpa (math): k transposed", tokens * q_width, FP32, layers),
        Kept("attention", "sdpa (math): softmax output", plan.mbs * h_local * plan.seq * plan.seq, FP32, layers),
        # v is a slice of kv_b's output [B, s, H, nope+v] seen as [B, H, s, v]; the math path's bmm reshapes it
        # to [B*H, s, v], a view only when B = 1 or H = 1 (one head per tp rank), else a contiguous copy: the
        # storage kept is kv_b's output in the first two cases, v alone otherwise.
        Kept("attention", "sdpa (math): v (kv_b's output when mbs = 1 or one head, else a copy)", v_kept, FP32, layers),
    ]
    if bf16:  # o_proj casts the float32 attention output: its bf16 copy is the input it keeps
        kept += _autocast_linears("attention", "o_proj", tokens * h_local * v_dim, [h_local * v_dim * hidden], layers)
    else:
        kept.append(Kept("attention", "o_proj: input (contiguous copy)", tokens * h_local * v_dim, FP32, layers))
    kept += _rms_norm("mlp", "post_attention_layernorm", local, hidden, layers)
    if dense:
        kept += _gated_mlp("mlp", tokens, hidden, config.intermediate_size / tp, dense, bf16=bf16)
    if moe_layers:
        experts, top_k = config.n_routed_experts, config.num_experts_per_tok
        # the router's linear runs under autocast (bf16 logits), and its sigmoid and normalisation keep that dtype
        kept += (
            _autocast_linears("moe", "router linear", local * hidden, [hidden * experts], moe_layers)
            if bf16
            else [Kept("moe", "router linear: input", local * hidden, FP32, moe_layers)]
        )
        kept += [
            Kept("moe", "sigmoid: output", local * experts, act, moe_layers),
            Kept("moe", "top-k: indices (the weights' gather)", local * top_k, INT64, moe_layers),
        ]
        if getattr(config, "norm_topk_prob", False):
            kept += [
                Kept("moe", "top-k normalisation: denominator", local, act, moe_layers),
                Kept("moe", "top-k normalisation: result", local * top_k, act, moe_layers),
            ]
        width = config.moe_intermediate_size
        if plan.ep > 1:
            kept += _expert_parallel_experts(local, top_k, hidden, width, experts, plan.ep, moe_layers, act)
        else:
            kept += _grouped_mm_experts(local * top_k, hidden, width, experts, moe_layers, act)
        if config.n_shared_experts:
            shared = _gated_mlp("moe", tokens, hidden, width * config.n_shared_experts / tp, moe_layers, bf16=bf16)
            kept += shared if tp > 1 or bf16 else shared[1:]  # fp32 without tp: the input is the router's
    kept += _head(plan, config, tokens, local, bf16=bf16)
    experts_impl = "trex.ep_exchange/ep_experts_local" if plan.ep > 1 else "transformers grouped_mm"
    style = ", head-parallel tp" if tp > 1 else ""
    precision = "bf16 autocast" if bf16 else "fp32"
    return ActivationModel(
        f"transformers eager deepseek_v3 (sdpa math, {experts_impl}{style}), {precision}", tuple(kept)
    )


def _rope_dim(config: Any, rope_type: str) -> int:
    """Channels V4's interleaved RoPE rotates for `rope_type` ("main" or "compress"): one frequency per pair of
    `int(head_dim * partial_rotary_factor)` channels, each repeated twice (`repeat_interleave(2)`)."""
    params = (getattr(config, "rope_parameters", None) or {}).get(rope_type) or {}
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    dim = int(config.head_dim * factor)
    return 2 * ((dim + 1) // 2)


def _hyper_connection(
    name: str,
    tokens: float,
    streams: int,
    hidden: int,
    iters: int,
    count: int,
    *,
    bf16: bool = False,
    block_output: int = FP32,
) -> list[Kept]:
    """One DeepSeek-V4 mHC module (`DeepseekV4HyperConnection`) and the mix after its block, per layer.

    The unweighted norm keeps the flattened streams (the block's input streams, which the collapse and the
    mix's matmul read too: one storage) and its rsqrt; the projection keeps the normalized streams; the
    scale multiplications keep the projection's output (pre, post and comb are views of it); the sigmoids
    and the softmax keep their outputs; every Sinkhorn division keeps its numerator and its denominator
    (one column division, then a row and a column division per further iteration); the collapse keeps
    `pre`; after the block, the mix keeps `post`, the block's output and a contiguous copy of comb
    transposed (the batched matmul's operand).

    Under bf16 autocast (`bf16`) the projection is a Linear: it keeps a bf16 copy of the normalized streams and
    of its weight `fn`, and its output (the logits) is bf16; adding the float32 biases (1-D, so they promote)
    puts the sigmoids, softmax and Sinkhorn back in float32. The mix's matmul is on autocast's list too: it
    keeps bf16 copies of comb transposed and of the residual streams. `block_output`: the itemsize of the
    block's output the mix's `post * output` keeps (attention: bf16, its o_b_proj is a Linear; the MoE block:
    float32, the float32 routed output plus the bf16 shared expert)."""
    t, n = tokens, streams
    divisions = 2 * iters - 1
    act = BF16 if bf16 else FP32
    projection_input = (
        [
            Kept("mhc", f"{name}: bf16 copy of the normalized streams (the projection's input)", t * n * hidden, BF16),
            Kept("mhc", f"{name}: bf16 copy of the projection weight fn", (2 + n) * n * n * hidden, BF16),
        ]
        if bf16
        else [Kept("mhc", f"{name}: normalized streams (the projection's input)", t * n * hidden, FP32)]
    )
    mix_copies = [Kept("mhc", f"{name}: mix: bf16 copy of the streams (matmul)", t * n * hidden, BF16)] if bf16 else []
    kept = [
        Kept("mhc", f"{name}: input streams (norm, collapse and mix read them)", t * n * hidden, FP32),
        Kept("mhc", f"{name}: rsqrt (one per token)", t, FP32),
        *projection_input,
        Kept("mhc", f"{name}: projection output (pre/post/comb logits)", t * (2 + n) * n, act),
        Kept("mhc", f"{name}: pre and post sigmoid outputs", 2 * t * n, FP32),
        Kept("mhc", f"{name}: comb softmax output", t * n * n, FP32),
        Kept("mhc", f"{name}: Sinkhorn divisions: numerators", divisions * t * n * n, FP32),
        Kept("mhc", f"{name}: Sinkhorn divisions: denominators", divisions * t * n, FP32),
        Kept("mhc", f"{name}: collapse: pre", t * n, FP32),
        Kept("mhc", f"{name}: mix: post", t * n, FP32),
        Kept("mhc", f"{name}: mix: comb transposed (copy)", t * n * n, act),
        *mix_copies,
        Kept("mhc", f"{name}: mix: the block's output", t * hidden, block_output),
    ]
    return [Kept(k.part, k.what, k.elements, k.itemsize, count) for k in kept]


def _deepseek_v4(config: Any, plan: ParallelConfig) -> ActivationModel:
    """DeepSeek-V4 (transformers `DeepseekV4DecoderLayer`), fp32 or bf16 autocast, without tp, eager attention.

    Per layer: two mHC modules (`_hyper_connection`) around attention and the MoE block, each block reading
    the collapsed stream through a weighted RMSNorm. Attention: q_a/kv_proj (and the compressor's and
    indexer's projections) share the norm's output; q_a_norm keeps q_a's output, rstd and the normalized
    latent (q_b's input); the unweighted q_b_norm keeps q_b's output and one rsqrt per (token, head);
    kv_norm keeps kv_proj's output, rstd and the normalized KV head; every `apply_rotary_pos_emb` keeps
    the cos and sin it expanded (`repeat_interleave`), for q, kv and the output's inverse rotation (S x
    rope channels each, the positions being one row), and for the compressed entries (B x windows x rope
    channels). Compressors (HCA: windows of `compress_rate`; CSA: overlapping windows of twice that) keep
    the window rows their gated sum multiplies (HCA: a view of kv_proj's whole output; CSA: the re-laid
    `new_kv`), the float32 gate softmax, and their kv_norm's input, rstd and output. CSA's lightning indexer
    only chooses *which* entries each query sees (integer top-k indices): its branch reaches no loss and is
    freed with what it saved before the backward. Eager attention with sinks: the first matmul keeps q and
    a copy of the single KV head repeated over the heads (`repeat_kv`), the second another copy (values);
    the max keeps its int64 indices and the softmax its output over keys + compressed entries + sink. The
    grouped output projection keeps a contiguous copy of the rotated output; o_b_proj keeps its input.
    MoE: the router keeps its input, softplus's input and sqrt's output (`sqrtsoftplus`; one output for
    sigmoid/softmax), the chosen experts (the gather's int64 index: hash layers' `tid2eid` lookup, top-k
    layers' indices) and the normalisation's numerator and denominator; routed experts as transformers'
    grouped GEMMs with V4's SwiGLU clamps (`_grouped_mm_experts(clamped=True)`) or the expert-parallel
    nodes; the shared expert (`DeepseekV4MLP`) keeps gate's and up's outputs (the clamps' inputs), the
    clamps' outputs, SiLU's output and the product. The head's `DeepseekV4HyperHead` keeps the final
    streams, rsqrt, the normalized streams, the mixes, the sigmoid output and `pre`.

    bf16 autocast (what changes, op by op; the residual streams stay float32): every Linear (q_a, kv_proj, the
    compressor's kv/gate, router, shared expert, the mHC projections, the head) keeps its own bf16 copy of its
    float32 input and a bf16 copy of its weight, and produces bf16; a Linear reading a bf16 tensor (q_b, o_b,
    the shared expert's down) keeps that tensor and a weight copy. The weighted norms of bf16 projections
    (q_a_norm, kv_norm, the compressors' kv_norm) upcast their input: the float32 copy takes the input's place,
    so their bytes do not change; their output is cast back to bf16. The unweighted q_b_norm keeps the bf16
    q_b output, a float32 copy of it (`x.float().square()`), the float32 rsqrt and its bf16 cast. RoPE's float32
    rotation of a bf16 tensor is cast back (q, kv, the output, the compressed entries are bf16; the compressed
    entries' cos and sin take the bf16 dtype of the compressor's norm output). The compressors keep the bf16
    window rows, the float32 gate softmax and its bf16 cast. Attention's first matmul reads bf16 q and keys;
    adding the float32 mask promotes the logits to float32 (max, softmax unchanged), and the probabilities are
    cast to a bf16 copy for the second matmul. The grouped o_a bmm keeps a bf16 weight copy. The router's
    scores, the gathered weights and their normalisation are bf16; the grouped-GEMM experts stay float32
    (routing weights bf16); the shared expert's six tensors are bf16. The hyper-head keeps a bf16 copy of the
    normalized streams and of `hc_fn`, and bf16 mixes."""
    hidden, heads, head_dim = config.hidden_size, config.num_attention_heads, config.head_dim
    if getattr(config, "_attn_implementation", None) not in (None, "eager"):
        raise NotCovered(f"DeepSeek-V4 with attention {config._attn_implementation!r} (described: eager)")
    scoring = getattr(config, "scoring_func", "sqrtsoftplus")
    if scoring not in ("sqrtsoftplus", "sigmoid", "softmax"):
        raise NotCovered(f"DeepSeek-V4 router scoring {scoring!r} (described: sqrtsoftplus, sigmoid, softmax)")
    bf16 = plan.precision == "bf16"
    act = BF16 if bf16 else FP32  # what Linears (and the matmuls autocast runs) produce
    b, s = plan.mbs, plan.seq
    tokens = b * s  # T: the micro-batch's tokens (attention and the shared expert gather them under tp)
    tp = plan.tp
    local = tokens / tp  # t: this rank's sequence shard (hyper-connections, norms, router, routed experts)
    heads_local = heads / tp
    layers = config.num_hidden_layers
    layer_types = list(config.layer_types)[:layers]
    streams, iters = config.hc_mult, config.hc_sinkhorn_iters
    q_lora, o_lora = config.q_lora_rank, config.o_lora_rank
    groups = config.o_groups / tp  # o_a_proj's output groups are split by whole groups of heads
    kept = _embedding(plan, tokens)
    kept += _hyper_connection("attn_hc", local, streams, hidden, iters, layers, bf16=bf16, block_output=act)
    kept += _hyper_connection("ffn_hc", local, streams, hidden, iters, layers, bf16=bf16)
    if tp > 1:  # layer 0's streams are a slice (a view) of the embedding's whole-sequence streams
        kept.append(
            Kept(
                "mhc",
                "attn_hc (layer 0): the rest of the whole sequence's streams",
                (tokens - local) * streams * hidden,
                FP32,
            )
        )
        if b > 1 and not bf16:
            # with more than one sequence that slice is not contiguous: layer 0's mix matmul folds [B, S/tp] into
            # one dimension and keeps a contiguous copy of it (under bf16 it keeps its bf16 copy instead)
            kept.append(
                Kept(
                    "mhc",
                    "attn_hc mix (layer 0): contiguous copy of the streams' slice",
                    local * streams * hidden,
                    FP32,
                )
            )
    kept += _rms_norm("attention", "input_layernorm", local, hidden, layers)
    q_heads = tokens * heads_local * head_dim
    if bf16:
        kept += _autocast_linears(
            "attention", "q_a/kv proj", tokens * hidden, [hidden * q_lora, hidden * head_dim], layers
        )
        kept += [
            Kept("attention", "q_b_proj: input (q_a_norm's bf16 output)", tokens * q_lora, BF16, layers),
            Kept("attention", "q_b_proj: bf16 copy of the weight", q_lora * heads_local * head_dim, BF16, layers),
            Kept("attention", "q_b_norm (unweighted): float32 copy of q_b's output", q_heads, FP32, layers),
            Kept("attention", "q_b_norm (unweighted): bf16 cast of the rsqrt", tokens * heads_local, BF16, layers),
            Kept("attention", "o_a_proj: bf16 copy of the weight", o_lora * heads_local * head_dim, BF16, layers),
            Kept("attention", "o_b_proj: bf16 copy of the weight", groups * o_lora * hidden, BF16, layers),
        ]
    else:
        kept += [
            Kept(
                "attention",
                "q_a/kv proj (and compressor projections): input (gathered under tp)",
                tokens * hidden,
                FP32,
                layers,
            ),
            Kept("attention", "q_b_proj: input (q_a_norm output)", tokens * q_lora, FP32, layers),
        ]
    kept += [
        Kept("attention", "q_a_norm: input (q_a output, float32), normalized", 2 * tokens * q_lora, FP32, layers),
        Kept("attention", "q_a_norm: rstd", tokens, FP32, layers),
        Kept("attention", "q_b_norm (unweighted): q_b output", q_heads, act, layers),
        Kept("attention", "q_b_norm (unweighted): rsqrt per (token, head)", tokens * heads_local, FP32, layers),
        Kept("attention", "kv_norm: input (kv_proj output, float32), normalized", 2 * tokens * head_dim, FP32, layers),
        Kept("attention", "kv_norm: rstd", tokens, FP32, layers),
        Kept("attention", "attention matmul: q (after rope)", q_heads, act, layers),
        Kept("attention", "o_a_proj (grouped bmm): rotated output (copy)", q_heads, act, layers),
        Kept("attention", "o_b_proj: input", tokens * groups * o_lora, act, layers),
    ]
    for kind in sorted(set(layer_types)):
        kept += _v4_attention_kind(config, plan, kind, layer_types.count(kind), heads_local)
    kept += _rms_norm("moe", "post_attention_layernorm", local, hidden, layers)
    experts, top_k, width = config.n_routed_experts, config.num_experts_per_tok, config.intermediate_size
    score_kept = 2 if scoring == "sqrtsoftplus" else 1
    kept += (
        _autocast_linears("moe", "router linear", local * hidden, [hidden * experts], layers)
        if bf16
        else [Kept("moe", "router linear: input", local * hidden, FP32, layers)]
    )
    kept += [
        Kept("moe", f"{scoring}: kept tensors", score_kept * local * experts, act, layers),
        Kept("moe", "gather: chosen experts (tid2eid lookup or top-k indices)", local * top_k, INT64, layers),
        Kept("moe", "normalisation: numerator and denominator", local * (top_k + 1), act, layers),
    ]
    if plan.ep > 1:
        kept += _expert_parallel_experts(local, top_k, hidden, width, experts, plan.ep, layers, act)
    else:
        kept += _grouped_mm_experts(local * top_k, hidden, width, experts, layers, act, clamped=True)
    shared = width / tp  # the shared expert's columns under tp; it reads the gathered sequence
    if bf16:
        kept += _autocast_linears("moe", "shared expert gate/up proj", tokens * hidden, [hidden * shared] * 2, layers)
        kept.append(Kept("moe", "shared expert down proj: bf16 copy of the weight", shared * hidden, BF16, layers))
    elif tp > 1:  # without tp gate/up read the router's input
        kept.append(
            Kept("moe", "shared expert gate/up proj: input (the gathered sequence)", tokens * hidden, FP32, layers)
        )
    kept.append(
        Kept("moe", "shared expert: gate/up outputs, clamps, SiLU output, product", 6 * tokens * shared, act, layers)
    )
    head_projection = (
        [
            Kept("head", "hc_head: bf16 copy of the normalized streams", local * streams * hidden, BF16),
            Kept("head", "hc_head: bf16 copy of hc_fn", streams * streams * hidden, BF16),
        ]
        if bf16
        else [Kept("head", "hc_head: normalized streams", local * streams * hidden, FP32)]
    )
    kept += [
        Kept("head", "hc_head: final streams", local * streams * hidden, FP32),
        *head_projection,
        Kept("head", "hc_head: rsqrt", local, FP32),
        Kept("head", "hc_head: mixes", local * streams, act),
        Kept("head", "hc_head: sigmoid output, pre", 2 * local * streams, FP32),
    ]
    kept += _head(plan, config, tokens, local, bf16=bf16)
    experts_impl = "trex.ep_exchange/ep_experts_local" if plan.ep > 1 else "transformers grouped_mm"
    precision = "bf16 autocast" if bf16 else "fp32"
    style = ", head-parallel tp" if tp > 1 else ""
    return ActivationModel(
        f"transformers eager deepseek_v4 (eager attention with sinks, mHC, {experts_impl}{style}), {precision}",
        tuple(kept),
    )


def _v4_attention_kind(config: Any, plan: ParallelConfig, kind: str, count: int, heads: float) -> list[Kept]:
    """What V4's attention keeps per layer type (`count` layers of `kind`): RoPE's cos and sin, the compressor
    (HCA or CSA) and the eager attention with sinks over the sequence plus the compressed entries. Under tp the
    compressor runs on the gathered sequence (replicated), attention on `heads` = this rank's heads."""
    bf16 = plan.precision == "bf16"
    act = BF16 if bf16 else FP32
    hidden, head_dim = config.hidden_size, config.head_dim  # heads: this rank's (H / tp)
    b, s = plan.mbs, plan.seq
    tokens = b * s
    rope_type = "main" if kind == "sliding_attention" else "compress"
    rope = _rope_dim(config, rope_type)
    # q, kv and the output's inverse rotation: cos and sin of one position row each
    kept = [Kept("attention", f"rope ({rope_type}): cos and sin, q/kv/output", 3 * 2 * s * rope, FP32, count)]
    windows = 0
    if kind in ("compressed_sparse_attention", "heavily_compressed_attention"):
        hca = kind == "heavily_compressed_attention"
        rate = config.compress_rates[kind]
        windows = s // rate
        if windows:
            if bf16:  # kv_proj and gate_proj read the block's input (a bf16 copy each); with no window their
                # outputs reach no loss and are freed with the copies
                width = head_dim if hca else 2 * head_dim
                kept += _autocast_linears(
                    "attention", f"{kind}: compressor kv/gate proj", tokens * hidden, [hidden * width] * 2, count
                )
            compressed = b * windows
            gated = compressed * (rate if hca else 2 * rate) * head_dim
            # HCA's window rows are a view of kv_proj's whole output; CSA's the re-laid `new_kv`
            kept += [
                Kept(
                    "attention",
                    f"{kind}: window rows (HCA: kv_proj output; CSA: new_kv)",
                    tokens * head_dim if hca else gated,
                    act,
                    count,
                ),
                Kept("attention", f"{kind}: gate softmax (float32)", gated, FP32, count),
            ]
            if bf16:
                kept.append(Kept("attention", f"{kind}: gate softmax cast to bf16", gated, BF16, count))
            kept += [
                Kept(
                    "attention", f"{kind}: kv_norm input (float32), normalized", 2 * compressed * head_dim, FP32, count
                ),
                Kept("attention", f"{kind}: kv_norm rstd", compressed, FP32, count),
                Kept(
                    "attention",
                    f"{kind}: rope cos and sin (the norm output's dtype)",
                    2 * compressed * _rope_dim(config, "compress"),
                    act,
                    count,
                ),
            ]
    keys = s + windows
    # repeat_kv expands the single KV head over the heads (a stride-0 view); the batched matmuls fold
    # [B, H] into one dimension, which copies keys and values when B > 1 (and H > 1); with one sequence
    # per micro-batch both read the concatenated KV entries themselves
    kv_copies = 2 * b * heads * keys * head_dim if heads > 1 and b > 1 else b * keys * head_dim
    kept += [
        Kept("attention", f"{kind}: repeat_kv copies (keys, values)", kv_copies, act, count),
        Kept("attention", f"{kind}: max indices (int64)", tokens * heads, INT64, count),
        Kept("attention", f"{kind}: softmax over keys + entries + sink", tokens * heads * (keys + 1), FP32, count),
    ]
    if bf16:  # the float32 probabilities (a view without the sink) cast for the bf16 value matmul
        kept.append(Kept("attention", f"{kind}: probabilities cast to bf16", tokens * heads * keys, BF16, count))
    return kept

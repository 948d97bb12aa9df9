"""`ModelSpec`: a transformer described by what it computes per token, for analytical pricing.

A spec is a list of layers; each `LayerSpec` lists its weight GEMMs (`Linear`, with how tensor
parallelism splits them), its attention cores (`AttentionCore`, with the keys each query attends),
its MoE block (`MoESpec`), the memory-bound kernels around them (`Pointwise`), the tensors it keeps
for the backward pass (`Saved`, tagged with the recompute module that can drop them) and the
tensor-parallel collectives of its forward (`TPCollective`). Per-token quantities are per token of
one sequence; everything that depends on the sequence length is a method taking `seq`.

Specs are built from a transformers config (`spec_from_config`: Llama/Mistral, Mixtral, Qwen2/3,
Qwen2-MoE/Qwen3-MoE, DeepSeek-V2/V3, DeepSeek-V4) or from built-in shapes for models that are not
transformers checkpoints (`gpt-22b` ... `gpt-1t` from Megatron, `pangu-ultra-135b`).

Recompute-module tags follow Megatron's `--recompute-modules` names: core_attn, mla_up_proj,
layernorm, moe_act, mlp, moe, shared_experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from trex.cost_model.host import HostOps, host_ops_for
from trex.errors import TrexError, UnknownNameError

Parallel = Literal["column", "row", "replicated", "sequence"]
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "moe_act", "mlp", "moe", "shared_experts")


@dataclass(frozen=True)
class Linear:
    """A weight GEMM applied to every token: [tokens, in] @ [in, out] (`groups` block-diagonal copies).

    parallel: `column` splits out_features over tensor parallelism, `row` splits in_features,
    `replicated` keeps the whole weight on every TP rank and runs on the gathered sequence,
    `sequence` keeps the whole weight and runs on the sequence-parallel shard only (routers,
    MLA down-projections).
    """

    name: str
    in_features: int
    out_features: int
    parallel: Parallel = "column"
    groups: int = 1
    bias: bool = False
    tag: str = ""  # recompute module this GEMM belongs to
    model_flops: bool = True  # counted by Megatron's model-FLOP formula (routers are not)
    fp8: bool = True  # runs in FP8 under an FP8 recipe (heads, routers and gates stay BF16)
    backward: bool = True  # False: no gradient reaches it (its output only picks indices): forward only
    # The transformers implementation runs this GEMM as `splits` projections of the same input (q/k/v,
    # gate/up), which read that input, and write partial input gradients, once each; the spec prices the
    # fused GEMM Megatron runs (`trex.cost_model.agreement` adds the difference when it compares bytes).
    splits: int = 1
    dtype: str = ""  # the reference computes it in this dtype whatever the plan's precision ("fp32": routers, mHC)

    @property
    def params(self) -> int:
        return self.groups * self.in_features * self.out_features + (
            self.groups * self.out_features if self.bias else 0
        )

    @property
    def flops_per_token(self) -> int:
        return 2 * self.groups * self.in_features * self.out_features


@dataclass(frozen=True)
class AttentionCore:
    """softmax(Q K^T) V for `heads` query heads over the keys a query may attend.

    Keys: all earlier tokens (`causal`), the last `window` tokens, plus compressed entries (one
    per `compress_rate` tokens, of which only `compress_topk` are kept when set: DeepSeek-V4 CSA).
    `v_head_dim = 0` marks a score-only core (V4's lightning indexer).
    """

    name: str
    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    causal: bool = True
    window: int | None = None
    compress_rate: int | None = None
    compress_topk: int | None = None
    dropout: bool = False
    sinks: bool = False
    backward: bool = True  # False: no gradient reaches it (a score-only core whose scores only pick indices)

    def keys_per_query(self, seq: int) -> float:
        """Average keys attended per query over positions 0..seq-1 (exact for the masks above)."""
        if self.window is not None:
            w = min(self.window, seq)
            keys = w - w * (w - 1) / (2 * seq) if w else 0.0
        elif self.causal:
            keys = (seq + 1) / 2
        else:
            keys = float(seq)
        if self.compress_rate:
            keys += _compressed_keys(seq, self.compress_rate, self.compress_topk)
        return keys

    def key_length(self, seq: int) -> float:
        """Keys in a query's row of the score matrix before any mask: the sequence (none for a core
        over compressed entries only, `window == 0`) plus one compressed entry per `compress_rate`
        tokens. What unfused attention computes for every query (transformers' eager attention
        concatenates the compressed entries to the window's keys and masks the square)."""
        keys = 0.0 if self.window == 0 else float(seq)
        if self.compress_rate:
            keys += seq // self.compress_rate
        return keys

    def megatron_keys(self, seq: int) -> float:
        """Megatron's model-FLOP count takes seq/2 keys for a causal mask and seq otherwise."""
        if self.window is None and not self.compress_rate:
            return seq / 2 if self.causal else float(seq)
        return self.keys_per_query(seq)

    def flops_per_token(self, keys: float) -> float:
        return 2.0 * self.heads * keys * (self.qk_head_dim + self.v_head_dim)


def _compressed_keys(seq: int, rate: int, topk: int | None) -> float:
    """Mean over positions i < seq of min(topk, floor((i + 1) / rate)), in closed form."""

    def floor_sum(n: int) -> int:  # sum_{v=1..n} floor(v / rate)
        q, rem = divmod(n, rate)
        return rate * q * (q - 1) // 2 + q * (rem + 1)

    if topk is None or topk * rate > seq:
        return floor_sum(seq) / seq
    saturated_from = topk * rate  # v >= topk * rate contributes topk
    return (floor_sum(saturated_from - 1) + topk * (seq - saturated_from + 1)) / seq


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    expert_ffn: int
    gated: bool = True
    shared_ffn: int = 0  # total width of the always-on shared expert(s)
    router: Literal["learned", "hash"] = "learned"
    num_groups: int | None = None  # group-limited routing (DeepSeek-V3: 8 groups, top-4 groups)
    topk_groups: int | None = None

    @property
    def fc1_out(self) -> int:
        return self.expert_ffn * (2 if self.gated else 1)

    def expert_params(self, hidden: int) -> int:
        return self.num_experts * (hidden * self.fc1_out + self.expert_ffn * hidden)

    def active_expert_params(self, hidden: int) -> int:
        return self.top_k * (hidden * self.fc1_out + self.expert_ffn * hidden)

    def expert_flops_per_token(self, hidden: int) -> int:
        return 2 * self.active_expert_params(hidden)


@dataclass(frozen=True)
class Pointwise:
    """Memory-bound kernels: `bytes_per_token` read + written in the forward pass."""

    name: str
    bytes_per_token: float
    kernels: int = 1
    tag: str = ""
    tp_sharded: bool = True  # runs on a TP/SP shard (divided by tp)
    moe_rows: bool = False  # scales with routed rows (imbalance applies)


@dataclass(frozen=True)
class Saved:
    """A tensor kept for the backward pass: bytes per token (+ per token per sequence position)."""

    name: str
    bytes_per_token: float
    tag: str = ""
    tp_sharded: bool = True
    moe_rows: bool = False
    gemm_input: bool = False  # kept for a weight gradient: stored in FP8 (half the bytes) under FP8 recipes


@dataclass(frozen=True)
class TPCollective:
    """A forward tensor-parallel collective of `bytes_per_token` per token of the full sequence."""

    kind: Literal["all_gather", "reduce_scatter"]
    bytes_per_token: float
    name: str = ""


@dataclass(frozen=True)
class LayerSpec:
    kind: str
    linears: tuple[Linear, ...]
    attention: tuple[AttentionCore, ...] = ()
    moe: MoESpec | None = None
    pointwise: tuple[Pointwise, ...] = ()
    saved: tuple[Saved, ...] = ()
    tp_collectives: tuple[TPCollective, ...] = ()
    norm_params: int = 0  # RMSNorm / LayerNorm weights and other small vectors
    extra_params: int = 0  # small weights priced nowhere else (mHC mixers, sinks, position biases)
    input_bytes_per_token: int = 0  # what full recompute keeps: the layer input (bf16)
    muon_matrices: tuple[tuple[int, int, int], ...] = ()  # (count, rows, cols) of 2-D weights for Muon
    host_ops: HostOps | None = None  # framework ops the host issues per micro-batch (trex.cost_model.host)
    head_params: int = 0  # small per-head weights that tensor parallelism splits with their heads (attention sinks)

    def params(self, hidden: int) -> int:
        moe = self.moe.expert_params(hidden) if self.moe else 0
        small = self.norm_params + self.extra_params + self.head_params
        return sum(lin.params for lin in self.linears) + moe + small

    def active_params(self, hidden: int) -> int:
        moe = self.moe.active_expert_params(hidden) if self.moe else 0
        small = self.norm_params + self.extra_params + self.head_params
        return sum(lin.params for lin in self.linears) + moe + small

    def expert_params(self, hidden: int) -> int:
        return self.moe.expert_params(hidden) if self.moe else 0


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    hidden_size: int
    vocab_size: int
    layers: tuple[LayerSpec, ...]
    mtp_layers: tuple[LayerSpec, ...] = ()
    tie_embeddings: bool = False
    position_embedding_params: int = 0
    final_norm_params: int = 0
    optimizer: Literal["adamw", "muon"] = "adamw"
    source: str = ""
    residual_streams: int = 1  # DeepSeek-V4 mHC keeps hc_mult residual streams
    assumptions: tuple[str, ...] = ()  # what the description assumed rather than read (every estimate repeats them)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size + self.position_embedding_params

    @property
    def head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    @cached_property
    def total_params(self) -> int:
        """Every parameter of the main model (MTP modules excluded, as model cards count)."""
        body = sum(layer.params(self.hidden_size) for layer in self.layers)
        return body + self.embedding_params + self.head_params + self.final_norm_params

    @cached_property
    def mtp_params(self) -> int:
        return sum(layer.params(self.hidden_size) for layer in self.mtp_layers)

    @cached_property
    def active_params(self) -> int:
        """Parameters touched per token by the main model (embedding and head included)."""
        body = sum(layer.active_params(self.hidden_size) for layer in self.layers)
        return body + self.embedding_params + self.head_params + self.final_norm_params

    @cached_property
    def kind_counts(self) -> dict[str, int]:
        """How many layers of each kind (main stack and MTP together)."""
        counts: dict[str, int] = {}
        for layer in (*self.layers, *self.mtp_layers):
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
        return counts

    @cached_property
    def layer_kinds(self) -> dict[str, LayerSpec]:
        kinds: dict[str, LayerSpec] = {}
        for layer in (*self.layers, *self.mtp_layers):
            kinds.setdefault(layer.kind, layer)
        return kinds

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for layer in self.layers:
            kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
        stack = ", ".join(f"{n}x {k}" for k, n in kinds.items())
        mtp = f" + {len(self.mtp_layers)} MTP" if self.mtp_layers else ""
        return (
            f"{self.name}: {self.total_params / 1e9:.1f}B params ({self.active_params / 1e9:.1f}B active), "
            f"hidden {self.hidden_size}, vocab {self.vocab_size}, {self.num_layers} layers ({stack}){mtp}"
        )


# ---------------------------------------------------------------------------------------------
# Building blocks shared by the families. Bytes assume BF16 activations (2 bytes per element).

A = 2  # bytes per activation element


@dataclass
class _Block:
    """Accumulates one layer's parts while a family builder describes it."""

    linears: list[Linear] = field(default_factory=list)
    attention: list[AttentionCore] = field(default_factory=list)
    pointwise: list[Pointwise] = field(default_factory=list)
    saved: list[Saved] = field(default_factory=list)
    tp: list[TPCollective] = field(default_factory=list)
    norm_params: int = 0
    extra_params: int = 0
    head_params: int = 0
    moe: MoESpec | None = None

    def norm(
        self,
        name: str,
        width: int,
        *,
        tag: str = "layernorm",
        sharded: bool = True,
        weighted: bool = True,
        save_output: bool = True,
    ) -> None:
        """A LayerNorm/RMSNorm: reads and writes `width`; its input is kept, its output (the next
        GEMM's input) is kept unless the `layernorm` recompute module drops it."""
        self.pointwise.append(Pointwise(name, 2 * width * A + 8, 1, tag=tag, tp_sharded=sharded))
        self.saved.append(Saved(f"{name}.input", width * A + 4, "", sharded))
        if save_output:
            self.saved.append(Saved(f"{name}.output", width * A, tag, sharded, gemm_input=True))
        self.norm_params += width if weighted else 0

    def build(
        self, kind: str, hidden: int, residual_streams: int = 1, muon: tuple[tuple[int, int, int], ...] = ()
    ) -> LayerSpec:
        return LayerSpec(
            kind,
            tuple(self.linears),
            tuple(self.attention),
            self.moe,
            tuple(self.pointwise),
            tuple(self.saved),
            tuple(self.tp),
            self.norm_params,
            self.extra_params,
            residual_streams * hidden * A,
            muon,
            head_params=self.head_params,
        )


def _gqa_attention(
    b: _Block,
    *,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    qkv_bias: bool,
    qk_norm: bool,
    layer_norm: str = "input_layernorm",
    window: int | None = None,
    dropout: bool = False,
    sandwich: bool = False,
    sinks: bool = False,
) -> None:
    b.tp.append(TPCollective("all_gather", hidden * A, "attention input"))
    b.norm(layer_norm, hidden)
    q, kv = heads * head_dim, kv_heads * head_dim
    b.linears.append(Linear("qkv_proj", hidden, q + 2 * kv, "column", bias=qkv_bias, splits=3))
    if qk_norm:
        b.pointwise.append(Pointwise("qk_norm", 2 * (q + kv) * A, 2, tag="layernorm"))
        b.norm_params += 2 * head_dim
    b.pointwise.append(Pointwise("rope", 2 * (q + kv) * A, 1))
    b.saved.append(Saved("q_k_v", (q + 2 * kv) * A))
    b.attention.append(
        AttentionCore("attention", heads, kv_heads, head_dim, head_dim, window=window, dropout=dropout, sinks=sinks)
    )
    if sinks:
        b.head_params += heads  # one learned sink logit per head, kept with its head under tp
    b.saved.append(Saved("attention_output", q * A, gemm_input=True))
    b.linears.append(Linear("o_proj", q, hidden, "row", bias=qkv_bias))
    b.tp.append(TPCollective("reduce_scatter", hidden * A, "attention output"))
    if sandwich:
        b.norm("post_attention_norm", hidden, tag="", save_output=False)
    b.pointwise.append(Pointwise("residual_add", 3 * hidden * A))


def _dense_mlp(
    b: _Block,
    *,
    hidden: int,
    ffn: int,
    gated: bool,
    bias: bool = False,
    dropout: bool = False,
    sandwich: bool = False,
    norm_name: str = "post_attention_layernorm",
) -> None:
    b.tp.append(TPCollective("all_gather", hidden * A, "mlp input"))
    b.norm(norm_name, hidden)
    fc1 = ffn * (2 if gated else 1)
    b.linears.append(Linear("mlp.fc1", hidden, fc1, "column", bias=bias, tag="mlp", splits=2 if gated else 1))
    b.saved.append(Saved("mlp.fc1_output", fc1 * A, "mlp"))
    b.pointwise.append(Pointwise("mlp.activation", (fc1 + ffn) * A, 1, tag="mlp"))
    b.saved.append(Saved("mlp.activation_output", ffn * A, "mlp", gemm_input=True))
    b.linears.append(Linear("mlp.fc2", ffn, hidden, "row", bias=bias, tag="mlp"))
    b.tp.append(TPCollective("reduce_scatter", hidden * A, "mlp output"))
    if dropout:
        b.saved.append(Saved("mlp.dropout_mask", hidden))
    if sandwich:
        b.norm("post_mlp_norm", hidden, tag="", save_output=False)
    b.pointwise.append(Pointwise("residual_add", (3 * hidden + (hidden if dropout else 0)) * A))


def _moe_block(
    b: _Block,
    *,
    hidden: int,
    moe: MoESpec,
    shared_gate: bool = False,
    norm_name: str = "post_attention_layernorm",
    router_dtype: str = "",
) -> None:
    b.norm(norm_name, hidden)
    b.moe = moe
    b.linears.append(
        Linear(
            "router", hidden, moe.num_experts, "sequence", tag="moe", model_flops=False, fp8=False, dtype=router_dtype
        )
    )
    b.pointwise.append(Pointwise("router.topk_softmax", moe.num_experts * 4 * 3 + moe.top_k * 12, 3, tag="moe"))
    k = moe.top_k
    # dispatch permutation (gather rows), expert activations, un-permute + weighted sum
    b.pointwise.append(Pointwise("moe.permute", (1 + k) * hidden * A, 2, tag="moe"))
    b.saved.append(Saved("moe.expert_input", k * hidden * A, "moe", moe_rows=True, gemm_input=True))
    b.saved.append(Saved("moe.fc1_output", k * moe.fc1_out * A, "moe", moe_rows=True))
    b.pointwise.append(
        Pointwise("moe.activation", k * (moe.fc1_out + moe.expert_ffn) * A, 1, tag="moe_act", moe_rows=True)
    )
    b.saved.append(Saved("moe.activation_output", k * moe.expert_ffn * A, "moe_act", moe_rows=True, gemm_input=True))
    b.saved.append(Saved("moe.expert_output", k * hidden * A, "moe", moe_rows=True))
    b.pointwise.append(Pointwise("moe.unpermute", (k + 1) * hidden * A, 2, tag="moe"))
    if moe.shared_ffn:
        b.tp.append(TPCollective("all_gather", hidden * A, "shared expert input"))
        fc1 = 2 * moe.shared_ffn if moe.gated else moe.shared_ffn
        b.linears.append(
            Linear("shared_expert.fc1", hidden, fc1, "column", tag="shared_experts", splits=2 if moe.gated else 1)
        )
        b.saved.append(
            Saved("shared_expert.fc1_output", (2 if moe.gated else 1) * moe.shared_ffn * A, "shared_experts")
        )
        b.pointwise.append(Pointwise("shared_expert.activation", 3 * moe.shared_ffn * A, 1, tag="shared_experts"))
        b.saved.append(Saved("shared_expert.activation_output", moe.shared_ffn * A, "shared_experts", gemm_input=True))
        b.linears.append(Linear("shared_expert.fc2", moe.shared_ffn, hidden, "row", tag="shared_experts"))
        b.tp.append(TPCollective("reduce_scatter", hidden * A, "shared expert output"))
        if shared_gate:
            b.linears.append(Linear("shared_expert.gate", hidden, 1, "sequence", tag="shared_experts", fp8=False))
    b.pointwise.append(Pointwise("residual_add", 3 * hidden * A))


def _mla_attention(
    b: _Block, *, hidden: int, heads: int, q_lora: int | None, kv_lora: int, nope: int, rope: int, v_dim: int
) -> None:
    """DeepSeek-V2/V3 multi-head latent attention as Megatron runs it: down-projections on the
    sequence-parallel shard, the small latents all-gathered, up-projections column-parallel."""
    b.norm("input_layernorm", hidden)
    latent = (q_lora or 0) + kv_lora + rope
    if q_lora:
        b.linears.append(Linear("q_a_proj", hidden, q_lora, "sequence"))
    b.linears.append(Linear("kv_a_proj", hidden, kv_lora + rope, "sequence"))
    b.tp.append(TPCollective("all_gather", latent * A, "MLA latents"))
    if q_lora:
        b.norm("q_a_layernorm", q_lora, tag="", sharded=False)
        b.linears.append(Linear("q_b_proj", q_lora, heads * (nope + rope), "column", tag="mla_up_proj"))
    else:
        b.linears.append(Linear("q_proj", hidden, heads * (nope + rope), "column", tag="mla_up_proj"))
    b.norm("kv_a_layernorm", kv_lora, tag="", sharded=False)
    b.linears.append(Linear("kv_b_proj", kv_lora, heads * (nope + v_dim), "column", tag="mla_up_proj"))
    b.pointwise.append(Pointwise("rope", 2 * heads * rope * A * 2, 2, tag="mla_up_proj"))
    b.saved.append(Saved("q_k_v", heads * (2 * (nope + rope) + v_dim) * A, "mla_up_proj"))
    b.attention.append(AttentionCore("attention", heads, heads, nope + rope, v_dim))
    b.saved.append(Saved("attention_output", heads * v_dim * A, gemm_input=True))
    b.linears.append(Linear("o_proj", heads * v_dim, hidden, "row"))
    b.tp.append(TPCollective("reduce_scatter", hidden * A, "attention output"))
    b.pointwise.append(Pointwise("residual_add", 3 * hidden * A))


# ---------------------------------------------------------------------------------------------
# Families


def _cfg(config: Any, *names: str, default: Any = None, required: bool = True) -> Any:
    for name in names:
        value = getattr(config, name, None) if not isinstance(config, dict) else config.get(name)
        if value is not None:
            return value
    if default is not None or not required:
        return default
    model_type = getattr(config, "model_type", "?")
    raise TrexError(
        f"config (model_type {model_type!r}) lacks field {' / '.join(names)}; the cost model needs it to describe the model"
    )


def llama_like_spec(config: Any, name: str, *, family: str = "llama", sandwich_norm: bool = False) -> ModelSpec:
    """Llama, Mistral, Qwen2/3 and their MoE variants (Mixtral, Qwen2-MoE, Qwen3-MoE), and gpt-oss (attention
    sinks; sliding-window and full attention alternating as its `layer_types` say)."""
    hidden = _cfg(config, "hidden_size")
    heads = _cfg(config, "num_attention_heads")
    kv_heads = _cfg(config, "num_key_value_heads", default=heads)
    head_dim = _cfg(config, "head_dim", default=hidden // heads)
    layers_n = _cfg(config, "num_hidden_layers")
    vocab = _cfg(config, "vocab_size")
    model_type = _cfg(config, "model_type", default="llama")
    qkv_bias = bool(_cfg(config, "attention_bias", "qkv_bias", default=False, required=False)) or model_type in (
        "qwen2",
        "qwen2_moe",
    )
    qk_norm = model_type in ("qwen3", "qwen3_moe")
    window = _cfg(config, "sliding_window", required=False)
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not _cfg(
        config, "use_sliding_window", default=False, required=False
    ):
        window = None  # Qwen configs carry a sliding_window that is off unless use_sliding_window
    layer_types = _cfg(
        config, "layer_types", required=False
    )  # per layer "sliding_attention" | "full_attention", when given
    sinks = model_type == "gpt_oss"
    num_experts = _cfg(config, "num_local_experts", "num_experts", "n_routed_experts", required=False) or 0
    top_k = _cfg(config, "num_experts_per_tok", required=False) or 0
    moe = None
    if num_experts and top_k:
        moe = MoESpec(
            num_experts,
            top_k,
            _cfg(config, "moe_intermediate_size", "intermediate_size"),
            shared_ffn=_cfg(config, "shared_expert_intermediate_size", default=0, required=False) or 0,
        )
    sparse_step = _cfg(config, "decoder_sparse_step", default=1, required=False) or 1
    dense_only = set(_cfg(config, "mlp_only_layers", default=[], required=False) or [])
    ffn = _cfg(config, "intermediate_size", required=moe is None) or 0
    layers = []
    for index in range(layers_n):
        b = _Block()
        layer_window = window if not layer_types or layer_types[index] == "sliding_attention" else None
        _gqa_attention(
            b,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            window=layer_window,
            sandwich=sandwich_norm,
            sinks=sinks,
        )
        is_moe = moe is not None and index not in dense_only and (index + 1) % sparse_step == 0
        if is_moe:
            assert moe is not None
            _moe_block(b, hidden=hidden, moe=moe, shared_gate=model_type == "qwen2_moe")
        else:
            _dense_mlp(b, hidden=hidden, ffn=ffn, gated=True, sandwich=sandwich_norm)
        matrices = ((1, hidden, heads * head_dim + 2 * kv_heads * head_dim), (1, heads * head_dim, hidden))
        kind = "moe" if is_moe else "dense"
        if layer_types and len(set(layer_types)) > 1:
            kind += "+swa" if layer_window else "+full"  # priced apart: their attention differs
        layers.append(b.build(kind, hidden, muon=matrices))
    return _with_host_ops(
        ModelSpec(
            name,
            family,
            hidden,
            vocab,
            tuple(layers),
            tie_embeddings=bool(_cfg(config, "tie_word_embeddings", default=False, required=False)),
            final_norm_params=hidden,
            source=f"transformers config ({model_type})",
        )
    )


def deepseek_v3_spec(config: Any, name: str) -> ModelSpec:
    """DeepSeek-V2/V3: MLA attention, first_k_dense_replace dense layers, routed + shared experts, MTP."""
    hidden = _cfg(config, "hidden_size")
    heads = _cfg(config, "num_attention_heads")
    moe = MoESpec(
        _cfg(config, "n_routed_experts"),
        _cfg(config, "num_experts_per_tok"),
        _cfg(config, "moe_intermediate_size"),
        shared_ffn=(_cfg(config, "n_shared_experts", default=0, required=False) or 0)
        * _cfg(config, "moe_intermediate_size"),
        num_groups=_cfg(config, "n_group", required=False),
        topk_groups=_cfg(config, "topk_group", required=False),
    )
    first_dense = _cfg(config, "first_k_dense_replace", default=0, required=False)
    mla = dict(
        hidden=hidden,
        heads=heads,
        q_lora=_cfg(config, "q_lora_rank", required=False),
        kv_lora=_cfg(config, "kv_lora_rank"),
        nope=_cfg(config, "qk_nope_head_dim"),
        rope=_cfg(config, "qk_rope_head_dim"),
        v_dim=_cfg(config, "v_head_dim"),
    )

    def layer(index: int, kind: str | None = None) -> LayerSpec:
        b = _Block()
        _mla_attention(b, **mla)
        dense = index < first_dense
        if dense:
            _dense_mlp(b, hidden=hidden, ffn=_cfg(config, "intermediate_size"), gated=True)
        else:
            # an fp32 router GEMM: transformers' DeepseekV3TopKRouter, and Megatron-Bridge's DeepSeek provider
            # (moe_router_dtype = "fp32")
            _moe_block(b, hidden=hidden, moe=moe, router_dtype="fp32")
        return b.build(kind or ("dense" if dense else "moe"), hidden)

    layers = tuple(layer(i) for i in range(_cfg(config, "num_hidden_layers")))
    mtp = tuple(
        _mtp(layer(first_dense, "mtp"), hidden)
        for _ in range(_cfg(config, "num_nextn_predict_layers", default=0, required=False) or 0)
    )
    return _with_host_ops(
        ModelSpec(
            name,
            "deepseek-v3",
            hidden,
            _cfg(config, "vocab_size"),
            layers,
            mtp,
            final_norm_params=hidden,
            source="transformers DeepseekV3Config",
        )
    )


def _mtp(layer: LayerSpec, hidden: int, streams: int = 1) -> LayerSpec:
    """A multi-token-prediction module: norms, eh_proj (2h -> h) and one transformer layer; its
    logits reuse the shared head (priced with the head)."""
    extra = Linear("mtp.eh_proj", 2 * hidden, hidden, "replicated", tag="")
    pointwise = (Pointwise("mtp.norms", 4 * hidden * A * streams, 2),)
    saved = (Saved("mtp.inputs", 2 * hidden * A * streams),)
    return LayerSpec(
        "mtp",
        (extra, *layer.linears),
        layer.attention,
        layer.moe,
        pointwise + layer.pointwise,
        saved + layer.saved,
        layer.tp_collectives,
        layer.norm_params + 2 * hidden,
        layer.extra_params,
        layer.input_bytes_per_token,
        layer.muon_matrices,
        head_params=layer.head_params,
    )


def deepseek_v4_spec(config: Any, name: str) -> ModelSpec:
    """DeepSeek-V4: CSA/HCA attention (sliding window + compressed KV, lightning indexer, grouped
    output projection), mHC residual streams, hash-routed and learned MoE layers, MTP, Muon."""
    hidden = _cfg(config, "hidden_size")
    heads = _cfg(config, "num_attention_heads")
    head_dim = _cfg(config, "head_dim")
    q_lora = _cfg(config, "q_lora_rank")
    hc = _cfg(config, "hc_mult", default=1)
    window = _cfg(config, "sliding_window")
    rates = _cfg(config, "compress_rates")
    o_groups, o_lora = _cfg(config, "o_groups"), _cfg(config, "o_lora_rank")
    index_heads, index_dim, index_topk = (
        _cfg(config, "index_n_heads"),
        _cfg(config, "index_head_dim"),
        _cfg(config, "index_topk"),
    )
    rope = _cfg(config, "qk_rope_head_dim", default=64, required=False)
    experts = _cfg(config, "n_routed_experts")
    ffn = _cfg(config, "moe_intermediate_size")
    shared = (_cfg(config, "n_shared_experts", default=0, required=False) or 0) * ffn
    layer_types = list(_cfg(config, "layer_types"))
    mlp_types = list(_cfg(config, "mlp_layer_types"))
    mix = (2 + hc) * hc

    def hyper_connection(b: _Block, name: str) -> None:
        # mHC: RMS-normalise the hc*h streams, project to (2+hc)*hc mixing weights, Sinkhorn, collapse
        # the streams into the block input; afterwards expand the block output and mix the residual.
        b.pointwise.append(Pointwise(f"{name}.hc_pre", (2 * hc * hidden + hidden) * A, 4))
        # fp32, as transformers' DeepseekV4HyperConnection computes it
        b.linears.append(Linear(f"{name}.hc_fn", hc * hidden, mix, "sequence", tag="", fp8=False, dtype="fp32"))
        b.pointwise.append(Pointwise(f"{name}.hc_post", (hc * hidden + hidden + hc * hidden) * A, 3))
        b.saved.append(Saved(f"{name}.streams", hc * hidden * A))
        b.extra_params += mix + 3  # hc_base and hc_scale; the hc_fn projection is the Linear above

    def layer(index: int, kind_override: str | None = None) -> LayerSpec:
        attn_type = layer_types[index]
        rate = rates.get(attn_type) if attn_type != "sliding_attention" else None
        b = _Block()
        hyper_connection(b, "attn")
        b.tp.append(TPCollective("all_gather", hidden * A, "attention input"))
        b.norm("input_layernorm", hidden)
        b.linears.append(Linear("q_a_proj", hidden, q_lora, "replicated"))
        b.norm("q_a_norm", q_lora, tag="", sharded=False)
        b.linears.append(Linear("q_b_proj", q_lora, heads * head_dim, "column", tag="mla_up_proj"))
        b.pointwise.append(Pointwise("q_b_norm+rope", 4 * heads * head_dim * A, 2, tag="mla_up_proj"))
        b.linears.append(Linear("kv_proj", hidden, head_dim, "replicated"))
        b.norm("kv_norm", head_dim, tag="", sharded=False)
        b.saved.append(Saved("q", heads * head_dim * A, "mla_up_proj"))
        b.saved.append(Saved("kv", head_dim * A, "", tp_sharded=False))
        core = AttentionCore("attention", heads, 1, head_dim, head_dim, window=window, sinks=True)
        if rate is not None:
            csa = attn_type == "compressed_sparse_attention"
            width = 2 * head_dim if csa else head_dim
            b.linears.append(Linear("compressor.kv_proj", hidden, width, "replicated"))
            b.linears.append(Linear("compressor.gate_proj", hidden, width, "replicated"))
            b.pointwise.append(Pointwise("compressor.pool", 3 * width * A, 3, tp_sharded=False))
            b.extra_params += rate * width + head_dim
            core = AttentionCore(
                "attention",
                heads,
                1,
                head_dim,
                head_dim,
                window=window,
                compress_rate=rate,
                compress_topk=index_topk if csa else None,
                sinks=True,
            )
            if csa:
                # The lightning indexer's scores only choose the top-k compressed entries (transformers'
                # DeepseekV4Indexer returns indices), so the language-model loss sends it no gradient: it
                # runs forward only (a separately trained indexer, as DeepSeek-V3.2 warms it up with a KL
                # loss on detached inputs, is not what the captured model computes).
                b.linears.append(Linear("indexer.kv_proj", hidden, 2 * index_dim, "replicated", backward=False))
                b.linears.append(Linear("indexer.gate_proj", hidden, 2 * index_dim, "replicated", backward=False))
                # replicated under tp, as DeepSeek's inference code keeps the indexer (and runtime.tensor_parallel_heads)
                b.linears.append(
                    Linear("indexer.q_b_proj", q_lora, index_heads * index_dim, "replicated", backward=False)
                )
                b.linears.append(
                    Linear("indexer.weights_proj", hidden, index_heads, "replicated", fp8=False, backward=False)
                )
                b.attention.append(
                    AttentionCore("indexer", index_heads, 1, index_dim, 0, compress_rate=rate, window=0, backward=False)
                )
                b.pointwise.append(Pointwise("indexer.topk", 4 * index_topk * 3, 2, tp_sharded=False))
                b.extra_params += rate * 2 * index_dim + index_dim
        b.attention.append(core)
        b.saved.append(Saved("attention_output", heads * head_dim * A, gemm_input=True))
        b.pointwise.append(Pointwise("output_rope", 2 * heads * rope * A, 1))
        b.linears.append(Linear("o_a_proj", heads * head_dim // o_groups, o_lora, "column", groups=o_groups))
        b.saved.append(Saved("o_a_output", o_groups * o_lora * A, gemm_input=True))
        b.linears.append(Linear("o_b_proj", o_groups * o_lora, hidden, "row"))
        b.tp.append(TPCollective("reduce_scatter", hidden * A, "attention output"))
        b.head_params += heads  # attention sinks, one per head, split with the heads under tp
        hyper_connection(b, "mlp")
        hashed = mlp_types[index] == "hash_moe"
        _moe_block(
            b,
            hidden=hidden,
            moe=MoESpec(
                experts,
                _cfg(config, "num_experts_per_tok"),
                ffn,
                shared_ffn=shared,
                router="hash" if hashed else "learned",
            ),
        )
        kind = (
            kind_override
            or f"{'csa' if rate and attn_type == 'compressed_sparse_attention' else 'hca' if rate else 'swa'}+{'hash_moe' if hashed else 'moe'}"
        )
        matrices = (
            (1, hidden, q_lora),
            (1, q_lora, heads * head_dim),
            (1, hidden, head_dim),
            (o_groups, heads * head_dim // o_groups, o_lora),
            (1, o_groups * o_lora, hidden),
        )
        return b.build(kind, hidden, residual_streams=hc, muon=matrices)

    layers = tuple(layer(i) for i in range(_cfg(config, "num_hidden_layers")))
    last_learned = max(i for i, t in enumerate(mlp_types) if t == "moe") if "moe" in mlp_types else len(layers) - 1
    mtp = tuple(
        _mtp(layer(last_learned, "mtp"), hidden, hc)
        for _ in range(_cfg(config, "num_nextn_predict_layers", default=0, required=False) or 0)
    )
    return _with_host_ops(
        ModelSpec(
            name,
            "deepseek-v4",
            hidden,
            _cfg(config, "vocab_size"),
            layers,
            mtp,
            final_norm_params=hidden + hc * hidden * hc + hc + 1,
            optimizer="muon",
            source="transformers DeepseekV4Config",
            residual_streams=hc,
        )
    )


def gpt_spec(
    name: str, *, layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048, source: str = ""
) -> ModelSpec:
    """Megatron GPT: LayerNorm, learned positions, MHA with biases, GeLU MLP of 4h, dropout 0.1.

    Saved activations follow Korthikanti et al. 2022 Sec. 4.1 (34 s b h bytes per layer, plus the
    5 a s^2 b of the unfused attention core that selective recompute removes).
    """
    b = _Block()
    b.tp.append(TPCollective("all_gather", hidden * A, "attention input"))
    b.norm("input_layernorm", hidden, tag="")
    b.linears.append(Linear("qkv_proj", hidden, 3 * hidden, "column", bias=True))
    b.saved.append(Saved("q_k", 2 * hidden * A))
    b.saved.append(Saved("v", hidden * A))
    b.attention.append(AttentionCore("attention", heads, heads, hidden // heads, hidden // heads, dropout=True))
    b.saved.append(Saved("attention_output", hidden * A))
    b.linears.append(Linear("o_proj", hidden, hidden, "row", bias=True))
    b.tp.append(TPCollective("reduce_scatter", hidden * A, "attention output"))
    b.saved.append(Saved("attention.dropout_mask", hidden))
    b.pointwise.append(Pointwise("bias_dropout_add", (4 * hidden + hidden) * A, 1))
    _dense_mlp(
        b, hidden=hidden, ffn=4 * hidden, gated=False, bias=True, dropout=True, norm_name="post_attention_layernorm"
    )
    spec_layer = b.build("dense", hidden)
    # Korthikanti counts LN outputs as the GEMM inputs: keep LN-output saves but they are tagged "" here.
    spec_layer = LayerSpec(
        spec_layer.kind,
        spec_layer.linears,
        spec_layer.attention,
        None,
        spec_layer.pointwise,
        tuple(
            Saved(
                s.name, s.bytes_per_token, "" if s.tag == "layernorm" else s.tag, s.tp_sharded, gemm_input=s.gemm_input
            )
            for s in spec_layer.saved
        ),
        spec_layer.tp_collectives,
        spec_layer.norm_params + 2 * hidden,
        0,
        spec_layer.input_bytes_per_token,
    )
    return _with_host_ops(
        ModelSpec(
            name,
            "gpt",
            hidden,
            vocab,
            tuple(spec_layer for _ in range(layers)),
            tie_embeddings=True,
            position_embedding_params=seq * hidden,
            final_norm_params=2 * hidden,
            source=source,
        )
    )


# ---------------------------------------------------------------------------------------------
# Host ops: each layer structure was captured once (bench/cost_model/count_host_ops.py). Families
# map onto the captured structure they share; structures trex cannot capture take the nearest one.

_HOST_FAMILY = {
    "gpt": "gpt",
    "llama": "llama",
    "qwen": "llama",
    "pangu": "llama",
    "mixtral": "mixtral",
    "qwen-moe": "qwen3-moe",
    "deepseek-v3": "deepseek-v3",
    "deepseek-v4": "deepseek-v4",
}


def host_structure(family: str, kind: str) -> str:
    """The captured structure (a key of data/host_ops.toml) whose op count a layer of `family` and `kind` uses."""
    base = _HOST_FAMILY.get(family, "llama")  # other Llama-like configs
    if base == "deepseek-v4":
        if kind == "mtp":
            return "deepseek-v4.csa+moe"  # the MTP block wraps a learned-MoE layer; csa is the larger count
        attention, _, mlp = kind.partition("+")
        attention = (
            "hca" if attention == "swa" else attention
        )  # no captured SWA-only layer: HCA adds only the compressor
        return f"deepseek-v4.{attention}+{'hash_moe' if attention == 'hca' and mlp == 'hash_moe' else 'moe'}"
    if base == "deepseek-v3":
        return (
            "deepseek-v3.dense" if kind == "dense" else "deepseek-v3.moe"
        )  # MTP: its MoE layer (eh_proj, norms: a few ops more)
    if kind == "dense":
        return "gpt.dense" if base == "gpt" else "llama.dense"
    return f"{base}.moe" if base in ("mixtral", "qwen3-moe") else "qwen3-moe.moe"


def _with_host_ops(spec: ModelSpec) -> ModelSpec:
    def attach(layers: tuple[LayerSpec, ...]) -> tuple[LayerSpec, ...]:
        counts = {kind: host_ops_for(host_structure(spec.family, kind)) for kind in {layer.kind for layer in layers}}
        return tuple(
            replace(layer, host_ops=counts[layer.kind]) if layer.host_ops is None else layer for layer in layers
        )

    return replace(spec, layers=attach(spec.layers), mtp_layers=attach(spec.mtp_layers))


# ---------------------------------------------------------------------------------------------
# Named models


_FAMILY_BY_TYPE = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen",
    "qwen3": "qwen",
    "mixtral": "mixtral",
    "qwen2_moe": "qwen-moe",
    "qwen3_moe": "qwen-moe",
    "deepseek_v2": "deepseek-v3",
    "deepseek_v3": "deepseek-v3",
    "deepseek_v4": "deepseek-v4",
    "gpt_oss": "gpt-oss",
    "pangu": "pangu",
}


def spec_from_config(config: Any, name: str | None = None, *, source: str | None = None) -> ModelSpec:
    """A ModelSpec from a transformers config (object or dict with `model_type`); `source` names where
    the numbers come from, when the caller knows better than the config."""
    spec = _spec_from_config(config, name)
    return replace(spec, source=source) if source else spec


def _spec_from_config(config: Any, name: str | None) -> ModelSpec:
    model_type = _cfg(config, "model_type", default="", required=False)
    name = name or str(_cfg(config, "_name_or_path", default="", required=False) or model_type or "model")
    if model_type == "gpt":  # Megatron GPT (no transformers class: the cost model's own config dict)
        return gpt_spec(
            name,
            layers=_cfg(config, "num_hidden_layers"),
            hidden=_cfg(config, "hidden_size"),
            heads=_cfg(config, "num_attention_heads"),
            vocab=_cfg(config, "vocab_size", default=51200),
            seq=_cfg(config, "max_position_embeddings", default=2048),
        )
    if model_type in ("deepseek_v2", "deepseek_v3"):
        return deepseek_v3_spec(config, name)
    if model_type == "deepseek_v4":
        return deepseek_v4_spec(config, name)
    if model_type in _FAMILY_BY_TYPE:
        sandwich = bool(
            _cfg(config, "sandwich_norm", default=False, required=False)
        )  # Pangu Ultra's depth-scaled sandwich norm
        return llama_like_spec(config, name, family=_FAMILY_BY_TYPE[model_type], sandwich_norm=sandwich)
    if all(
        _cfg(config, f, required=False)
        for f in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size")
    ):
        assumed = (
            f"model_type {model_type!r} is not a family trex knows ({', '.join(sorted(_FAMILY_BY_TYPE))}); it is priced as a "
            "Llama-like decoder (causal grouped-query attention, gated MLP, RMSNorm): check that this is its structure"
        )
        return replace(llama_like_spec(config, name, family=model_type or "llama"), assumptions=(assumed,))
    raise TrexError(
        f"the cost model cannot describe model_type {model_type!r}: supported families are "
        f"{', '.join(sorted(_FAMILY_BY_TYPE))} (and Llama-like configs with hidden_size, num_attention_heads, "
        "num_hidden_layers, vocab_size, intermediate_size)"
    )


def model_names() -> list[str]:
    """Every built-in model name (the one catalog, `trex.models`)."""
    from trex.models import model_names as catalog_names

    return catalog_names()


def get_model_spec(name_or_path: str | Path) -> ModelSpec:
    """A `trex.models` name (full-size, tiny, or priced-only), or a path to a transformers config.json."""
    key = str(name_or_path)
    from trex.cost_model.config_cache import stored_config
    from trex.models import MODELS, load_config
    from trex.models import model_names as catalog_names

    entry = MODELS.get(key)
    if entry is not None and entry.config is not None:  # described by its config dict alone (no transformers class)
        return spec_from_config(dict(entry.config), key, source=entry.source)
    stored = stored_config(
        key
    )  # full-size configurations without importing transformers (trex.cost_model.config_cache)
    if stored is not None:
        return spec_from_config(stored, key)
    if key in catalog_names():  # the tiny test configurations (and full-size ones missing from the store)
        return spec_from_config(load_config(key), key)
    path = Path(key)
    if path.suffix == ".json" or path.is_dir() or path.exists():
        from trex.models import PRICED_ONLY_TYPES, read_config_dict

        label = path.stem if path.suffix else path.name
        data = read_config_dict(path)
        if data["model_type"] in PRICED_ONLY_TYPES:  # no transformers class: the dict is the whole description
            return spec_from_config(data, label)
        return spec_from_config(load_config(path), label)
    raise UnknownNameError("model", key, model_names(), hint="or pass a path to a transformers config.json")

"""Tensor parallelism with sequence parallelism for DeepSeek-V3 (MLA) and DeepSeek-V4 (CSA/HCA) attention.

DTensor's column/row styles assume a projection straight from the residual stream to heads. MLA and
V4 attention first project to small latents (q_a, kv_a, V4's single shared KV head, the compressors
and the lightning indexer) whose outputs every head reads, so the split follows the heads instead
(DeepSeek-V2 paper, section 2.1; Megatron-Core's MLA layout):

  replicated   the low-rank down-projections and their norms, V4's KV head, compressor and indexer:
               computed on every tp rank from the all-gathered sequence (small: rank << hidden)
  by heads     q_b_proj / kv_b_proj rows (V3), q_b_proj rows, sinks and the output groups of
               o_a_proj (V4): this rank's H/tp heads
  row-wise     o_proj (V3) / o_b_proj (V4) columns: a partial sum over heads, reduce-scattered

Between blocks the residual stream is sequence-sharded (Korthikanti et al. 2022): the first decoder
layer takes this rank's slice of the sequence, norms, V4's hyper-connections, routers and routed experts
run on the slice, and attention, the dense MLP and the shared experts all-gather the sequence on entry
and reduce-scatter it on exit. Those two collectives are torch's *functional* collectives
(`_c10d_functional.all_gather_into_tensor` / `reduce_scatter_tensor`, autograd included: the backward
of one is the other), so they are ordinary nodes when the rank's model is captured. The LM head is
vocabulary-parallel on DTensor (the loss on vocabulary shards) as in `tensor_parallel`.

Gradient bookkeeping: a parameter sharded here receives its whole shard's gradient; every replicated
parameter receives this rank's part only (its tokens, or its heads' use of a shared latent), so
`runtime.parallelize` sums those over tp as well as dp. The embedding is vocabulary-parallel
(`runtime.vocab_parallel`): each rank holds 1/tp of its rows, and the lookup's partial sums are
reduce-scattered and all-gathered back into the whole sequence (the model builds its masks and rotary
tables from the full shape before the first layer takes this rank's slice); its gradient is whole for
this rank's rows.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

from trex.errors import TrexError
from trex.runtime.tensor_parallel import check_untied
from trex.runtime.vocab_parallel import VocabParallelEmbedding

# transformers model_type -> the attention layout this module shards
FAMILIES = ("deepseek_v3", "deepseek_v4")


def gather_sequence(hidden: Tensor, group: dist.ProcessGroup) -> Tensor:
    """[B, S/tp, ...] -> [B, S, ...] (backward: reduce-scatter of the partial gradients)."""
    return funcol.all_gather_single(hidden.contiguous(), 1, group)


def scatter_sequence(partial: Tensor, group: dist.ProcessGroup) -> Tensor:
    """[B, S, ...] partial over tp -> this rank's [B, S/tp, ...] of the sum (backward: all-gather)."""
    return funcol.reduce_scatter_single(partial.contiguous(), "sum", 1, group)


def sequence_slice(hidden: Tensor, rank: int, parts: int) -> Tensor:
    seq = hidden.size(1)
    if seq % parts:
        raise TrexError(
            f"sequence parallelism splits the sequence over tp={parts} ranks, but it has {seq} tokens; "
            f"use a --seq divisible by {parts}"
        )
    chunk = seq // parts
    return hidden[:, rank * chunk : (rank + 1) * chunk]


class _LocalConfig:
    """The model config as one rank's attention sees it (V4 reads `o_groups` from its config at run time)."""

    def __init__(self, base: Any, **local: Any):
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_local", local)

    def __getattr__(self, name: str) -> Any:
        local = object.__getattribute__(self, "_local")
        return local[name] if name in local else getattr(object.__getattribute__(self, "_base"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_base"), name, value)


def _keep(module: nn.Module, attr: str, dim: int, rank: int, parts: int, shards: dict, prefix: str) -> None:
    """Replace `module.attr` by this rank's contiguous 1/parts of dim `dim`; record it in `shards`."""
    full = getattr(module, attr)
    size = full.size(dim)
    if size % parts:
        raise TrexError(f"tp={parts} does not divide {prefix}{attr}'s {size} entries on dim {dim}")
    chunk = size // parts
    local = full.detach().narrow(dim, rank * chunk, chunk).clone()
    setattr(module, attr, nn.Parameter(local, requires_grad=full.requires_grad))
    shards[f"{prefix}{attr}"] = dim


def _linear(module: nn.Module, name: str, dim: int, rank: int, parts: int, shards: dict, prefix: str) -> None:
    linear = getattr(module, name)
    if linear.bias is not None:
        if dim == 1:
            raise TrexError(
                f"{prefix}{name} has a bias; a row-parallel projection with a bias is not supported by the "
                "tensor-parallel runtime (use tp=1)"
            )
        _keep(linear, "bias", 0, rank, parts, shards, f"{prefix}{name}.")
    _keep(linear, "weight", dim, rank, parts, shards, f"{prefix}{name}.")
    if dim == 0:
        linear.out_features //= parts
    else:
        linear.in_features //= parts


def _wrap_block(module: nn.Module, group: dist.ProcessGroup) -> None:
    """All-gather the sequence into `module` (first positional or `hidden_states` / `x` argument) and
    reduce-scatter its (first) output back to the sequence shard."""

    def before(_module, args, kwargs):
        if args:
            return (gather_sequence(args[0], group), *args[1:]), kwargs
        key = next(k for k in ("hidden_states", "x") if k in kwargs)
        return args, {**kwargs, key: gather_sequence(kwargs[key], group)}

    def after(_module, _args, _kwargs, output):
        if isinstance(output, tuple):
            return (scatter_sequence(output[0], group), *output[1:])
        return scatter_sequence(output, group)

    module.register_forward_pre_hook(before, with_kwargs=True)
    module.register_forward_hook(after, with_kwargs=True)


def _shard_mlp(mlp: nn.Module, group, rank: int, parts: int, shards: dict, prefix: str) -> None:
    for name in ("gate_proj", "up_proj"):
        _linear(mlp, name, 0, rank, parts, shards, prefix)
    _linear(mlp, "down_proj", 1, rank, parts, shards, prefix)
    if hasattr(mlp, "intermediate_size"):
        mlp.intermediate_size //= parts
    _wrap_block(mlp, group)


def _shard_v3_attention(attn: nn.Module, config: Any, rank: int, parts: int, shards: dict, prefix: str) -> None:
    _linear(attn, "q_b_proj" if attn.q_b_proj is not None else "q_proj", 0, rank, parts, shards, prefix)
    _linear(attn, "kv_b_proj", 0, rank, parts, shards, prefix)
    _linear(attn, "o_proj", 1, rank, parts, shards, prefix)
    attn.num_heads //= parts


def _shard_v4_attention(attn: nn.Module, config: Any, rank: int, parts: int, shards: dict, prefix: str) -> None:
    _linear(attn, "q_b_proj", 0, rank, parts, shards, prefix)
    _keep(attn, "sinks", 0, rank, parts, shards, prefix)
    _keep(attn.o_a_proj, "weight", 0, rank, parts, shards, f"{prefix}o_a_proj.")  # whole groups of heads
    attn.o_a_proj.out_features //= parts
    attn.o_a_proj.n_groups //= parts
    _linear(attn, "o_b_proj", 1, rank, parts, shards, prefix)
    attn.num_heads //= parts
    attn.num_key_value_groups = attn.num_heads  # the single KV head is broadcast to this rank's heads
    attn.config = _LocalConfig(attn.config, o_groups=config.o_groups // parts)


def check_divisible(config: Any, tp: int) -> list[str]:
    """What of `config` tp does not divide (heads, V4's output groups, MLP widths), with the numbers."""
    counts = [("attention heads", config.num_attention_heads)]
    if config.model_type == "deepseek_v4":  # every MLP (the shared experts) is DeepseekV4MLP(intermediate_size)
        counts += [("output-projection groups (o_groups)", config.o_groups), ("MLP width", config.intermediate_size)]
    else:
        if config.first_k_dense_replace:
            counts.append(("dense MLP width (intermediate_size)", config.intermediate_size))
        if config.n_shared_experts:
            counts.append(("shared-expert width", config.moe_intermediate_size * config.n_shared_experts))
    return [
        f"tp={tp} does not divide the {count} {what} of {config.model_type}" for what, count in counts if count % tp
    ]


def apply_head_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> dict[str, int]:
    """Shard a DeepSeek-V3/V4 causal LM over `tp_mesh` (see the module docstring).

    Returns {parameter name: the dim it is sharded on over tp} for the parameters split here (the LM
    head is a DTensor and not listed). `model` may be a pipeline stage's part (`keep_rank_part`): its
    layers, and the embedding / head only where it holds them; between stages the residual stream stays
    this rank's sequence shard (`runtime.pipeline.stages.ChunkModule`).
    """
    config = model.config
    if config.model_type not in FAMILIES:
        raise TrexError(f"head-parallel attention covers {', '.join(FAMILIES)}; got {config.model_type}")
    parts, rank, group = tp_mesh.size(), tp_mesh.get_local_rank(), tp_mesh.get_group()
    problems = check_divisible(config, parts)
    if problems:
        raise TrexError("; ".join(problems))
    check_untied(model)
    inner = model.model
    shards: dict[str, int] = {}
    shard_attention = _shard_v4_attention if config.model_type == "deepseek_v4" else _shard_v3_attention
    # named_children: a pipeline stage's part (`runtime.pipeline.stages.LayerSubset`) registers its layers under
    # their index in the whole model, so the names (and `tp_shards`) stay those of the unsharded model
    for index, layer in inner.layers.named_children():
        prefix = f"model.layers.{index}."
        shard_attention(layer.self_attn, config, rank, parts, shards, prefix + "self_attn.")
        _wrap_block(layer.self_attn, group)
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            if getattr(mlp, "shared_experts", None) is not None:
                _shard_mlp(mlp.shared_experts, group, rank, parts, shards, prefix + "mlp.shared_experts.")
        else:
            _shard_mlp(mlp, group, rank, parts, shards, prefix + "mlp.")
        layer.register_forward_pre_hook(_local_token_ids(rank, parts), with_kwargs=True)
    if inner.embed_tokens is not None:  # the whole model, or the stage that runs chunk 0 (it holds layer 0)
        inner.layers[0].register_forward_pre_hook(_enter_sequence_shard(rank, parts), with_kwargs=True)
        inner.embed_tokens = VocabParallelEmbedding(inner.embed_tokens, tp_mesh, "replicated")
        shards["model.embed_tokens.weight"] = 0
    if model.lm_head is not None:  # a later stage's part has no head (and the last stage no embedding)
        parallelize_module(
            model,
            tp_mesh,
            {"lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)},
        )
    return shards


def _enter_sequence_shard(rank: int, parts: int):
    def hook(_module, args, kwargs):
        if args:
            return (sequence_slice(args[0], rank, parts), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": sequence_slice(kwargs["hidden_states"], rank, parts)}

    return hook


def _local_token_ids(rank: int, parts: int):
    """V4's hash-routed MoE picks experts by token id: each layer gets the ids of this rank's tokens."""

    def hook(_module, args, kwargs):
        if kwargs.get("input_ids") is not None:
            return args, {**kwargs, "input_ids": sequence_slice(kwargs["input_ids"], rank, parts)}
        return None

    return hook

"""Tensor parallelism with sequence parallelism (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", 2022) applied with torch's DTensor styles.

Between blocks the residual stream is sequence-sharded (`Shard(1)`): norms run on their slice
(`SequenceParallel`), attention all-gathers the sequence, splits heads across ranks (column-parallel
q/k/v, row-parallel o with a reduce-scatter back to the sequence shard), and the embedding is
vocab-parallel (`runtime.vocab_parallel`: rows split over tp, masked lookup, reduce-scatter into the
sequence shard; its gradient exists for this rank's rows only). The head is column-parallel over the vocabulary
and the loss runs on vocabulary shards (`runtime.vocab_parallel.vocab_parallel_cross_entropy` in `runtime.rank_loss`,
functional collectives in the rank's graph; DTensor's `loss_parallel` in the pipeline trainer and for the users of
`trex.compile(model, plan=...)`), so full logits never exist on one rank.
MoE blocks take their sequence slice as plain tensors: router and experts see only this rank's
tokens (their gradients are summed over the tp ranks as well as dp, see `runtime.parallelize`);
dense MLP blocks are column/row parallel like attention.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from trex.errors import TrexError


def _attention_plan() -> dict:
    return {
        "self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)}, desired_input_kwarg_layouts={"hidden_states": Replicate()}
        ),
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }


def _mlp_plan(mlp: nn.Module) -> dict:
    if hasattr(mlp, "experts"):  # MoE block: local tokens in, sequence shard out
        return {"mlp": _MoEBlockStyle()}
    return {
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }


class _MoEBlockStyle(PrepareModuleInput):
    """The MoE block runs on this rank's sequence slice as plain tensors and hands back a `Shard(1)` DTensor."""

    def __init__(self):
        super().__init__(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=True)
        self.output_style = PrepareModuleOutput(
            output_layouts=(Shard(1),), desired_output_layouts=(Shard(1),), use_local_output=False
        )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        super()._apply(module, device_mesh)
        return self.output_style._apply(module, device_mesh)


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> dict[str, int]:
    """Shard a Qwen3-MoE-style causal LM (model.model.{embed_tokens, layers, norm}, model.lm_head) over `tp_mesh`.
    A pipeline stage's part (`runtime.pipeline.stages.keep_rank_part`) has None for the embedding, the final
    norm and the head it does not run: those are skipped.

    Returns {parameter name: the dim it is split on over tp} for the plain (non-DTensor) parameters split
    here: the vocabulary-parallel embedding's rows."""
    from trex.runtime.vocab_parallel import VocabParallelEmbedding

    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        raise TrexError(
            f"tensor parallelism expects a causal LM with .model.layers and .lm_head; {type(model).__name__} "
            "has another layout"
        )
    tp = tp_mesh.size()
    config = model.config
    for what, count in (
        ("attention heads", config.num_attention_heads),
        ("key/value heads", getattr(config, "num_key_value_heads", config.num_attention_heads)),
    ):
        if count % tp:
            raise TrexError(f"tp={tp} does not divide the {count} {what} of {config.model_type}")
    check_untied(model)
    top = {"norm": SequenceParallel()} if inner.norm is not None else {}
    if hasattr(
        inner, "rotary_emb"
    ):  # reads only dtype/device from the sequence-sharded stream: give it the local shard
        top["rotary_emb"] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=True
        )
    parallelize_module(inner, tp_mesh, top)
    if model.lm_head is not None:
        parallelize_module(
            model,
            tp_mesh,
            {"lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)},
        )
    for layer in inner.layers:
        plan = {
            "input_layernorm": SequenceParallel(),
            "post_attention_layernorm": SequenceParallel(),
            **_attention_plan(),
            **_mlp_plan(layer.mlp),
        }
        parallelize_module(layer, tp_mesh, plan)
    if inner.embed_tokens is None:
        return {}
    inner.embed_tokens = VocabParallelEmbedding(inner.embed_tokens, tp_mesh, "dtensor_shard")
    return {"model.embed_tokens.weight": 0}


def check_untied(model: nn.Module) -> None:
    """The embedding and the LM head are split differently (rows of the vocabulary for the lookup, columns of
    the logits for the head): a model that ties them cannot be split this way."""
    head, embedding = getattr(model, "lm_head", None), model.get_input_embeddings()
    if head is not None and embedding is not None and head.weight is embedding.weight:
        raise TrexError(
            f"{model.config.model_type} ties its embedding and LM head (tie_word_embeddings); tensor parallelism "
            "splits them differently: run it with tp=1"
        )

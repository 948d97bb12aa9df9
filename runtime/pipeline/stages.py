"""Cut a transformers causal LM into the pipeline chunks of a `StageSplit`, keeping parameter names.

`keep_rank_part(model, split, rank)` strips the model down to what pipeline rank `rank` runs: its
decoder layers (registered under their index in the whole model), the embedding when it runs chunk 0,
the final norm and head when it runs the last chunk. Every parameter keeps its fully qualified name of
the unsharded model (`model.layers.3.mlp.experts.gate_up_proj`), so data parallelism, expert
parallelism, checkpoints (DCP reshards by name) and gradient checks work on the part as on a model.

`ChunkModule` is one chunk as a module `torch.distributed.pipelining.PipelineStage` runs: token ids
(chunk 0) or the previous chunk's hidden states in, hidden states or logits (last chunk) out. It
re-derives what the family's `Model.forward` computes once for all layers - positions, the causal
mask, rotary embeddings - from the activation's shape, so each chunk is a self-contained graph that
`trex.compile` captures on its own (passes and dumps per chunk).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trex.errors import TrexError
from trex.runtime.pipeline.split import Chunk, StageSplit, check_first_chunk_layers
from trex.runtime.tensor_parallel_heads import FAMILIES as HEAD_PARALLEL_FAMILIES

PIPELINE_FAMILIES = ("qwen3_moe", "deepseek_v3", "deepseek_v4")


class LayerSubset(nn.Module):
    """The decoder layers one rank keeps, registered under their index in the whole model (so their
    parameters keep their names), iterated like the `nn.ModuleList` they replace."""

    def __init__(self, layers: dict[int, nn.Module]):
        super().__init__()
        for index, layer in sorted(layers.items()):
            self.add_module(str(index), layer)

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, index: int) -> nn.Module:
        return self._modules[str(index)]


def check_pipeline_model(config: Any, split: StageSplit) -> None:
    """Refuse (with the numbers and the fix) a model the pipeline cannot cut as `split` says."""
    model_type = getattr(config, "model_type", "")
    if model_type not in PIPELINE_FAMILIES:
        raise TrexError(
            f"pipeline parallelism cuts {', '.join(PIPELINE_FAMILIES)} models; {model_type or 'this model'} is not "
            "one of them - run it with pp=1"
        )
    if getattr(config, "tie_word_embeddings", False):
        raise TrexError(
            "pipeline parallelism puts the embedding on the first stage and the output head on the last; this model "
            "ties them (tie_word_embeddings=true) - run it with pp=1"
        )
    hash_layers = [i for i, kind in enumerate(getattr(config, "mlp_layer_types", None) or []) if kind == "hash_moe"]
    if hash_layers:
        check_first_chunk_layers(split, hash_layers, "hash-routed MoE layers")


def keep_rank_part(model: nn.Module, split: StageSplit, rank: int) -> nn.Module:
    """Strip `model` (in place) to the modules pipeline rank `rank` runs; returns it."""
    chunks = split.chunks_of(rank)
    inner = model.model
    kept = {i: inner.layers[i] for c in chunks for i in c.layers}
    inner.layers = LayerSubset(kept)
    if not any(c.first for c in chunks):
        inner.embed_tokens = None
    if not any(c.last for c in chunks):
        inner.norm = None
        model.lm_head = None
        if hasattr(inner, "hc_head"):
            inner.hc_head = None
    return model


class ChunkModule(nn.Module):
    """One pipeline chunk of a causal LM (see the module docstring); shares the rank part's modules."""

    def __init__(self, part: nn.Module, chunk: Chunk):
        super().__init__()
        self.chunk = chunk
        self.config = part.config
        inner = part.model
        self.family = self.config.model_type
        self.embed_tokens = inner.embed_tokens if chunk.first else None
        self.layers = nn.ModuleList([inner.layers[i] for i in chunk.layers])
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm if chunk.last else None
        self.hc_head = getattr(inner, "hc_head", None) if chunk.last else None
        self.lm_head = part.lm_head if chunk.last else None
        self.tp_mesh = None  # set under tensor parallelism (`sequence_parallel_on`)

    def sequence_parallel_on(self, tp_mesh) -> None:
        """Tensor parallelism with sequence parallelism inside the chunk. Qwen3-MoE (`runtime.tensor_parallel`):
        the residual stream is a sequence-sharded DTensor between layers; the engine sends plain tensors, so a
        chunk hands on its rank's sequence shard (`to_local`) and the next chunk wraps it back (`from_local`,
        Shard(1)). DeepSeek-V3/V4 (`runtime.tensor_parallel_heads`): the stream is already a plain tensor
        holding this rank's sequence shard (chunk 0's first layer slices it after the whole-sequence embedding),
        so it crosses the boundary as it is; a later chunk builds its mask and rotary tables for the whole
        sequence (tp x its shard), since attention all-gathers the sequence. The last chunk's logits leave
        as the rank's vocabulary shard (`PipelineTrainer` wraps them for the vocabulary-parallel loss)."""
        self.tp_mesh = tp_mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_ids = None
        if self.chunk.first:
            input_ids = x
            embeds = self.embed_tokens(x)
            hidden = embeds
            if self.family == "deepseek_v4":  # V4 carries hc_mult residual streams from the embedding on
                hidden = embeds.unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1).contiguous()
        else:
            hidden = x
            if self.tp_mesh is not None and self.family not in HEAD_PARALLEL_FAMILIES:
                from torch.distributed.tensor import DTensor, Shard

                hidden = DTensor.from_local(x, self.tp_mesh, [Shard(1)], run_check=False)
            embeds = hidden[:, :, 0] if self.family == "deepseek_v4" else hidden  # shape, dtype, device only
            if self.tp_mesh is not None and self.family in HEAD_PARALLEL_FAMILIES:  # x: this rank's shard
                batch, tokens, width = embeds.shape
                embeds = embeds.new_empty((batch, tokens * self.tp_mesh.size(), width))
        context = self._layer_context(embeds)
        if self.family == "deepseek_v4":
            context["input_ids"] = input_ids  # hash-routed layers only sit in chunk 0 (split check)
        for layer in self.layers:
            hidden = layer(hidden, **context)
        if not self.chunk.last:
            return _local(hidden)
        if self.hc_head is not None:
            hidden = self.hc_head(hidden)
        return _local(self.lm_head(self.norm(hidden)))

    def _layer_context(self, embeds: torch.Tensor) -> dict[str, Any]:
        """Positions, causal mask and rotary embeddings as the family's `Model.forward` builds them
        (no cache: training)."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        positions = torch.arange(embeds.shape[1], device=embeds.device).unsqueeze(0)
        sliding = self.family == "deepseek_v4" or (
            self.family == "qwen3_moe" and getattr(self.config, "sliding_window", None) is not None
        )
        make_mask = create_sliding_window_causal_mask if sliding else create_causal_mask
        mask = make_mask(
            config=self.config, inputs_embeds=embeds, attention_mask=None, cache=None, position_ids=positions
        )
        if self.family == "deepseek_v4":
            rotary = {
                kind: self.rotary_emb(embeds, position_ids=positions, layer_type=kind) for kind in ("main", "compress")
            }
        else:
            rotary = self.rotary_emb(embeds, position_ids=positions)
        return {"attention_mask": mask, "position_ids": positions, "position_embeddings": rotary}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what the engine sends on), a plain tensor as it is - never a view: the split
    backward's input pass (ZB-V, DualPipeV) detaches a stage's outputs in place (`stage_backward_input`), which
    autograd refuses for a view, and a DTensor's `to_local()` is one (tp inside the stage). A view is copied.
    Inside a captured graph (`--compile`) the check is left out: Dynamo cannot trace `_is_view` (a bool), and
    the compiled chunk's outputs are the graph's own (the V schedules refuse --compile anyway)."""
    to_local = getattr(tensor, "to_local", None)
    out = to_local() if to_local is not None else tensor
    if torch.compiler.is_compiling():
        return out
    return out.clone() if out._is_view() else out


def build_chunks(part: nn.Module, split: StageSplit, rank: int) -> list[ChunkModule]:
    """The chunk modules of pipeline rank `rank`, in model order, over its rank part."""
    return [ChunkModule(part, chunk) for chunk in split.chunks_of(rank)]

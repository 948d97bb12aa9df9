"""Vocabulary-parallel embedding: each tensor-parallel rank holds 1/tp of the table's rows.

Megatron's `VocabParallelEmbedding` (Shoeybi et al., "Megatron-LM", 2019, section 3): rank r keeps rows
[r*V/tp, (r+1)*V/tp). A lookup of ids outside that range reads row 0 and is zeroed (masked), so every
rank's output is its part of the sum; the sum over the tp group is the whole embedding. With sequence
parallelism the sum is a reduce-scatter over the sequence (each rank keeps its tokens), whose backward
all-gathers the gradient: every rank sees the gradient of every token and, through the mask, keeps
the rows it owns. The weight's gradient is therefore whole for this rank's rows (summed over data
parallelism only), and never exists at full vocabulary size on a rank.

The collectives are torch's functional collectives (`reduce_scatter_single` / `all_gather_single`,
autograd included), so a captured rank graph shows them as nodes.

Two outputs, for the two tensor-parallel layouts of `runtime`:
  "dtensor_shard"  a DTensor sharded on the sequence (dim 1) of the tp mesh: the residual stream of
                   `runtime.tensor_parallel` (DTensor styles). Its global shape is the whole sequence,
                   which is what transformers reads for positions and the attention mask.
  "replicated"     the whole sequence on every rank (reduce-scatter, then all-gather):
                   `runtime.tensor_parallel_heads` slices the sequence at the first decoder layer,
                   after the model has built its positions and masks from the full shape.
"""

from __future__ import annotations

from typing import Literal

import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

from trex.errors import TrexError

Output = Literal["dtensor_shard", "replicated"]


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of `embedding` (an `nn.Embedding`), looked up with a mask and summed over `tp_mesh`."""

    def __init__(self, embedding: nn.Embedding, tp_mesh: DeviceMesh, output: Output):
        super().__init__()
        vocab, width = embedding.weight.shape
        parts, rank = tp_mesh.size(), tp_mesh.get_local_rank()
        if vocab % parts:
            raise TrexError(
                f"tp={parts} does not divide the vocabulary of {vocab} rows (the embedding is split by rows); "
                f"use a tp that divides {vocab}"
            )
        rows = vocab // parts
        self.start, self.end = rank * rows, (rank + 1) * rows
        self.num_embeddings, self.embedding_dim = vocab, width  # what transformers reads off an embedding
        self.weight = nn.Parameter(embedding.weight.detach()[self.start : self.end].clone())
        pad = embedding.padding_idx
        # transformers builds nn.Embedding(vocab, hidden, pad_token_id): the padding row gets no gradient
        self.local_padding_idx = pad - self.start if pad is not None and self.start <= pad < self.end else None
        self.mesh, self.group, self.parts, self.output = tp_mesh, tp_mesh.get_group(), parts, output

    def forward(self, ids: Tensor) -> Tensor:
        outside = (ids < self.start) | (ids >= self.end)
        local_ids = (ids - self.start).masked_fill(outside, 0)
        partial = F.embedding(local_ids, self.weight, self.local_padding_idx)
        partial = partial.masked_fill(outside.unsqueeze(-1), 0.0)
        if partial.size(1) % self.parts:
            raise TrexError(
                f"sequence parallelism splits the sequence over tp={self.parts} ranks, but it has "
                f"{partial.size(1)} tokens; use a --seq divisible by {self.parts}"
            )
        shard = funcol.reduce_scatter_single(partial.contiguous(), "sum", 1, self.group)
        if self.output == "replicated":
            return funcol.all_gather_single(shard.contiguous(), 1, self.group)
        from torch.distributed.tensor import DTensor, Shard

        return DTensor.from_local(shard, self.mesh, [Shard(1)], run_check=False)

    def extra_repr(self) -> str:
        return f"rows [{self.start}, {self.end}) of {self.num_embeddings}, dim {self.embedding_dim}, {self.output}"

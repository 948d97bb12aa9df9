"""Vocabulary-parallel embedding and cross-entropy: each tensor-parallel rank holds 1/tp of the vocabulary.

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

The loss on the column-parallel head's logits (`vocab_parallel_cross_entropy`, Megatron's vocabulary-parallel
cross-entropy: Shoeybi et al. 2019, section 3) is written with the same functional collectives instead of
DTensor's `loss_parallel` context, so that it is traced into the rank's captured forward with the model
(`runtime.rank_loss`): its two all-reduces (the row maxima, then the sums of exponentials with the target
logits) are nodes the dumps show and the cost model prices, and its backward is part of the backward graph.
"""

from __future__ import annotations

from typing import Literal

import torch
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


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Token-sum cross-entropy of logits split by vocabulary over a tp group, every rank getting the whole sum.

    forward: the row maxima all-reduced (max) for a stable softmax, then one all-reduce (sum) of two rows per
    token: the sum of exponentials of this rank's shard and the target's logit if this rank holds the target (0
    otherwise); the loss of a token is log(sum) - target logit. backward: d loss / d logits = softmax - one-hot,
    which this rank computes for its shard from the softmax it saved (its vocabulary only) with no collective:
    every tp rank computes the same replicated loss, so each one's gradient is that of the one loss (Megatron's
    reduce-in-forward, identity-in-backward). Targets equal to `ignore_index` score nothing and get no gradient.

    Saved for the backward: the softmax of this rank's shard (float32, tokens x vocabulary/tp) and the targets,
    which is what `runtime.activation_model` prices for the loss under tp."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, start: int, group: str, ignore_index: int) -> Tensor:
        with torch.no_grad():
            row_max = funcol.wait_tensor(funcol.all_reduce(logits.max(-1).values, "max", group))
        shifted = logits - row_max.unsqueeze(-1)
        inside, local = _local_targets(targets, start, logits.size(-1))
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
        exp = shifted.exp()
        summed = funcol.wait_tensor(funcol.all_reduce(torch.stack([exp.sum(-1), target_logit]), "sum", group))
        scored = targets != ignore_index
        loss = ((summed[0].log() - summed[1]) * scored).sum()
        ctx.save_for_backward(exp.div_(summed[0].unsqueeze(-1)), targets)
        ctx.start, ctx.ignore_index = start, ignore_index
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        softmax, targets = ctx.saved_tensors
        inside, local = _local_targets(targets, ctx.start, softmax.size(-1))
        grad = softmax.scatter_add(-1, local.unsqueeze(-1), -inside.to(softmax.dtype).unsqueeze(-1))
        grad = grad * ((targets != ctx.ignore_index).to(softmax.dtype) * grad_loss).unsqueeze(-1)
        return grad, None, None, None, None


def _local_targets(targets: Tensor, start: int, width: int) -> tuple[Tensor, Tensor]:
    """Which targets fall in this rank's columns [start, start + width), and their column there (0 if not)."""
    inside = (targets >= start) & (targets < start + width)
    return inside, (targets - start).masked_fill(~inside, 0)


def vocab_parallel_cross_entropy(
    logits: Tensor, targets: Tensor, start: int, group: str, ignore_index: int = -100
) -> Tensor:
    """Sum over tokens of the cross-entropy of `logits` ([tokens, vocabulary/tp], this rank's columns, which
    begin at vocabulary index `start`) against `targets` ([tokens], whole-vocabulary ids), over the tp group
    named `group`; see `VocabParallelCrossEntropy`."""
    return VocabParallelCrossEntropy.apply(logits, targets, start, group, ignore_index)

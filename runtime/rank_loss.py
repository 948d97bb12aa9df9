"""The program one rank runs per micro-batch: the model's forward, the loss, and the gradient reductions.

`trex train --compile` captures this module, not the bare model, so that every collective of a step that is not
an optimizer's is a node of the rank's graph (the dumps show it, the cost model prices it, `reorder_comm` may move
it):
  - the loss: under tp the head's logits are split by vocabulary, and the cross-entropy on them is
    `runtime.vocab_parallel.vocab_parallel_cross_entropy` (two functional all-reduces in the forward, its
    gradient in the backward) instead of DTensor's `loss_parallel`, which ran after the captured forward;
  - the gradient reductions of ZeRO-0/1/2 and of expert-data parallelism: the parameters are read through
    `runtime.data_parallel.ReducedGradient` (`GradientReduction`s, made by `AppliedPlan.gradient_reductions`
    before the call, applied here), whose backward all-reduces or reduce-scatters each gradient with a functional
    collective, so the captured backward graph holds them.
An eager rank runs the same module, so both modes issue the same collectives in the same program order.

FSDP2 (zero=3) is the exception: it gathers and reduce-scatters in its own module hooks, outside any graph
(`AppliedPlan.gradient_reductions` is {} for it); `--zero3 graph` is the in-graph ZeRO-3.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from trex.runtime.data_parallel import GradientReduction, through_reductions
from trex.runtime.parallelize import VocabShard
from trex.runtime.vocab_parallel import vocab_parallel_cross_entropy


class RankLoss(nn.Module):
    """`model` (a causal LM after `runtime.parallelize`) and its next-token loss: the sum over scored targets.

    vocab: this rank's columns of the vocabulary under tp (`AppliedPlan.vocab_shard`), None without tp.
    bf16: the model's forward runs under `torch.autocast` in bf16 (the loss is computed in float32).
    ignore_index: the target that scores nothing (the trainer's `IGNORE_INDEX`; passed in, so that this module
    does not import the trainer that builds it)."""

    def __init__(self, model: nn.Module, vocab: VocabShard | None, *, bf16: bool, device_type: str, ignore_index: int):
        super().__init__()
        self.model, self.vocab, self.bf16, self.device_type = model, vocab, bf16, device_type
        self.ignore_index = ignore_index

    @property
    def config(self):
        """The model's config: `trex.compile` reads it (the experts implementation) off the module it captures."""
        return self.model.config

    def forward(
        self,
        input_ids: Tensor,
        targets: Tensor,
        position_ids: Tensor | None = None,
        reductions: dict[str, GradientReduction] | None = None,
    ) -> Tensor:
        inputs = {"input_ids": input_ids, "use_cache": False}
        if position_ids is not None:
            inputs["position_ids"] = position_ids
        autocast = torch.autocast(self.device_type, dtype=torch.bfloat16) if self.bf16 else nullcontext()
        with autocast:
            if reductions:
                parameters = through_reductions(reductions)
                logits = torch.func.functional_call(self.model, parameters, (), inputs, strict=False).logits
            else:
                logits = self.model(**inputs).logits
        if self.vocab is None:
            return F.cross_entropy(
                logits.float().flatten(0, 1), targets.flatten(), reduction="sum", ignore_index=self.ignore_index
            )
        local = logits.to_local() if isinstance(logits, DTensor) else logits
        return vocab_parallel_cross_entropy(
            local.float().flatten(0, 1), targets.flatten(), self.vocab.start, self.vocab.group, self.ignore_index
        )

"""Rows of training tokens from encoded samples: packed several to a row, or one per row.

A row holds `seq + 1` tokens: the model reads the first `seq` and is scored on the next token at
each position. Packing places whole samples one after another in the row (a sample never spans two
rows; the tail of a row that no further sample fits is padding). Document boundaries are kept by:

- position ids that restart at 0 with every document (transformers builds a block-causal mask from
  them when no attention mask is passed: a token attends only to its own document), and
- targets that never cross a boundary: the last token of a document is not asked to predict the
  first token of the next one; padding is never a target.

Whether a model honours the position-id boundaries is checked, not assumed (`isolates_documents`):
attention that also reads compressed or indexed summaries of the whole row (DeepSeek-V4's CSA/HCA)
sees the previous document through them, so for such a model trex trains one sample per row.

The order of samples is a permutation drawn from (seed, epoch): it does not depend on the plan, the
number of ranks or where a run was resumed, so step s always trains the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trex.workloads.or_train.samples import IGNORE, Encoded

PACKING = ("auto", "on", "off")


@dataclass(frozen=True)
class Row:
    ids: list[int]  # seq + 1 token ids
    labels: list[int]  # seq + 1; IGNORE where not trained
    documents: list[int]  # seq + 1; which document of the row each token is in (padding: -1)
    samples: int  # samples in the row


@dataclass(frozen=True)
class RowBatch:
    """A global batch, ready for the model: inputs/targets/position_ids [gbs, seq]."""

    inputs: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor


def build_rows(samples: list[Encoded], order: list[int], seq: int, pad_id: int, pack: bool) -> list[Row]:
    width = seq + 1
    rows: list[Row] = []
    ids: list[int] = []
    labels: list[int] = []
    documents: list[int] = []
    count = 0

    def close() -> None:
        nonlocal ids, labels, documents, count
        if count:
            pad = width - len(ids)
            rows.append(Row(ids + [pad_id] * pad, labels + [IGNORE] * pad, documents + [-1] * pad, count))
        ids, labels, documents, count = [], [], [], 0

    for index in order:
        sample = samples[index]
        if len(sample.ids) > width:
            raise ValueError(f"sample of line {sample.line} has {len(sample.ids)} tokens > {width}")
        if count and (not pack or len(ids) + len(sample.ids) > width):
            close()
        documents += [count] * len(sample.ids)
        ids += list(sample.ids)
        labels += list(sample.labels)
        count += 1
    close()
    return rows


def row_tensors(rows: list[Row]) -> RowBatch:
    ids = torch.tensor([r.ids for r in rows], dtype=torch.long)
    labels = torch.tensor([r.labels for r in rows], dtype=torch.long)
    documents = torch.tensor([r.documents for r in rows], dtype=torch.long)
    same = documents[:, 1:] == documents[:, :-1]
    targets = torch.where(same & (documents[:, 1:] >= 0), labels[:, 1:], torch.full_like(labels[:, 1:], IGNORE))
    return RowBatch(ids[:, :-1].contiguous(), targets.contiguous(), positions_of(documents[:, :-1]))


def positions_of(documents: torch.Tensor) -> torch.Tensor:
    """Position ids restarting at 0 at every change of document (padding counts as its own run)."""
    seq = documents.size(1)
    index = torch.arange(seq).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    start_index = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return (index - start_index).contiguous()


class PackedSource:
    """The deterministic stream of global batches over a dataset, epoch after epoch."""

    def __init__(self, samples: list[Encoded], *, seq: int, gbs: int, seed: int, pad_id: int, pack: bool):
        if not samples:
            raise ValueError("no samples")
        self.samples, self.seq, self.gbs, self.seed, self.pad_id, self.pack = samples, seq, gbs, seed, pad_id, pack
        self.rows: list[Row] = []
        self.epoch_ends: list[int] = []  # rows available after each epoch

    def _extend_to(self, count: int) -> None:
        while len(self.rows) < count:
            epoch = len(self.epoch_ends)
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(len(self.samples), generator=generator).tolist()
            self.rows += build_rows(self.samples, order, self.seq, self.pad_id, self.pack)
            self.epoch_ends.append(len(self.rows))

    def rows_of_step(self, step: int) -> list[Row]:
        self._extend_to((step + 1) * self.gbs)
        return self.rows[step * self.gbs : (step + 1) * self.gbs]

    def global_batch(self, step: int) -> RowBatch:
        return row_tensors(self.rows_of_step(step))

    def samples_before(self, step: int) -> int:
        """Samples (occurrences, epochs counted) in the rows of steps 0 .. step-1."""
        self._extend_to(step * self.gbs)
        return sum(row.samples for row in self.rows[: step * self.gbs])

    def epoch_of(self, step: int) -> float:
        self._extend_to((step + 1) * self.gbs)
        done = step * self.gbs
        finished = sum(1 for end in self.epoch_ends if end <= done)
        start = self.epoch_ends[finished - 1] if finished else 0
        span = self.epoch_ends[finished] - start if finished < len(self.epoch_ends) else 1
        return finished + (done - start) / span

    def rows_per_epoch(self) -> int:
        self._extend_to(1)
        return self.epoch_ends[0]


def isolates_documents(model: Any, vocab_size: int, seq: int, *, seed: int = 0) -> tuple[bool, float]:
    """Does `model` keep packed documents apart? Two documents in one row; the first one's tokens are
    changed; the second one's logits must not move. Returns (isolated, largest change)."""
    generator = torch.Generator().manual_seed(seed)
    first = seq // 2
    tokens = torch.randint(0, vocab_size, (1, seq), generator=generator)
    other = tokens.clone()
    other[0, :first] = torch.randint(0, vocab_size, (first,), generator=generator)
    documents = torch.tensor([[0] * first + [1] * (seq - first)])
    positions = positions_of(documents)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            a = model(input_ids=tokens, position_ids=positions, use_cache=False).logits[0, first:]
            b = model(input_ids=other, position_ids=positions, use_cache=False).logits[0, first:]
    finally:
        model.train(was_training)
    change = float((a - b).abs().max())
    scale = float(a.abs().max()) or 1.0
    return change <= 1e-5 * scale, change

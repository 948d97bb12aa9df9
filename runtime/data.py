"""Training data whose order depends on the seed only, never on the plan.

Every rank can produce the whole global batch of step s (`global_batch`); a rank keeps the rows of
its data-parallel replica (`replica_rows`) and cuts them into micro-batches. Because the global batch
is the same for every plan, so are the losses: that is how distributed execution is tested.

Sources:
  synthetic   uniform random tokens from a generator seeded by (seed, step)
  PATH.jsonl  one JSON object per line with "input_ids" (or "tokens"): a list of token ids. The lines
              are concatenated (in file order) into one stream, cut into windows of seq+1 tokens, and
              the windows are visited in a seed-determined order, epoch after epoch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from trex.errors import TrexError


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor  # [rows, seq] token ids
    targets: torch.Tensor  # [rows, seq] the next token of each input position (-100: not scored)
    position_ids: torch.Tensor | None = None  # [rows, seq] when documents are packed (restart at each one)

    def to(self, device: torch.device) -> Batch:
        moved = None if self.position_ids is None else self.position_ids.to(device)
        return Batch(self.inputs.to(device), self.targets.to(device), moved)

    def rows(self, start: int, end: int) -> Batch:
        positions = None if self.position_ids is None else self.position_ids[start:end].contiguous()
        return Batch(self.inputs[start:end].contiguous(), self.targets[start:end].contiguous(), positions)

    def replica_rows(self, replica: int, replicas: int) -> Batch:
        """The rows data-parallel replica `replica` trains on (contiguous blocks, as `replica_rows`)."""
        count = self.inputs.size(0) // replicas
        return self.rows(replica * count, (replica + 1) * count)


def as_global_batch(batch) -> Batch:
    """A source's global batch as a `Batch`: token rows [gbs, seq+1] (next-token training), or any object
    with inputs/targets (and optionally position_ids) of [gbs, seq] (labelled or packed data)."""
    if isinstance(batch, torch.Tensor):
        return Batch(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())
    return Batch(batch.inputs, batch.targets, getattr(batch, "position_ids", None))


class TokenSource:
    """A deterministic stream of global batches: `global_batch(step)` -> [gbs, seq+1] tokens."""

    def __init__(self, spec: str, *, vocab_size: int, seq: int, gbs: int, seed: int):
        self.spec, self.vocab_size, self.seq, self.gbs, self.seed = spec, vocab_size, seq, gbs, seed
        self.windows: torch.Tensor | None = None
        if spec != "synthetic":
            self.windows = _jsonl_windows(Path(spec), seq + 1, vocab_size)

    def global_batch(self, step: int) -> torch.Tensor:
        if self.windows is None:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            return torch.randint(0, self.vocab_size, (self.gbs, self.seq + 1), generator=generator)
        count = self.windows.size(0)
        order: list[int] = []
        first = step * self.gbs
        epoch = first // count
        while len(order) < first - epoch * count + self.gbs:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order += torch.randperm(count, generator=generator).tolist()
            epoch += 1
        start = first - (first // count) * count
        return self.windows[order[start : start + self.gbs]]


def replica_rows(tokens: torch.Tensor, replica: int, replicas: int) -> torch.Tensor:
    """The rows of the global batch that data-parallel replica `replica` trains on (contiguous blocks)."""
    rows = tokens.size(0) // replicas
    return tokens[replica * rows : (replica + 1) * rows]


def micro_batches(rows: torch.Tensor | Batch, mbs: int) -> list[Batch]:
    batch = as_global_batch(rows)
    return [batch.rows(i, i + mbs) for i in range(0, batch.inputs.size(0), mbs)]


def _jsonl_windows(path: Path, window: int, vocab_size: int) -> torch.Tensor:
    if not path.exists():
        raise TrexError(
            f"--data {path}: no such file; pass 'synthetic' or a .jsonl file with an \"input_ids\" list per line"
        )
    stream: list[int] = []
    with path.open() as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise TrexError(f"{path}:{number}: not valid JSON ({error.msg})") from None
            ids = record.get("input_ids", record.get("tokens")) if isinstance(record, dict) else None
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                raise TrexError(
                    f'{path}:{number}: each line needs "input_ids" (or "tokens"): a list of integer token ids'
                )
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise TrexError(f"{path}:{number}: token id {bad[0]} is outside the model's vocabulary of {vocab_size}")
            stream += ids
    count = len(stream) // window
    if count == 0:
        raise TrexError(
            f"{path}: {len(stream)} tokens do not fill one window of seq+1 = {window} tokens; add data or lower --seq"
        )
    return torch.tensor(stream[: count * window], dtype=torch.long).view(count, window)

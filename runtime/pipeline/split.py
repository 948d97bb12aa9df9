"""The stage split: which decoder layers sit in which pipeline chunk, and which rank runs each chunk.

The plan (`ParallelConfig.layers_per_chunk`, the planner's choice, or the cost model's default
`default_layers_per_chunk` when the plan leaves it open) cuts the layer stack into pp*vpp chunks in
model order. Chunk 0 also holds the embedding, the last chunk the final norm, the output head and the
loss. Two placements of chunks on the pp ranks exist:

* "loop" (Megatron's interleaving, Narayanan et al. 2021): rank r runs chunks r, r+pp, r+2pp, ...
  This is what the cost model prices and what GPipe, 1F1B and interleaved 1F1B run.
* "v" (the V shape of ZB-V, Qi et al. 2023, and DualPipeV, DeepSeek-AI 2024): with two chunks per
  rank, rank r runs chunks r and 2pp-1-r, so the first and the last chunk share rank 0.

Bad splits are refused with their numbers: a split that leaves a layer out or places one twice, a
vpp that does not divide the layers (default split), more chunks than layers, DeepSeek-V4's hash-routed
MoE layers (they route by token id, which only the first chunk sees) outside the first chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from trex.errors import TrexError

PLACEMENTS = ("loop", "v")


class StageSplitError(TrexError):
    """A stage split that cannot cut this model; the message has the numbers and the fix."""


@dataclass(frozen=True)
class Chunk:
    """One pipeline chunk (a virtual stage): a contiguous run of decoder layers on one pipeline rank."""

    index: int  # position in model order, 0 .. pp*vpp-1 (torch.distributed.pipelining's stage index)
    rank: int  # the pipeline rank (stage) that runs it
    start: int  # first decoder layer
    end: int  # one past the last decoder layer
    first: bool  # holds the embedding
    last: bool  # holds the final norm, the output head and the loss

    @property
    def layers(self) -> range:
        return range(self.start, self.end)


@dataclass(frozen=True)
class StageSplit:
    pp: int
    vpp: int
    placement: str  # "loop" or "v"
    chunks: tuple[Chunk, ...]

    @property
    def layers_per_chunk(self) -> tuple[int, ...]:
        return tuple(c.end - c.start for c in self.chunks)

    def chunks_of(self, rank: int) -> list[Chunk]:
        """The chunks pipeline rank `rank` runs, in model order."""
        return [c for c in self.chunks if c.rank == rank]

    def describe(self) -> str:
        parts = []
        for rank in range(self.pp):
            spans = [f"layers {c.start}-{c.end - 1}" if c.end > c.start else "no layers" for c in self.chunks_of(rank)]
            ends = [("+embedding" if c.first else "") + ("+head" if c.last else "") for c in self.chunks_of(rank)]
            parts.append(f"stage {rank}: " + ", ".join(f"{s}{e and ' ' + e}" for s, e in zip(spans, ends)))
        return "; ".join(parts)


def chunk_rank(index: int, pp: int, vpp: int, placement: str) -> int:
    """The pipeline rank that runs chunk `index` (see the module docstring)."""
    if placement == "loop":
        return index % pp
    if placement == "v":
        if vpp != 2:
            raise StageSplitError(f"the V placement runs exactly 2 chunks per rank; the plan has vpp={vpp}")
        return index if index < pp else 2 * pp - 1 - index
    raise StageSplitError(f"unknown chunk placement {placement!r}; use one of {', '.join(PLACEMENTS)}")


def default_counts(num_layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """The split a plan without an explicit one runs: the cost model's (as even as possible, the ends
    shorter). Interleaving (vpp > 1) needs every rank's chunks alike, so vpp must divide the layers."""
    from trex.cost_model.pipeline import default_layers_per_chunk

    chunks = pp * vpp
    if chunks > num_layers:
        raise StageSplitError(
            f"pp*vpp = {pp}*{vpp} = {chunks} pipeline chunks exceed the model's {num_layers} decoder layers; "
            f"every chunk needs at least one layer - use pp*vpp <= {num_layers}"
        )
    if vpp > 1 and num_layers % vpp:
        raise StageSplitError(
            f"vpp={vpp} does not divide the model's {num_layers} decoder layers ({num_layers} % {vpp} = "
            f"{num_layers % vpp}); choose a vpp that divides {num_layers}, or give the split explicitly"
        )
    return default_layers_per_chunk(num_layers, chunks)


def from_counts(counts: tuple[int, ...], num_layers: int, pp: int, vpp: int, placement: str = "loop") -> StageSplit:
    """The split of `counts` layers per chunk (model order), checked against the model and the degrees."""
    chunks = pp * vpp
    problems = []
    if len(counts) != chunks:
        problems.append(f"the stage split has {len(counts)} chunks; pp*vpp = {pp}*{vpp} = {chunks}")
    # The end chunks may hold no decoder layer: the first still runs the embedding, the last the norm, the
    # head and the loss (the planner's account-for-embedding/loss split, `cost_model.pipeline`).
    empty = [i for i, n in enumerate(counts) if n < 0 or (n < 1 and i not in (0, len(counts) - 1))]
    if empty:
        problems.append(
            f"chunk(s) {', '.join(map(str, empty))} hold {min(counts[i] for i in empty)} layers; every chunk but the "
            "first and the last (which hold the embedding and the head) needs >= 1"
        )
    if sum(counts) != num_layers:
        problems.append(
            f"the stage split places {sum(counts)} layers ({'+'.join(map(str, counts))}); the model has {num_layers} "
            "- every decoder layer must be in exactly one chunk"
        )
    if problems:
        raise StageSplitError("bad stage split: " + "; ".join(problems))
    return _build(counts, pp, vpp, placement)


def from_ranges(text: str, num_layers: int, pp: int, vpp: int, placement: str = "loop") -> StageSplit:
    """A split written as inclusive layer ranges per chunk, "0-1,2-3" (a single layer: "2"). Every
    decoder layer must appear exactly once and chunks must follow the model's order."""
    ranges: list[tuple[int, int]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        low, _, high = item.partition("-")
        try:
            start, end = int(low), int(high or low)
        except ValueError:
            raise StageSplitError(
                f"--stage-split item {item!r} is not a layer range; write inclusive ranges per chunk, e.g. '0-1,2-3'"
            ) from None
        if end < start:
            raise StageSplitError(f"--stage-split item {item!r} ends before it starts")
        ranges.append((start, end))
    placed: dict[int, int] = {}
    problems = []
    for chunk, (start, end) in enumerate(ranges):
        for layer in range(start, end + 1):
            if layer in placed:
                problems.append(f"layer {layer} is placed twice (chunks {placed[layer]} and {chunk})")
            placed[layer] = chunk
    outside = sorted(layer for layer in placed if not 0 <= layer < num_layers)
    if outside:
        problems.append(
            f"layer(s) {', '.join(map(str, outside))} do not exist (the model has layers 0-{num_layers - 1})"
        )
    missing = [layer for layer in range(num_layers) if layer not in placed]
    if missing:
        problems.append(f"layer(s) {', '.join(map(str, missing))} are in no chunk")
    if not problems and any(ranges[i][0] != ranges[i - 1][1] + 1 for i in range(1, len(ranges))):
        problems.append("the chunks are not in the model's layer order (chunk i+1 must start where chunk i ends)")
    if len(ranges) != pp * vpp:
        problems.append(f"{len(ranges)} chunks given; pp*vpp = {pp}*{vpp} = {pp * vpp}")
    if problems:
        raise StageSplitError(f"bad --stage-split {text!r} for {num_layers} layers: " + "; ".join(problems))
    return _build(tuple(end - start + 1 for start, end in ranges), pp, vpp, placement)


def _build(counts: tuple[int, ...], pp: int, vpp: int, placement: str) -> StageSplit:
    chunks, start = [], 0
    for index, count in enumerate(counts):
        rank = chunk_rank(index, pp, vpp, placement)
        chunks.append(Chunk(index, rank, start, start + count, index == 0, index == len(counts) - 1))
        start += count
    return StageSplit(pp, vpp, placement, tuple(chunks))


def check_first_chunk_layers(split: StageSplit, layers: list[int], why: str) -> None:
    """Layers that must sit in chunk 0 (DeepSeek-V4's hash-routed MoE layers read the token ids)."""
    outside = [layer for layer in layers if layer not in split.chunks[0].layers]
    if outside:
        need = max(layers) + 1
        raise StageSplitError(
            f"layer(s) {', '.join(map(str, outside))} are {why} and must be in the first chunk (it holds the token "
            f"ids), but chunk 0 holds layers {split.chunks[0].start}-{split.chunks[0].end - 1}; give chunk 0 at least "
            f"{need} layers (e.g. --stage-split 0-{need - 1},...)"
        )


def split_for_plan(plan, num_layers: int, placement: str = "loop", ranges: str | None = None) -> StageSplit:
    """The split a resolved plan runs: explicit ranges, the plan's `layers_per_chunk`, or the default."""
    if ranges:
        return from_ranges(ranges, num_layers, plan.pp, plan.vpp, placement)
    if plan.layers_per_chunk is not None:
        return from_counts(tuple(plan.layers_per_chunk), num_layers, plan.pp, plan.vpp, placement)
    return _build(default_counts(num_layers, plan.pp, plan.vpp), plan.pp, plan.vpp, placement)

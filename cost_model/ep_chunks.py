"""How many micro-chunks an expert-parallel layer should run in: the dispatch / experts / combine pipeline.

An EP layer exchanges its rows (dispatch), runs the local experts on what arrived, and exchanges the results
back (combine). In one chunk the experts wait for the whole dispatch and the combine waits for all experts:
nothing hides the two exchanges. Cut the tokens into n chunks and the link carries chunk i+1's dispatch
while the experts compute chunk i, and chunk i's combine while they compute chunk i+1 (the "two
micro-batches" overlap of DeepSeek-V3's training, arXiv:2412.19437 section 3.2). Every chunk pays the
link's latency again (n messages per exchange; the blocking count exchange stays one per layer).

`chunked_layer_seconds` is the same model reorder_comm's timeline uses (one compute stream, one serial link):
the dispatches go out back to back, chunk i's experts start when its rows have arrived and the previous
chunk's experts are done, its combine goes out when its experts are done and the link is free.
"""

from __future__ import annotations

from dataclasses import dataclass

CHUNK_CHOICES = (1, 2, 4)  # micro-chunk counts considered
MIN_GAIN = 0.05  # a split must save at least this share of the one-chunk layer time


@dataclass(frozen=True)
class ChunkChoice:
    chunks: int
    seconds: dict[int, float]  # chunk count -> predicted layer time
    reason: str


def chunked_layer_seconds(
    dispatch_s: float, experts_s: float, combine_s: float, alpha_s: float, chunks: int, counts_s: float = 0.0
) -> float:
    """Predicted time of one EP layer run in `chunks` micro-chunks.

    dispatch_s / combine_s: one-chunk exchange times, each including one link latency `alpha_s`; a chunk's
    exchange takes `alpha_s + (t - alpha_s) / chunks`. experts_s: the local experts over all rows (a chunk takes
    1/chunks of it). counts_s: the blocking count exchange in front of the layer (one for all its chunks)."""
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    alpha = min(alpha_s, dispatch_s, combine_s)

    def part(total: float) -> float:
        return alpha + (total - alpha) / chunks

    link = counts_s  # the blocking count exchange runs first
    now = link
    arrived = []
    for _ in range(chunks):
        link += part(dispatch_s)
        arrived.append(link)
    combine_done = 0.0
    for i in range(chunks):
        now = max(now, arrived[i]) + experts_s / chunks
        link = max(link, now) + part(combine_s)
        combine_done = link
    return max(now, combine_done)


def chunked_backward_seconds(
    combine_s: float, input_s: float, weight_s: float, dispatch_s: float, alpha_s: float, chunks: int
) -> float:
    """Backward of one EP layer in `chunks` micro-chunks with the experts' backward in two nodes per chunk: the
    data gradients (`input_s` over all rows), after which the chunk's dispatch-gradient exchange is issued, and
    the weight gradients (`weight_s`), which nothing in the layer waits for. The combine's gradient exchanges go
    out back to back; a weight-gradient node runs whole while the next chunk's rows are still on the link (as
    reorder_comm's list scheduler fills a wait), the rest after the last data gradient, under the last
    exchange."""
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    alpha = min(alpha_s, dispatch_s, combine_s)

    def part(total: float) -> float:
        return alpha + (total - alpha) / chunks

    link, arrived = 0.0, []
    for _ in range(chunks):
        link += part(combine_s)
        arrived.append(link)
    now, pending, done = 0.0, 0, 0.0
    for i in range(chunks):
        while pending and now < arrived[i]:
            now += weight_s / chunks
            pending -= 1
        now = max(now, arrived[i]) + input_s / chunks
        link = max(link, now) + part(dispatch_s)
        done = link
        pending += 1
    return max(now + pending * weight_s / chunks, done)


def chunked_step_seconds(
    dispatch_s: float,
    experts_s: float,
    combine_s: float,
    alpha_s: float,
    chunks: int,
    counts_s: float = 0.0,
    experts_backward_s: float = 0.0,
    extra_chunk_s: float = 0.0,
    experts_weight_backward_s: float = 0.0,
) -> float:
    """Forward + backward of one EP layer in `chunks` micro-chunks. The backward runs the same pipeline in
    reverse (the autograd graph of the chunked forward is chunked too): the combine's gradient exchange first,
    the experts' backward (`experts_backward_s`, data and weight gradients over all rows), then the dispatch's
    gradient exchange; it has no count exchange. `extra_chunk_s`: what every chunk beyond the first adds
    (summing its expert-weight gradients into the others'). With `experts_backward_s` 0 only the forward.
    `experts_weight_backward_s`: the part of `experts_backward_s` that is the expert-weight gradients, when the
    backward computes them in a node of their own after the data gradients (`chunked_backward_seconds`)."""
    forward = chunked_layer_seconds(dispatch_s, experts_s, combine_s, alpha_s, chunks, counts_s)
    if experts_backward_s <= 0:
        return forward + (chunks - 1) * extra_chunk_s
    weight = min(max(experts_weight_backward_s, 0.0), experts_backward_s)
    backward = chunked_backward_seconds(combine_s, experts_backward_s - weight, weight, dispatch_s, alpha_s, chunks)
    return forward + backward + (chunks - 1) * extra_chunk_s


def choose_chunks(
    dispatch_s: float,
    experts_s: float,
    combine_s: float,
    alpha_s: float,
    counts_s: float = 0.0,
    max_chunks: int = 4,
    experts_backward_s: float = 0.0,
    extra_chunk_s: float = 0.0,
    experts_by_chunks: dict[int, tuple[float, ...]] | None = None,
    experts_weight_backward_s: float = 0.0,
) -> ChunkChoice:
    """The chunk count of `CHUNK_CHOICES` (up to max_chunks, the rows there are) with the shortest predicted
    layer (forward + backward when `experts_backward_s` is given: `chunked_step_seconds`); one chunk unless the
    split saves at least MIN_GAIN of the one-chunk time.

    `experts_by_chunks`: chunk count -> the local experts' forward and backward time over all rows when they run
    in that many calls (each priced at its chunk's rows). A chunk's grouped GEMMs are smaller, and a small GEMM
    is not a proportional share of a large one (launch costs and tile quantisation per call, as the cost model
    prices the chunked graph's own nodes); without it every count takes 1/n of `experts_s` per chunk. A third
    value per count, and `experts_weight_backward_s` for the default: the weight-gradient part of the backward
    (`chunked_step_seconds`)."""
    by_chunks = experts_by_chunks or {}
    default = (experts_s, experts_backward_s, experts_weight_backward_s)
    seconds = {}
    for n in CHUNK_CHOICES:
        if n > max(1, max_chunks):
            continue
        times = tuple(by_chunks.get(n, default)) + default[len(by_chunks.get(n, default)) :]
        seconds[n] = chunked_step_seconds(
            dispatch_s, times[0], combine_s, alpha_s, n, counts_s, times[1], extra_chunk_s, times[2]
        )
    one = seconds[1]
    best = min(seconds, key=lambda n: (seconds[n], n))
    pays = one > 0 and (one - seconds[best]) / one >= MIN_GAIN
    chunks = best if pays else 1
    summary = ", ".join(f"{n} chunk{'s' if n > 1 else ''} {t * 1e3:.3f} ms" for n, t in seconds.items())
    if by_chunks:
        summary += (
            " (experts forward / backward over all rows: "
            + ", ".join(
                f"{n} call{'s' if n > 1 else ''} {times[0] * 1e3:.3f} / {times[1] * 1e3:.3f} ms"
                for n, times in sorted(by_chunks.items())
            )
            + ")"
        )
    backward = (
        f", experts backward {experts_backward_s * 1e3:.3f} ms"
        + (f" ({experts_weight_backward_s * 1e3:.3f} ms weight gradients)" if experts_weight_backward_s > 0 else "")
        + f", per extra chunk {extra_chunk_s * 1e3:.3f} ms (forward + backward)"
        if experts_backward_s > 0
        else ""
    )
    reason = (
        f"dispatch {dispatch_s * 1e3:.3f} ms, experts {experts_s * 1e3:.3f} ms, combine {combine_s * 1e3:.3f} ms"
        f"{backward}, link latency {alpha_s * 1e6:.0f} us: {summary}; "
        + (
            f"{chunks} chunks save {(one - seconds[chunks]) * 1e3:.3f} ms ({(one - seconds[chunks]) / one:.0%})"
            if chunks > 1
            else f"one chunk (the best split saves {(one - seconds[best]) / one if one else 0:.0%} < {MIN_GAIN:.0%})"
        )
    )
    return ChunkChoice(chunks, seconds, reason)

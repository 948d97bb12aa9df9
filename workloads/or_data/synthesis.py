"""Running a whole synthesis: shards in a process pool, merged in order into the outputs.

    synthesize(config, out_dir, n, workers=K, bench_dir=...)

writes into `out_dir`:

| file | what |
| --- | --- |
| manifest.json | the config; a second run with the same config resumes |
| shards/shard-NNNNNN.jsonl | per-index results, one file per finished shard (the resumable state) |
| sft.jsonl | the SFT samples (`records`), exactly `n` unless the run was stopped |
| cpt.jsonl | `{"text": ...}` documents, one per SFT sample (each about a separate instance; `SynthConfig.cpt_instances`: or the sample's own, or none), same order, less those `cpt_separation` drops |
| decontamination.json | what the benchmark n-gram check found |
| stats.json, stats.md | the statistics report (`stats`) |

Shards are scheduled in index order, as many as the expected yield needs, and merged in index
order as they finish (`merge`); the outputs are written once, at the end, through temporary
files and renames. A kill loses only unfinished shards; a rerun reuses the finished ones, and
`n` may grow between runs (more shards are made).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import multiprocessing.util
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trex.errors import TrexError
from trex.workloads.or_data.config import SynthConfig
from trex.workloads.or_data.cpt_separation import Separation
from trex.workloads.or_data.decontamination import BenchmarkIndex
from trex.workloads.or_data.merge import Merger
from trex.workloads.or_data.pipeline import ShardContext, synthesize_shard
from trex.workloads.or_data.shards import ShardStore, open_manifest
from trex.workloads.or_data.stats import Tally, build_stats, stats_markdown, token_counter
from trex.workloads.sandbox.interruption import leave_terminal_session


@dataclass(frozen=True)
class SynthesisResult:
    out_dir: Path
    stats: dict[str, Any]
    shards_made: int  # by this invocation
    shards_reused: int
    wall_s: float


_worker_context: ShardContext | None = None


def _init_worker(config_json: dict, hide: tuple[str, ...]) -> None:
    global _worker_context
    # the terminal's Ctrl-C goes to the coordinating process only: it stops the workers itself and
    # keeps only the shards they finished (an interrupted solve must never become a rejection)
    leave_terminal_session()
    _exit_with_parent(os.getppid())
    config = SynthConfig.from_json(config_json)
    if any(spec.kind == "transformers" for spec in (*config.teachers, config.reflection) if spec is not None):
        import torch

        torch.set_num_threads(1)  # a local model must not take every core in every worker
    _worker_context = ShardContext(config, hide=hide)
    # the modules and the context live as long as the process: out of the collector's sight, its
    # collections visit only what a shard makes (issue 21, ninth session: 0.4 CPU ms per index)
    gc.freeze()
    # pool workers end through os._exit, past atexit: close the sandbox (its workers, directories
    # and cgroup) through multiprocessing's own exit hooks
    multiprocessing.util.Finalize(_worker_context, _worker_context.close, exitpriority=10)


def _exit_with_parent(parent: int) -> None:
    """A killed run must not leave its workers behind: pool workers of a parent killed by a
    signal keep running (and then wait forever for work); this thread ends the worker once it
    has been re-parented."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _worker_shard(start: int, stop: int) -> list[dict[str, Any]]:
    assert _worker_context is not None
    return synthesize_shard(range(start, stop), _worker_context)


# The shard expected to hold the run's last needed samples is made in pieces of this many indices,
# merged as they come: a run needs only the first few indices of its last shard (1,000 samples took
# 1,002 indices, 2 of the last shard's 25), and the rest of a whole last shard was work thrown away
# while the other worker waited. Every piece's results are those its indices get in a whole shard
# (`_pieces_are_independent`), so the outputs do not change.
LAST_SHARD_PIECE = 5


def _pieces_are_independent(config: SynthConfig) -> bool:
    """Whether an index's result is the same whichever indices share its shard: true of the
    programmatic teachers and judge (each task is decided on its own, from its own random
    streams); a model teacher or judge sees its shard's tasks as one batch, so its shards stay whole."""
    return config.reflection is None and all(spec.kind == "programmatic" for spec in config.teachers)


def _pieces(indices: range, split: bool) -> list[range]:
    if not split:
        return [indices]
    return [
        range(start, min(start + LAST_SHARD_PIECE, indices.stop))
        for start in range(indices.start, indices.stop, LAST_SHARD_PIECE)
    ]


def synthesize(
    config: SynthConfig,
    out_dir: str | os.PathLike,
    n: int,
    *,
    workers: int = 1,
    bench_dir: str | os.PathLike | None = None,
    tokenizer_dir: str | None = None,
    progress: bool = True,
    teachers: Sequence | None = None,
    judge=None,
    max_shards: int | None = None,
) -> SynthesisResult:
    """Make (or finish) the run in `out_dir`; see the module docstring.

    `teachers`/`judge` are prebuilt objects for an in-process run (`workers=1`); with more
    workers each process builds its own from the config. `bench_dir=None` skips
    decontamination (the stats say so). `max_shards` stops after making that many shards (for
    benchmarks and tests), leaving a resumable run.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if (teachers is not None or judge is not None) and workers != 1:
        raise ValueError(
            "prebuilt teachers or judges run in-process only: use workers=1, or teacher specs in the config"
        )
    started = time.monotonic()
    root = Path(out_dir)
    open_manifest(root, config.identity())
    store = ShardStore(root, config.shard_size)
    store.clean_temporaries()
    benchmarks = BenchmarkIndex.from_dir(bench_dir, config.ngram) if bench_dir is not None else None
    count, name = token_counter(tokenizer_dir)
    # the report's per-sample work is done as samples are kept, while the workers make later shards
    tally = Tally(count, Separation() if config.cpt_instances == "separate" else None)
    merger = Merger(n, benchmarks, config.near_duplicate, tally=tally)
    hide = tuple(str(path) for path in (root, bench_dir) if path is not None)
    bar = _progress_bar(n, progress)
    made, reused = 0, 0
    try:
        try:
            next_shard = 0
            while not merger.full and store.done(next_shard):  # what earlier runs finished
                merger.feed(store.read(next_shard))
                next_shard, reused = next_shard + 1, reused + 1
            _advance(bar, merger)
            if not merger.full and (max_shards is None or max_shards > 0):
                made, reused_later = _make_shards(
                    config, store, merger, next_shard, workers, teachers, judge, hide, bar, max_shards
                )
                reused += reused_later
        finally:
            if bar is not None:
                bar.close()
        if merger.full:
            stats = _write_outputs(root, merger, (count, name), benchmarks)
        else:
            stats = build_stats(merger, count, name)
    finally:
        gc.unfreeze()  # what `_make_shards` froze is collected again like anything else
    return SynthesisResult(root, stats, made, reused, time.monotonic() - started)


def _make_shards(config, store, merger, first, workers, teachers, judge, hide, bar, max_shards) -> int:
    """Make shards from `first` on until the merger is full; returns how many were made and how
    many finished ones were read back (an interrupted run may have finished shards after a gap).
    A shard made in pieces (`LAST_SHARD_PIECE`) is merged piece by piece and written once whole;
    when the merger fills before its last pieces ran, they are dropped and the shard is not written
    (a later run with a larger n makes it again, with the same results)."""
    finished: dict[tuple[int, int], list[dict[str, Any]]] = {}  # (shard, piece) -> results
    piece_count: dict[int, int] = {}  # shard -> how many pieces it is made in
    next_merge, next_piece, next_submit, made, reused = first, 0, first, 0, 0
    may_split = workers > 1 and _pieces_are_independent(config)

    def yield_rate() -> float:
        return len(merger.sft) / merger.seen_indices if merger.seen_indices else 1.0

    def wanted() -> bool:
        if max_shards is not None and next_submit - first >= max_shards:
            return False
        in_flight = next_submit - next_merge
        expected = len(merger.sft) + in_flight * config.shard_size * max(0.2, yield_rate())
        return expected < merger.n

    def last_needed() -> bool:
        """Whether the next shard is expected to complete the run (it is then made in pieces)."""
        expected = len(merger.sft) + (next_submit - next_merge + 1) * config.shard_size * max(0.2, yield_rate())
        return may_split and expected >= merger.n

    def absorb(shard: int, results: list[dict[str, Any]], piece: int = 0) -> None:
        nonlocal next_merge, next_piece
        finished[(shard, piece)] = results
        piece_count.setdefault(shard, 1)
        while (next_merge, next_piece) in finished and not merger.full:
            merger.feed(finished.pop((next_merge, next_piece)))
            next_piece += 1
            if next_piece == piece_count[next_merge]:
                next_merge, next_piece = next_merge + 1, 0
        # what the merger keeps (every kept sample, the report's n-gram caches) stays until the
        # outputs are written: frozen, the collector stops visiting it again and again (about 0.4 of
        # the coordinator's 7 CPU s on a 1,000-sample run); unfrozen when the run ends
        gc.freeze()
        _advance(bar, merger)
        _refuse_a_run_that_keeps_nothing(merger)

    if workers == 1:
        context = ShardContext(config, teachers=teachers, judge=judge, hide=hide)
        try:
            while not merger.full and wanted():
                shard = next_submit
                next_submit += 1
                if store.done(shard):
                    results = store.read(shard)
                    reused += 1
                else:
                    results = synthesize_shard(store.indices(shard), context)
                    store.write(shard, results)
                    made += 1
                absorb(shard, results)
        finally:
            context.close()
        return made, reused

    spawn = multiprocessing.get_context("spawn")  # no forked copies of solver or torch state
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=spawn, initializer=_init_worker, initargs=(config.to_json(), hide)
    )
    pending: dict[Future, tuple[int, int]] = {}  # -> (shard, piece)
    pieces_done: dict[int, dict[int, list[dict[str, Any]]]] = {}  # shard -> piece -> results, until whole
    try:
        while not merger.full:
            while wanted() and len(pending) < 2 * workers:
                shard = next_submit
                split = last_needed()
                next_submit += 1
                if store.done(shard):
                    absorb(shard, store.read(shard))
                    reused += 1
                    continue
                pieces = _pieces(store.indices(shard), split)
                piece_count[shard] = len(pieces)
                for piece, indices in enumerate(pieces):
                    pending[pool.submit(_worker_shard, indices.start, indices.stop)] = (shard, piece)
            if not pending:
                break
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=pending.__getitem__):
                shard, piece = pending.pop(future)
                try:
                    results = future.result()
                except BrokenProcessPool:
                    raise TrexError(
                        f"a worker process died while making shard {shard} (out of memory, or killed); the {made} shards "
                        "finished by this run are kept: run the same command again to resume"
                    ) from None
                parts = pieces_done.setdefault(shard, {})
                parts[piece] = results
                if len(parts) == piece_count[shard]:
                    store.write(shard, [result for position in sorted(parts) for result in parts[position]])
                    del pieces_done[shard]
                    made += 1
                absorb(shard, results, piece)
    except BaseException:
        _stop_workers(pool)  # Ctrl-C: shards in flight are dropped (not written), redone on resume
        raise
    finally:
        pool.shutdown(wait=not pending, cancel_futures=True)
    return made, reused


NOTHING_KEPT_LIMIT = 1000  # indices; the pipeline's real yield is above 50%, so this only stops a broken setup


def _refuse_a_run_that_keeps_nothing(merger: Merger) -> None:
    """Stop a run whose first NOTHING_KEPT_LIMIT indices gave no sample at all: the shard scheduler
    plans by the yield so far, and at a yield of 0 it would schedule shards forever."""
    if merger.sft or merger.seen_indices < NOTHING_KEPT_LIMIT:
        return
    reasons = merger.rejected + merger.removed
    top = ", ".join(f"{reason} {count}" for reason, count in reasons.most_common(3)) or "none recorded"
    raise TrexError(
        f"none of the first {merger.seen_indices} indices gave a sample (rejected or removed: {top}); the "
        "configuration or the installed solvers cannot produce verified samples - check the configuration's "
        "families and solver settings, then run again (finished shards are kept)"
    )


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's worker processes now (their sandboxed programs die with them), rather than
    waiting for the shards in flight, whose results would be thrown away anyway."""
    for process in list(getattr(pool, "_processes", {}).values()):  # Python 3.14 has terminate_workers()
        try:
            process.kill()
        except (OSError, ValueError):
            pass


def _write_outputs(
    root: Path, merger: Merger, counter: tuple[Callable[[str], int], str], benchmarks: BenchmarkIndex | None
) -> dict[str, Any]:
    """CPT documents that show an SFT instance are dropped (`cpt_separation`, through the merger's
    tally) when it was given a `Separation`; not when the documents are about the SFT instances
    on purpose (`cpt_instances="same"`)."""
    _write_jsonl(root / "sft.jsonl", merger.sft)
    separated = None
    if merger.tally.separation is not None:
        merger.cpt, separated = merger.tally.separate()
    else:
        merger.cpt = [{"text": document["text"]} for document in merger.cpt]
    _write_jsonl(root / "cpt.jsonl", merger.cpt)
    report = merger.contamination.to_json()
    report["cpt_vs_sft"] = (
        separated.to_json() if separated else "not checked: the CPT documents are about the SFT instances"
    )
    report["benchmarks"] = (
        {"directory": benchmarks.root, "ngram": benchmarks.n, "texts_indexed": benchmarks.files} if benchmarks else None
    )
    _write_text(root / "decontamination.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
    stats = build_stats(merger, *counter)
    if benchmarks is None:
        stats["decontamination"]["skipped"] = True
    stats["cpt_separation"] = separated.to_json() if separated else None
    _write_text(root / "stats.json", json.dumps(stats, indent=2, sort_keys=True) + "\n")
    _write_text(root / "stats.md", stats_markdown(stats))
    return stats


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    _write_text(path, "".join(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n" for record in records))


def _write_text(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="or-data", unit="sample", file=sys.stderr, dynamic_ncols=True)


def _advance(bar, merger: Merger) -> None:
    if bar is None:
        return
    bar.n = len(merger.sft)
    rejected = sum(merger.rejected.values()) + sum(merger.removed.values())
    bar.set_postfix(indices=merger.seen_indices, rejected=rejected, refresh=False)
    bar.refresh()

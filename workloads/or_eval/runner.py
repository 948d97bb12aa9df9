"""Running an evaluation: generate, extract, execute in a pool, store as results finish.

Every program runs in its own sandboxed process tree, so the pool that runs them is a thread pool
of `workers` threads that each start one sandbox process and wait for it: `workers` programs run
at once (default: one per CPU core). Generation streams into the pool, so programs run while the
model is still answering later questions.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from trex.workloads.llm_clients.base import Client, Completion, GenerationRequest, sample_key
from trex.workloads.or_eval.benchmarks import Benchmark, Item
from trex.workloads.or_eval.errors import ClientError
from trex.workloads.or_eval.execute import SampleResult, evaluate_completion
from trex.workloads.or_eval.prompts import FORMS, build_prompt
from trex.workloads.or_eval.store import RunStore
from trex.workloads.sandbox import RunInterrupted, Sandbox


@dataclass
class RunResult:
    """The samples of `items` finished so far (this invocation and earlier ones) and the
    throughput of the programs this invocation executed."""

    benchmark: Benchmark
    items: tuple[Item, ...]
    samples: int
    results: dict[str, SampleResult]
    programs_executed: int = 0
    execution_wall_s: float = 0.0
    client: dict = field(default_factory=dict)
    form: str = ""

    @property
    def programs_per_s(self) -> float | None:
        if self.programs_executed == 0 or self.execution_wall_s <= 0:
            return None
        return self.programs_executed / self.execution_wall_s


class _Throughput:
    """Executed-program count and the span from the first start to the last finish."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.first_start: float | None = None
        self.last_end: float | None = None

    def started(self) -> None:
        with self.lock:
            if self.first_start is None:
                self.first_start = time.monotonic()

    def finished(self, executed: bool) -> None:
        with self.lock:
            self.last_end = time.monotonic()
            self.count += int(executed)

    @property
    def wall_s(self) -> float:
        if self.first_start is None or self.last_end is None:
            return 0.0
        return self.last_end - self.first_start


def evaluate(
    benchmark: Benchmark,
    client: Client,
    sandbox: Sandbox,
    *,
    form: str = "pyscipopt",
    samples: int = 1,
    out_dir: str | os.PathLike | None = None,
    workers: int | None = None,
    limit: int | None = None,
    progress: bool = True,
) -> RunResult:
    """Evaluate `client` on `benchmark` (its first `limit` items), `samples` samples per item."""
    if form not in FORMS:
        raise ValueError(f"unknown answer form {form!r}; valid: {', '.join(FORMS)}")
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    items = benchmark.items[:limit] if limit is not None else benchmark.items
    identity = client.identity()
    store = RunStore(
        out_dir,
        {
            "benchmark": benchmark.name,
            "benchmark_path": benchmark.path,
            "benchmark_sha256": benchmark.sha256,
            "form": form,
            "samples": samples,
            "client": identity,
        },
    )
    by_key = {sample_key(item.id, j): (item, j) for item in items for j in range(samples)}
    todo = [key for key in by_key if key not in store.results]
    stored = [key for key in todo if key in store.generations]
    to_generate = [
        GenerationRequest(item=by_key[key][0], sample=by_key[key][1], prompt=build_prompt(by_key[key][0], form))
        for key in todo
        if key not in store.generations
    ]
    throughput = _Throughput()
    bar = _progress_bar(len(by_key), len(by_key) - len(todo), benchmark.name, progress)
    pool = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1, thread_name_prefix="sandbox")
    futures: list[Future] = []

    def run_one(item: Item, sample: int, completion: Completion) -> None:
        throughput.started()
        try:
            result = evaluate_completion(item, sample, completion, form, sandbox)
        except RunInterrupted:
            return  # stopped by the interrupt: no result, the next invocation runs it again
        store.add_result(result)
        throughput.finished(result.executed)
        bar.update(1)

    def submit(completion: Completion) -> None:
        item, sample = by_key[completion.key]
        futures.append(pool.submit(run_one, item, sample, completion))

    try:
        try:
            for key in stored:
                submit(store.generations[key])
            for completion in client.generate(to_generate):
                if completion.key not in by_key:
                    raise RuntimeError(f"client returned an unrequested key {completion.key!r}")
                if client.persist_generations:
                    store.add_generation(completion)
                submit(completion)
        except ClientError:
            pool.shutdown(wait=True)  # the model is gone, but the answers it gave still run and are kept
            raise
        pool.shutdown(wait=True)
    except ClientError:
        raise
    except BaseException:
        # Ctrl-C (or a bug), while generating or while waiting for the programs: programs in
        # flight are stopped and record nothing (`RunInterrupted`), queued ones are dropped; the
        # next invocation executes both again, reusing stored generations.
        sandbox.abort()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        bar.close()
        store.close()
    for future in futures:
        if not future.cancelled():
            future.result()  # re-raise an evaluator bug instead of hiding it
    results = {key: store.results[key] for key in by_key if key in store.results}
    return RunResult(
        benchmark=benchmark,
        items=tuple(items),
        samples=samples,
        results=results,
        programs_executed=throughput.count,
        execution_wall_s=throughput.wall_s,
        client=identity,
        form=form,
    )


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, initial: int, name: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=name, unit="sample", file=sys.stderr, dynamic_ncols=True)

"""Start the ranks of a training run with torch.distributed's own launcher (elastic `elastic_launch`,
what `torchrun` runs), or run in this process when torchrun already started it.

A rank that dies ends the run in bounded time: the elastic agent watches its workers every
`MONITOR_INTERVAL_S` and stops the others when one exits badly (no restarts), and a collective that
waits for a dead peer fails after the job's timeout. The failure is reported with the rank that
failed first and the step it was in (each rank keeps `rank<R>.json` in a progress directory).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Any

from trex.errors import TrexError
from trex.runtime.trainer import TrainJob, run_rank, run_rank_jobs

MONITOR_INTERVAL_S = 0.2


def started_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(job: TrainJob) -> dict[str, Any]:
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(run_rank)(job)


def run_jobs(jobs: list[TrainJob]) -> list[dict[str, Any]]:
    """One rank's part of several runs in one process group (benchmarks and tests: one start-up for many plans)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(run_rank_jobs)(jobs)


def launch(job: TrainJob, nproc: int) -> dict[str, Any]:
    """Run `job` on `nproc` local ranks; returns rank 0's result."""
    if started_by_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if world != nproc:
            raise TrexError(f"started by torchrun with WORLD_SIZE={world}, but --nproc={nproc}; pass --nproc {world}")
        return run_rank(job)
    if nproc == 1:
        return run_rank(job)
    with tempfile.TemporaryDirectory(prefix="trex-progress-") as progress:
        job = dataclasses.replace(job, progress_dir=job.progress_dir or progress)
        return launch_function(_worker, (job,), nproc, Path(job.progress_dir))[0]


def launch_function(function: Any, args: tuple, nproc: int, progress_dir: Path | None = None) -> dict[int, Any]:
    """Run `function(*args)` on `nproc` local ranks started by the elastic launcher; returns each rank's result.

    `function` must be importable by name (ranks are spawned). A failure raises TrexError naming the
    first rank that failed and, when `progress_dir` holds the ranks' progress files, its step.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: N ranks share the cores
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"trex-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        max_restarts=0,
        monitor_interval=MONITOR_INTERVAL_S,
        start_method="spawn",
    )
    try:
        return elastic_launch(config, function)(*args)
    except ChildFailedError as error:
        raise TrexError(describe_failure(error, progress_dir)) from None


def describe_failure(error: Any, progress_dir: Path | None) -> str:
    """Name the rank that failed first, its step, and what it said."""
    failures = sorted(error.failures.items(), key=lambda item: (item[1].timestamp, item[0]))
    rank, failure = failures[0]
    step = _step_of(progress_dir, rank) if progress_dir is not None else None
    signal = failure.signal_name() if failure.exitcode is not None and failure.exitcode < 0 else None
    how = f"was killed by {signal}" if signal else f"exited with code {failure.exitcode}"
    where = f"at step {step}" if step is not None else "before its first step" if progress_dir is not None else ""
    message = str(failure.message or "").strip()
    detail = ""
    if isinstance(failure.error_file_data, dict):
        inner = failure.error_file_data.get("message", {})
        detail = inner.get("message", "") if isinstance(inner, dict) else str(inner)
    elif message and "Signal" not in message and "To enable traceback" not in message:
        detail = message
    others = [r for r, _ in failures[1:]]
    text = f"rank {rank} {how}{' ' + where if where else ''}; the run was stopped"
    if others:
        text += f" (ranks {', '.join(map(str, others))} were stopped with it)"
    if detail and detail.strip() != "<NONE>":
        text += f": {detail.splitlines()[0] if detail else ''}"
    return text


def _step_of(progress_dir: Path, rank: int) -> int | None:
    path = progress_dir / f"rank{rank}.json"
    try:
        return json.loads(path.read_text()).get("step")
    except (OSError, json.JSONDecodeError):
        return None

"""Count what one rank of a plan issues in a training step, by running that rank's program on a fake group.

The eager CPU rank's issue cost (`cost_model.eager_issue`) is priced from its ops: how many plain and
DTensor ops one step issues (every micro-batch's forward and backward, the gradient reductions, the
optimizer step) and how many FSDP2 unit passes it makes. Those counts depend on the model, the plan's
tensor-parallel styles, the micro-batches a replica runs and the optimizer's layout - so rather than a
formula per family they are read off the program itself: rank 0 of the plan is built by the runtime's own
`Trainer` in a spawned process whose process group is torch's fake backend (every rank's host-side logic
runs; no data moves), steps once to warm up, and the second step is counted under `IssuedOps`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from pathlib import Path
from typing import Any

from trex.cost_model.eager_issue import IssueCounts
from trex.cost_model.parallel import ParallelConfig


def count_in_process(model_path: str, plan: dict[str, Any], nproc: int, optimizer: str) -> IssueCounts:
    """Build rank 0 of `plan` in THIS process (which must have no process group) on a fake group of `nproc`
    ranks, run one step, and count the next one."""
    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers the "fake" backend
    from torch.distributed.fsdp import FSDPModule

    from trex.cost_model.eager_issue_measure import IssuedOps
    from trex.runtime.memory_accounting import SavedActivations
    from trex.runtime.optimization import Schedule
    from trex.runtime.trainer import ProgressFile, Trainer, TrainJob

    torch.set_num_threads(1)
    job = TrainJob(model=model_path, plan_text="", plan=plan, steps=2, verbose=False, optimizer=optimizer)
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=nproc)
    try:
        trainer = Trainer(job, torch.device("cpu"), ProgressFile(None, 0))
        trainer.build()
        trainer.schedule = Schedule(job.lr, 0, 0, job.min_lr_ratio)
        trainer.tokens_trained, trainer.grad_norms, trainer.learning_rates = [], [], []
        trainer.activations, trainer.gathered, trainer.count_activations = SavedActivations(trainer.model), None, False
        trainer.train_step(0)
        with IssuedOps() as mode:
            trainer.train_step(1)
        units = sum(1 for module in trainer.model.modules() if isinstance(module, FSDPModule))
        return IssueCounts(mode.plain, mode.dtensor, units * trainer.plan.microbatches)
    finally:
        dist.destroy_process_group()


def _counts(model_path: str, plan: dict[str, Any], nproc: int, optimizer: str) -> dict[str, int]:
    return count_in_process(model_path, plan, nproc, optimizer).to_dict()


@functools.lru_cache(maxsize=64)
def _count_cached(config_json: str, plan_json: str, nproc: int, optimizer: str) -> IssueCounts | str:
    from trex.cost_model.eager_issue_measure import answer_apart

    with tempfile.TemporaryDirectory(prefix="trex-issued-") as directory:
        path = Path(directory) / "config.json"
        path.write_text(config_json)
        result = answer_apart(_counts, (str(path), json.loads(plan_json), nproc, optimizer), 600.0)
    if result is None:
        return "the counting process ended without an answer (or ran past 600 s)"
    if "error" in result:
        return result["error"]
    return IssueCounts(**result)


def count_issued(config: Any, plan: ParallelConfig, nproc: int, optimizer: str = "adamw") -> IssueCounts | str:
    """The counts for rank 0 of `plan` on `nproc` ranks, or a sentence saying why they could not be taken.
    Counted in a spawned process (the fake group never touches the caller's); remembered per config and plan."""
    if plan.pp > 1:
        return "pipeline ranks run the schedule runtime's trainer, priced by its own tasks"
    plan_json = json.dumps(plan.to_dict(), sort_keys=True)
    return _count_cached(config.to_json_string(use_diff=False), plan_json, nproc, optimizer)


def with_issue_counts(plan: ParallelConfig, counts: IssueCounts) -> ParallelConfig:
    return dataclasses.replace(plan, issued_ops=(counts.plain_ops, counts.dtensor_ops, counts.fsdp_unit_passes))

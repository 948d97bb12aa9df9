"""One rank's training run: build the model, apply the plan, train, measure, checkpoint.

`run_rank(job)` is what every process executes (started by `runtime.launcher` or by torchrun).
Initialization and data depend on the seed only: every rank builds the whole model from the seed,
then keeps its part (its experts under ep, its tensor-parallel shards under tp, its FSDP shard under
zero=3). Each replica trains on its rows of the seed's global batch; the loss back-propagated is the
token sum divided by the tokens of the global batch, so gradients summed over replicas are those of
the 1-rank run, and so are the losses.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trex.cost_model.parallel import ParallelConfig
from trex.errors import TrexError


@dataclass(frozen=True)
class TrainJob:
    """Everything a rank needs; plain data so it pickles to spawned processes."""

    model: str  # built-in name, tiny-<family>, or a config.json path
    plan_text: str
    plan: dict[str, Any]  # ParallelConfig.to_dict() of the resolved plan
    steps: int
    seed: int = 0
    data: str = "synthetic"
    lr: float = 1e-3
    weight_decay: float = 0.01
    checkpoint_dir: str | None = None
    save_every: int = 0
    resume: bool = False
    compile: bool = False  # capture each rank's model with trex.compile
    progress_dir: str | None = None  # where ranks record the step they are in (fault reports)
    timeout_s: float = 300.0  # a collective that waits longer fails (a peer is gone)
    gather_gradients: bool = False  # return the first step's full gradients (equivalence tests)
    verbose: bool = True  # rank 0 prints each step's loss to stderr

    @classmethod
    def create(
        cls,
        model: str,
        plan_text: str,
        nproc: int,
        *,
        seq: int,
        gbs: int,
        mbs: int = 1,
        precision: str = "fp32",
        **fields: Any,
    ) -> TrainJob:
        """A job whose plan is resolved (and refused, with the numbers, if it cannot run) for `nproc` ranks."""
        from trex.models import load_config
        from trex.runtime.run_plan import resolve_plan

        plan = resolve_plan(plan_text, load_config(model), nproc, seq=seq, gbs=gbs, mbs=mbs, precision=precision)
        return cls(model=model, plan_text=plan_text, plan=plan.to_dict(), **fields)

    @property
    def parallel(self) -> ParallelConfig:
        return ParallelConfig.from_dict(dict(self.plan))


@dataclass
class RankResult:
    losses: list[float]
    first_step: int
    world_size: int
    plan: str
    step_times_s: list[float]
    memory_bytes: dict[str, int]
    gradients: dict[str, torch.Tensor] | None = None
    notes: list[str] = field(default_factory=list)
    captured_ops: dict[str, int] = field(
        default_factory=dict
    )  # distributed op -> nodes in the captured graphs (--compile)


def device_and_backend() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))), "nccl"
    try:
        import torch_npu  # noqa: F401

        return torch.device("npu", int(os.environ.get("LOCAL_RANK", "0"))), "hccl"
    except ImportError:
        return torch.device("cpu"), "gloo"


def run_rank(job: TrainJob) -> dict[str, Any]:
    """Entry point of one process. Returns the rank's result as a dict (rank 0's is the run's)."""
    from datetime import timedelta

    world = int(os.environ.get("WORLD_SIZE", "1"))
    device, backend = device_and_backend()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Under torchrun the process group exists even for one rank (so nccl/hccl is exercised end to end).
    if (world > 1 or "TORCHELASTIC_RUN_ID" in os.environ) and not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=job.timeout_s))
    try:
        return execute(job, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_rank_jobs(jobs: list[TrainJob]) -> list[dict[str, Any]]:
    """Entry point of one process that runs several jobs (same world size) one after the other."""
    from datetime import timedelta

    device, backend = device_and_backend()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=max(j.timeout_s for j in jobs)))
    try:
        return [execute(job, device) for job in jobs]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def execute(job: TrainJob, device: torch.device | None = None) -> dict[str, Any]:
    """Run `job` in the current process group (or alone); every rank of the group calls this."""
    device = device or device_and_backend()[0]
    rank = dist.get_rank() if dist.is_initialized() else 0
    progress = ProgressFile(job.progress_dir, rank)
    try:
        result = asdict(Trainer(job, device, progress).run())
    except Exception as error:
        if isinstance(error, TrexError):
            raise
        raise TrexError(f"rank {rank} failed at step {progress.step}: {type(error).__name__}: {error}") from error
    memory = [result["memory_bytes"]]
    if dist.is_initialized():
        memory = [None] * dist.get_world_size()
        dist.all_gather_object(memory, result["memory_bytes"])
    result["memory_by_rank"] = memory
    return result


class ProgressFile:
    """`rank<R>.json` holding this rank's pid and the step it is in; read by the launcher after a failure."""

    def __init__(self, directory: str | None, rank: int):
        self.path = Path(directory) / f"rank{rank}.json" if directory else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.step = rank, None

    def at(self, step: int | None) -> None:
        self.step = step
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"rank": self.rank, "pid": os.getpid(), "step": step}))
            os.replace(tmp, self.path)


class Trainer:
    def __init__(self, job: TrainJob, device: torch.device, progress: ProgressFile):
        self.job, self.device, self.progress = job, device, progress
        self.plan = job.parallel
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        if self.world != self.plan.devices:
            raise TrexError(
                f"the plan {job.plan_text!r} needs {self.plan.devices} processes (tp*dp = "
                f"{self.plan.tp}*{self.plan.dp}); "
                f"{self.world} were started"
            )

    # -- setup ----------------------------------------------------------------------------------
    def build(self) -> None:
        from trex.models import build_model, load_config
        from trex.runtime.data import TokenSource
        from trex.runtime.parallelize import parallelize

        plan = self.plan
        self.config = load_config(self.job.model)
        model = build_model(self.config, seed=self.job.seed)
        model.train()
        self.global_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        self.source = TokenSource(
            self.job.data, vocab_size=self.config.vocab_size, seq=plan.seq, gbs=plan.gbs, seed=self.job.seed
        )
        self.applied = parallelize(model, plan, self.device, lr=self.job.lr, weight_decay=self.job.weight_decay)
        self.model = self.applied.model
        self.forward = self.model
        self.count_activations = True
        if self.job.compile:
            import trex

            self.forward = trex.compile(self.model)
            if plan.ep > 1:  # trex.compile selects the local "trex" experts op; this model's experts are sharded
                from trex.runtime.expert_parallel import route_through_ep

                route_through_ep(self.model)

    # -- one step -------------------------------------------------------------------------------
    def loss_of(self, inputs: torch.Tensor, targets: torch.Tensor, normalizer: int) -> torch.Tensor:
        autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16) if self.plan.precision == "bf16" else nullcontext()
        )
        with autocast:
            logits = self.forward(input_ids=inputs, use_cache=False).logits
        with self.applied.loss_context():
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
        return loss / normalizer

    def train_step(self, step: int) -> float:
        from trex.runtime.data import micro_batches, replica_rows

        plan = self.plan
        tokens = self.source.global_batch(step).to(self.device)
        rows = replica_rows(tokens, self.applied.replica_index, self.applied.replicas)
        normalizer = plan.gbs * plan.seq
        local = torch.zeros((), device=self.device, dtype=torch.float64)
        batches = micro_batches(rows, plan.mbs)
        for i, batch in enumerate(batches):
            self.applied.before_micro_batch(last=i == len(batches) - 1)
            # Saved activations are the same every step: count them in the first step only (no hooks later).
            with self.activations.counting() if self.count_activations else nullcontext():
                loss = self.loss_of(batch.inputs, batch.targets, normalizer)
            with self.applied.loss_context():  # vocab-parallel cross-entropy has its own backward
                loss.backward()
            local += _plain(loss.detach()).double()
        self.applied.optimizer.reduce_gradients()
        if self.job.gather_gradients and self.gathered is None:
            self.gathered = self.applied.full_gradients()
        self.applied.optimizer.step()
        if self.applied.replica_group is not None:
            dist.all_reduce(local, group=self.applied.replica_group)
        return float(local)

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> RankResult:
        from trex.runtime.checkpoint import CheckpointStore
        from trex.runtime.memory_accounting import SavedActivations

        self.progress.at(None)
        self.build()
        self.activations = SavedActivations(self.model)
        self.gathered = None
        store = (
            CheckpointStore(self.job.checkpoint_dir, self.job, self.global_shapes) if self.job.checkpoint_dir else None
        )
        first = 0
        if self.job.resume:
            if store is None:
                raise TrexError("--resume needs --checkpoint-dir (the directory an earlier run saved into)")
            first = store.load(self.applied)
        elif store is not None:
            store.check_fresh()
        if first >= self.job.steps:
            raise TrexError(
                f"the checkpoint in {self.job.checkpoint_dir} is at step {first}; --steps {self.job.steps} "
                "leaves nothing to run "
                f"(raise --steps above {first})"
            )
        losses, times = [], []
        for step in range(first, self.job.steps):
            self.progress.at(step)
            start = time.perf_counter()
            self.count_activations = step == first
            losses.append(self.train_step(step))
            times.append(time.perf_counter() - start)
            if self.progress.rank == 0 and self.job.verbose:
                print(f"trex train: step {step}  loss {losses[-1]:.6f}  {times[-1]:.3f} s", file=sys.stderr, flush=True)
            if store is not None and self.job.save_every and (step + 1) % self.job.save_every == 0:
                store.save(self.applied, step + 1)
        self.progress.at(self.job.steps)
        memory = self.applied.memory_bytes()
        memory["activations"] = self.activations.peak_bytes
        memory["total"] = sum(memory.values())
        if self.device.type == "cuda":  # the allocator's own peak, beside the tensor accounting
            memory["allocator_peak"] = torch.cuda.max_memory_allocated(self.device)
        return RankResult(
            losses,
            first,
            self.world,
            self.plan.label(),
            times,
            memory,
            self.gathered,
            self.applied.notes,
            self.captured_ops(),
        )

    def captured_ops(self) -> dict[str, int]:
        """With --compile: how many nodes of each distributed op the captured joint graphs hold."""
        session = getattr(self.forward, "trex", None)
        counts: dict[str, int] = {}
        for graph in session.graphs if session is not None else []:
            module = graph.joint or graph.forward
            for node in module.graph.nodes if module is not None else []:
                name = str(node.target)
                if node.op == "call_function" and ("moe_experts" in name or "c10d" in name):
                    counts[name] = counts.get(name, 0) + 1
        return counts


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")

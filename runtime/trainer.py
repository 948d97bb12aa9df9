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

from trex.cost_model.parallel import ParallelConfig
from trex.errors import TrexError

IGNORE_INDEX = -100  # a target that is not scored: context tokens of SFT, padding, document boundaries
# The trainer of pp > 1 plans subclasses `Trainer`; it is named ("module:Class", imported in the rank as a
# recipe's `source` is) so that this module does not import its own subclass.
PIPELINE_TRAINER = "trex.runtime.pipeline.trainer:PipelineTrainer"


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
    # -- recipes beyond next-token training (the OR post-training loop sets these) -------------------
    source: str | None = None  # "module:function" building the batch source in each rank: f(job, config)
    source_args: dict[str, Any] = field(default_factory=dict)  # plain data for `source`
    config_overrides: dict[str, Any] = field(default_factory=dict)  # e.g. vocab_size to fit a tokenizer
    warmup_steps: int = 0  # learning rate: linear warmup, then cosine to min_lr_ratio*lr at decay_steps
    decay_steps: int = 0  # 0: constant learning rate after warmup
    min_lr_ratio: float = 0.1
    clip_grad_norm: float = 0.0  # 0: no clipping
    export_dir: str | None = None  # rank 0 writes the final model here with save_pretrained
    optimizer: str = "adamw"  # or "muon" (matrices; AdamW for the rest), see runtime/muon.py
    init_dir: str | None = None  # start from these weights (a save_pretrained directory) instead of the seed's
    # -- pipeline parallelism (pp > 1, runtime/pipeline) ----------------------------------------------
    schedule: str = ""  # gpipe | 1f1b | interleaved | zbv | dualpipev; "": 1f1b (interleaved with vpp > 1)
    stage_split: str = ""  # inclusive layer ranges per chunk ("0-1,2-3"); "": the plan's split
    emulate_link: str | None = None  # gloo collectives take this link's modelled time (runtime/emulated_link.py)
    zero3: str = "fsdp2"  # zero=3 as FSDP2 hooks, or "graph": collectives inside the graph (runtime/zero3_in_graph)
    ep_chunks: str = "auto"  # EP layers' micro-chunks: "auto" (the cost model's choice with --compile) or a count
    # take the bubble prediction's calibration before the training steps instead of after them (the bubble bench
    # alternates the order between its rounds, so neither side always sees the host first)
    calibrate_first: bool = False
    # also time the task calibration's samples with every pipeline rank at once (a diagnostic: RESULTS 14.16 found
    # them equal to the in-turn ones), reported as `predicted_concurrent_tasks`; the prediction does not use them
    calibrate_concurrent: bool = False

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

        config = load_config(model)
        plan = resolve_plan(plan_text, config, nproc, seq=seq, gbs=gbs, mbs=mbs, precision=precision)
        from trex.runtime.pipeline.limits import check_pipeline_job

        check_pipeline_job(
            config, plan, fields.get("schedule", ""), fields.get("stage_split", ""), fields.get("compile", False)
        )
        from trex.runtime.zero3_in_graph import check_compiled_zero3

        check_compiled_zero3(plan, fields.get("zero3", "fsdp2"), fields.get("compile", False))
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
    tokens_trained: list[int] = field(default_factory=list)  # targets scored per step (padding and context excluded)
    grad_norms: list[float] = field(default_factory=list)  # global gradient norm per step, before clipping
    learning_rates: list[float] = field(default_factory=list)
    pipeline: dict[str, Any] = field(default_factory=dict)  # pp > 1: schedule, split, measured/predicted bubble


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
    if job.emulate_link is not None and backend == "gloo":
        from trex.runtime.emulated_link import install

        backend = install(job.emulate_link)
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
    trainer_class = _named(PIPELINE_TRAINER) if job.parallel.pp > 1 else Trainer
    try:
        result = asdict(trainer_class(job, device, progress).run())
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
                f"the plan {job.plan_text!r} needs {self.plan.devices} processes (tp*pp*dp = "
                f"{self.plan.tp}*{self.plan.pp}*{self.plan.dp}); "
                f"{self.world} were started"
            )

    # -- setup ----------------------------------------------------------------------------------
    def build(self) -> None:
        from trex.models import build_model, load_config
        from trex.runtime.parallelize import parallelize

        plan = self.plan
        self.config = load_config(self.job.model)
        for key, value in self.job.config_overrides.items():
            setattr(self.config, key, value)
        model = build_model(self.config, seed=self.job.seed)
        if self.job.init_dir:
            load_weights(model, Path(self.job.init_dir))
        model.train()
        from trex.runtime.training_layout import check_layout

        check_layout(model, plan)
        self.global_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        self.source = self.batch_source()
        if self.job.zero3 == "graph":
            from trex.runtime.zero3_in_graph import apply_zero3_in_graph

            self.applied = apply_zero3_in_graph(
                model, plan, self.device, lr=self.job.lr, weight_decay=self.job.weight_decay
            )
        else:
            self.applied = parallelize(
                model,
                plan,
                self.device,
                lr=self.job.lr,
                weight_decay=self.job.weight_decay,
                optimizer=self.job.optimizer,
            )
        self.model = self.applied.model
        if plan.ep > 1:
            from trex.runtime.expert_parallel import choose_ep_chunks

            self.applied.notes.extend(
                choose_ep_chunks(self.model, self.job.ep_chunks, plan.mbs * plan.seq, self.job.compile)
            )
        from trex.runtime.rank_loss import RankLoss

        # The micro-batch's program: forward, loss and gradient reductions (captured whole under --compile).
        self.forward = RankLoss(
            self.model,
            self.applied.vocab_shard(),
            bf16=plan.precision == "bf16",
            device_type=self.device.type,
            ignore_index=IGNORE_INDEX,
        )
        self.count_activations = True
        if self.job.compile:
            import trex

            self.forward = trex.compile(self.forward)
            if plan.ep > 1:  # trex.compile selects the local "trex" experts op; this model's experts are sharded
                from trex.runtime.expert_parallel import route_through_ep

                route_through_ep(self.model)

    def batch_source(self):
        """Where global batches come from: the recipe's `source`, else `--data` as next-token training."""
        from trex.runtime.data import TokenSource

        if self.job.source:
            import importlib

            module, _, function = self.job.source.partition(":")
            return getattr(importlib.import_module(module), function)(self.job, self.config)
        return TokenSource(
            self.job.data, vocab_size=self.config.vocab_size, seq=self.plan.seq, gbs=self.plan.gbs, seed=self.job.seed
        )

    # -- one step -------------------------------------------------------------------------------
    def loss_of(self, batch, normalizer: int, *, last: bool) -> torch.Tensor:
        """The micro-batch's loss. `last`: the last micro-batch of the step, whose backward issues the gradient
        reductions (`AppliedPlan.gradient_reductions`: functional collectives in the rank's backward graph, applied
        inside `runtime.rank_loss.RankLoss` - the captured program under --compile)."""
        reductions = self.applied.gradient_reductions(last)
        return self.forward(batch.inputs, batch.targets, batch.position_ids, reductions) / normalizer

    def train_step(self, step: int) -> float:
        from trex.runtime.data import as_global_batch, micro_batches
        from trex.runtime.optimization import clip_gradients, set_learning_rate

        batch = as_global_batch(self.source.global_batch(step)).to(self.device)
        rows = batch.replica_rows(self.applied.replica_index, self.applied.replicas)
        # The loss is the mean over the global batch's scored targets, whatever the plan: every replica
        # divides its token sum by the same global count, so the summed gradients are the 1-rank run's.
        normalizer = max(1, int((batch.targets != IGNORE_INDEX).sum()))
        self.tokens_trained.append(normalizer)
        local = torch.zeros((), device=self.device, dtype=torch.float64)
        batches = micro_batches(rows, self.plan.mbs)
        for i, micro in enumerate(batches):
            self.applied.before_micro_batch(last=i == len(batches) - 1)
            # Saved activations are the same every step: count them in the first step only (no hooks later).
            with self.activations.counting() if self.count_activations else nullcontext():
                loss = self.loss_of(micro, normalizer, last=i == len(batches) - 1)
            loss.backward()
            local += _plain(loss.detach()).double()
        self.applied.optimizer.reduce_gradients()
        if self.job.gather_gradients and self.gathered is None:
            self.gathered = self.applied.full_gradients()
        if self.job.clip_grad_norm > 0 or self.job.source:
            self.grad_norms.append(clip_gradients(self.applied, self.job.clip_grad_norm))
        lr = self.schedule.learning_rate(step)
        self.learning_rates.append(lr)
        set_learning_rate(self.applied.optimizer.optimizer, lr)
        self.applied.optimizer.step()
        if self.applied.replica_group is not None:
            dist.all_reduce(local, group=self.applied.replica_group)
        return float(local)

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> RankResult:
        from trex.runtime.checkpoint import CheckpointStore
        from trex.runtime.memory_accounting import SavedActivations
        from trex.runtime.optimization import Schedule

        self.progress.at(None)
        self.build()
        self.schedule = Schedule(self.job.lr, self.job.warmup_steps, self.job.decay_steps, self.job.min_lr_ratio)
        self.tokens_trained, self.grad_norms, self.learning_rates = [], [], []
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
        if self.job.export_dir:
            self.export(Path(self.job.export_dir))
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
            self.tokens_trained,
            self.grad_norms,
            self.learning_rates,
        )

    def export(self, directory: Path) -> None:
        """The trained model, whole, in transformers' format (`save_pretrained`), written by rank 0.

        Every rank takes part in gathering the shards (a collective); the weights are copied into a fresh
        model of the same config on the CPU, so the export loads anywhere with `from_pretrained`."""
        from torch.distributed.tensor import DTensor

        from trex.models import build_model

        state = {}
        for name, tensor in self.applied.model_state().items():
            whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            state[name] = whole.detach().to("cpu", torch.float32)
        if self.progress.rank != 0:
            return
        model = build_model(self.config, seed=self.job.seed)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if m in dict(model.named_parameters())]:
            raise TrexError(
                f"export: state does not match the model (missing {missing[:5]}, unexpected {unexpected[:5]})"
            )
        directory.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(directory), safe_serialization=True)

    def captured_ops(self) -> dict[str, int]:
        """With --compile: how many nodes of each distributed op the captured joint graphs hold."""
        session = getattr(self.forward, "trex", None)
        counts: dict[str, int] = {}
        for graph in session.graphs if session is not None else []:
            module = graph.joint or graph.forward
            for node in module.graph.nodes if module is not None else []:
                name = str(node.target)
                if node.op == "call_function" and ("moe_experts" in name or "c10d" in name or ".ep_" in name):
                    counts[name] = counts.get(name, 0) + 1
        return counts


def load_weights(model: torch.nn.Module, directory: Path) -> None:
    """Copy the weights of a `save_pretrained` directory into `model` (same architecture and shapes).

    They are read with transformers' own `from_pretrained`, which undoes any checkpoint-format mapping
    `save_pretrained` applied, then copied by name; a mismatch names the first differing parameters."""
    from transformers import AutoModelForCausalLM

    try:
        source = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError) as error:
        raise TrexError(f"--init {directory}: cannot load a model from it: {error}") from None
    theirs, ours = source.state_dict(), model.state_dict()
    differing = [
        name for name in ours if name not in theirs or tuple(theirs[name].shape) != tuple(ours[name].shape)
    ] + [name for name in theirs if name not in ours]
    if differing:
        raise TrexError(
            f"--init {directory}: its weights do not fit --model (first differences: {differing[:4]}); pass the "
            "model the weights were trained as"
        )
    model.load_state_dict(theirs)


def _named(name: str) -> Any:
    import importlib

    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")

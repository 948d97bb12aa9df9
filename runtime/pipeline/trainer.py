"""One rank's training run under a plan with pipeline parallelism (pp > 1).

Every rank builds the whole model from the seed (initialization depends on the seed only), keeps the
chunks of its pipeline stage (`stages.keep_rank_part`, parameter names unchanged), applies the rest of
the plan to that part (dp/ZeRO-0,1,2,3, ep and tp over the stage's ranks, `runtime.parallelize` on the
stage's meshes; under tp each chunk hands on its rank's sequence shard, `ChunkModule.sequence_parallel_on`) and hands its chunks to the engine's schedule (`schedules.build_schedule`). Each
micro-batch's loss is its token sum divided by the tokens of the global batch, as in the 1-rank run,
so the losses and the summed gradients are the 1-rank run's. The last stage's losses are summed over
its data-parallel replicas and shared with every rank (rank 0 reports the run).

Besides losses, each step records every compute action's interval (`timing.TimedPipelineStage`): the
measured bubble is 1 - busy/step per rank; the predicted one is the cost model's (`bubble.predicted`).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trex.errors import TrexError
from trex.runtime.pipeline.timing import collector_paused, comm_split, p2p_timed
from trex.runtime.trainer import IGNORE_INDEX, Trainer


class PipelineTrainer(Trainer):
    # -- setup ----------------------------------------------------------------------------------
    def build(self) -> None:
        from trex.models import build_model, load_config
        from trex.runtime.parallelize import parallelize
        from trex.runtime.pipeline.schedules import (
            V_SCHEDULES,
            build_schedule,
            check_schedule,
            default_schedule,
            placement_of,
        )
        from trex.runtime.pipeline.split import split_for_plan
        from trex.runtime.pipeline.stages import build_chunks, check_pipeline_model, keep_rank_part
        from trex.runtime.pipeline.timing import StageClock, timed_stage
        from trex.runtime.trainer import load_weights

        plan, job = self.plan, self.job
        if job.source or job.clip_grad_norm > 0:
            raise TrexError(
                "pipeline parallelism (pp > 1) runs next-token training (`trex train`); the recipes with their own "
                "batch source or gradient clipping run with pp=1"
            )
        self.config = load_config(job.model)
        for key, value in job.config_overrides.items():
            setattr(self.config, key, value)
        self.schedule_name = job.schedule or default_schedule(plan.vpp)
        check_schedule(self.schedule_name, plan.pp, plan.vpp, plan.microbatches)
        self.split = split_for_plan(
            plan, self.config.num_hidden_layers, placement_of(self.schedule_name), job.stage_split or None
        )
        check_pipeline_model(self.config, self.split)
        model = build_model(self.config, seed=job.seed)
        if job.init_dir:
            load_weights(model, Path(job.init_dir))
        model.train()
        self.global_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        self.source = self.batch_source()
        meshes_rank = dist.get_rank() // plan.stage_ranks  # pp is the outermost mesh dim
        part = keep_rank_part(model, self.split, meshes_rank)
        # ZeRO-3: each chunk module is an FSDP root (its layers sharded first - not under the V schedules -, then
        # the chunk, which holds the embedding or the head) - the module the engine's stage runs, so its schedule
        # defers the gradient reduce-scatters to the step's last backward (`perform_reduce_grad`), as torchtitan
        # wraps model parts.
        chunks = build_chunks(part, self.split, meshes_rank) if plan.zero == 3 else None
        self.applied = parallelize(
            part,
            plan,
            self.device,
            lr=job.lr,
            weight_decay=job.weight_decay,
            optimizer=job.optimizer,
            fsdp_roots=chunks,
            # the split backward's weight pass writes no gradient into a layer sharded as its own FSDP unit
            # inside a chunk (`limits.check_pipeline_job`): under ZB-V / DualPipeV the chunk is the one unit
            fsdp_layers=self.schedule_name not in V_SCHEDULES,
        )
        self.model = part
        self.stage_rank = self.applied.meshes.pipeline.get_local_rank()
        if self.stage_rank != meshes_rank:
            raise TrexError(f"internal: pipeline rank {self.stage_rank} differs from the layout's {meshes_rank}")
        self.chunks = chunks or build_chunks(part, self.split, self.stage_rank)
        self.tp_mesh = self.applied.meshes.world["tp"] if plan.tp > 1 else None
        if self.tp_mesh is not None:
            for chunk in self.chunks:
                chunk.sequence_parallel_on(self.tp_mesh)
        runners = list(self.chunks)
        if job.compile:
            runners = [self.compile_chunk(chunk) for chunk in self.chunks]
            if plan.ep > 1:  # trex.compile selects the local "trex" experts op; these experts are sharded
                from trex.runtime.expert_parallel import route_through_ep

                for chunk in self.chunks:
                    route_through_ep(chunk)
        self.runners = runners
        self.forward = runners[0]
        self.holds_first = any(c.chunk.first for c in self.chunks)
        self.holds_last = any(c.chunk.last for c in self.chunks)
        self.clock = StageClock()
        group = self.applied.meshes.pipeline.get_group()
        stages = [
            timed_stage(self.clock, runner, chunk.chunk.index, len(self.split.chunks), self.device, group=group)
            for runner, chunk in zip(runners, self.chunks)
        ]
        self.pipe = build_schedule(self.schedule_name, stages, plan.microbatches, self.micro_batch_loss)
        self.normalizer = 1
        self.step_records: list[tuple[float, list, float]] = []  # (step seconds, intervals, start) per step
        self.step_comms: list[list] = []  # per step: the engine's message posts and waits (`timing.p2p_timed`)
        self.count_activations = True
        from trex.runtime.pipeline.activations import LiveActivations

        self.live_activations = LiveActivations(part)
        self.calibration = self.calibrate() if job.calibrate_first else None

    def compile_chunk(self, chunk):
        """`trex.compile` on one chunk: its own captured graph, passes and, under TREX_DUMP, its own dump
        directory (`<TREX_DUMP>/rank<R>-chunk<C>`). Every chunk shares `ChunkModule.forward`'s code, so
        Dynamo would take the second chunk (other input shapes) as a recompile and make its shapes
        dynamic; training shapes are static, so automatic dynamic shapes are off in this process."""
        import os

        import trex

        torch._dynamo.config.automatic_dynamic_shapes = False
        root = os.environ.get("TREX_DUMP")
        where = Path(root) / f"rank{dist.get_rank()}-chunk{chunk.chunk.index}" if root else None
        return trex.compile(chunk, dump_dir=where)

    def micro_batch_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Token-sum cross-entropy over the global batch's scored tokens (the 1-rank run's loss)."""
        with self.clock.busy("L", self.split.chunks[-1].index, -1):
            return self.token_sum_loss(logits, targets) / self.normalizer

    def token_sum_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy summed over the scored tokens. Under tp the last chunk hands out this rank's vocabulary
        shard of the logits: they are wrapped back into the vocabulary-sharded DTensor and the loss runs on the
        shards (`loss_parallel`, entered around the whole step so the engine's backward of the loss uses it);
        the loss, the same on every tp rank, comes back as a plain tensor."""
        if self.tp_mesh is not None:
            from torch.distributed.tensor import DTensor, Shard

            logits = DTensor.from_local(logits, self.tp_mesh, [Shard(logits.dim() - 1)], run_check=False)
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), reduction="sum", ignore_index=IGNORE_INDEX
        )
        return loss.to_local() if self.tp_mesh is not None else loss

    # -- one step -------------------------------------------------------------------------------
    def train_step(self, step: int) -> float:
        from trex.runtime.data import as_global_batch
        from trex.runtime.optimization import set_learning_rate

        batch = as_global_batch(self.source.global_batch(step)).to(self.device)
        if batch.position_ids is not None:
            raise TrexError("pipeline parallelism runs unpacked sequences (no position_ids); use pp=1 for packed data")
        rows = batch.replica_rows(self.applied.replica_index, self.applied.replicas)
        self.normalizer = max(1, int((batch.targets != IGNORE_INDEX).sum()))
        self.tokens_trained.append(self.normalizer)
        losses: list[torch.Tensor] = []
        autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16) if self.plan.precision == "bf16" else nullcontext()
        )
        counting = self.live_activations.counting() if self.count_activations else nullcontext()
        args = (rows.inputs,) if self.holds_first else ()
        self.clock.take()
        start = time.perf_counter()
        comms: list = []
        with counting, autocast, collector_paused(), self.applied.loss_context(), p2p_timed(comms):
            self.pipe.step(*args, target=rows.targets, losses=losses)
        self.step_records.append((time.perf_counter() - start, self.clock.take(), start))
        self.step_comms.append(comms)
        self.applied.optimizer.reduce_gradients()
        if self.job.gather_gradients and self.gathered is None:
            self.gathered = self.gather_full_gradients()
        lr = self.schedule.learning_rate(step)
        self.learning_rates.append(lr)
        set_learning_rate(self.applied.optimizer.optimizer, lr)
        self.applied.optimizer.step()
        local = torch.zeros((), dtype=torch.float64, device=self.device)
        # only the last stage's ranks hold losses: the world sum is the global batch's (one tp rank counts it)
        if self.tp_mesh is None or self.tp_mesh.get_local_rank() == 0:
            for loss in losses:
                local += loss.detach().double()
        dist.all_reduce(local)
        return float(local)

    def gather_full_gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's reduced gradient, whole, from every stage (a collective over the world)."""
        mine = {name: grad.detach().cpu() for name, grad in self.applied.full_gradients().items()}
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        merged: dict[str, torch.Tensor] = {}
        for part in everyone:
            merged.update(part)
        return merged

    # -- results --------------------------------------------------------------------------------
    def run(self):
        result = super().run()
        # Activations: the peak of the saved bytes alive at once over a step (all micro-batches in flight).
        result.memory_bytes["activations"] = self.live_activations.peak_bytes
        parts = ("parameters", "gradients", "optimizer_states", "activations")
        result.memory_bytes["total"] = sum(result.memory_bytes[k] for k in parts)
        result.pipeline = self.report()
        return result

    def report(self) -> dict:
        """Schedule, split and bubble (measured from every rank's intervals; predicted by the cost model with
        the schedule runtime's per-action costs, measured by a calibration run of the same schedule)."""
        from trex.runtime.pipeline.bubble import measured_bubble, predicted_bubble

        records = self.step_records[1:] if len(self.step_records) > 1 else self.step_records  # step 1: warm-up
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (self.stage_rank, records))
        measured = measured_bubble(everyone, len(self.split.chunks))
        comms = self.step_comms[1:] if len(self.step_comms) > 1 else self.step_comms
        split: list = [None] * dist.get_world_size()
        mine = comm_split([(seconds, intervals, log) for (seconds, intervals, _), log in zip(records, comms)])
        dist.all_gather_object(split, (self.stage_rank, mine))
        measured["step_split"] = [part for _, part in sorted(dict(split).items())]
        training = (records[0][2], records[-1][2] + records[-1][0]) if records else (float("nan"),) * 2
        calibration = self.calibration or self.calibrate()
        model_times, calibrated, task_times, overheads, notes = (
            calibration["model_times"],
            calibration["calibrated"],
            calibration["task_times"],
            calibration["overheads"],
            calibration["notes"],
        )

        def predict(times: dict | None, measured_times: dict | None = None) -> dict:
            return predicted_bubble(
                self.pipe,
                self.schedule_name,
                self.split,
                self.plan.microbatches,
                measured_times,
                task_times=times,
                overheads=overheads,
                cores=self.pipeline_cores(),
            )

        predicted = predict(task_times, measured["task_seconds"])
        if calibrated and model_times:  # the same simulation with the cost model's FLOP-priced task times
            predicted["predicted_with_cost_model_tasks"] = predict(model_times)["predicted"]
        opened = calibration["calibrated_first_in_turn"]
        if opened and task_times is calibrated:
            # the model before RESULTS 14.15 on the same run: each rank's first chunk timed as it opens its turn
            predicted["predicted_first_in_turn"] = predict(opened)["predicted"]
        elif opened:  # ranks sharing cores keep that calibration (`calibrate`); the warm passes' prediction beside
            predicted["predicted_first_in_turn"] = predicted["predicted"]
            predicted["predicted_warm_tasks"] = predict(calibrated)["predicted"]
        if calibration["calibrated_concurrent"]:  # every rank timing its chunks at once, as the training runs them
            predicted["predicted_concurrent_tasks"] = predict(calibration["calibrated_concurrent"])["predicted"]
        out = {
            "schedule": self.schedule_name,
            "pp": self.split.pp,
            "vpp": self.split.vpp,
            "microbatches": self.plan.microbatches,
            "layers_per_chunk": list(self.split.layers_per_chunk),
            "placement": self.split.placement,
            "chunk_ranks": [c.rank for c in self.split.chunks],
            "split": self.split.describe(),
            "bubble_fraction": {"measured": measured["bubble"], **predicted},
            "measured": measured,
            "runtime_overheads": overheads.to_dict(),
            "predicted_task_seconds": model_times,
            "calibrated_task_seconds": calibrated,
            "calibrated_task_seconds_first_in_turn": calibration["calibrated_first_in_turn"],
            "calibrated_task_seconds_concurrent": calibration["calibrated_concurrent"],
            "pipeline_cores": self.pipeline_cores(),
            # when each side ran (this rank's clock, perf_counter seconds): the measured steps and the calibration
            "measured_window_s": list(training),
            "calibration_window_s": list(calibration["window"]),
            "calibrated_first": self.calibration is not None,
        }
        if notes:
            out["prediction_note"] = "; ".join(notes)
        return out

    def calibrate(self) -> dict:
        """Everything the bubble prediction measures on the ranks (`calibrate_tasks`, `calibrate_runtime`), with
        the window it took. Runs after the training steps, or before them with `TrainJob.calibrate_first`: the
        chunks' gradients are restored by the task calibration, the runtime calibration runs null chunks, and the
        global RNG (the task calibration's output gradients) is restored here, so the training run is the same
        either way."""
        from trex.runtime.pipeline.bubble import chunk_task_times

        start = time.perf_counter()
        with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else None):
            chunks, why = self.predicted_chunks()
            model_times = chunk_task_times(chunks) if chunks else None
            calibrated, opened, concurrent, calibration_note = self.calibrate_tasks()
            # Where each rank has its own core the training's passes run warm (a rank waits a few ms at most
            # between actions), so the samples after the turn's opening one price them (RESULTS 14.15). Where the
            # ranks share cores (pp=4 on 2 cores: time slices) a rank resumes after another rank held its core,
            # as the opening sample does; whether that is the better price there was not measured, so those
            # ranks keep the calibration of RESULTS 14.14 (the first chunk timed as it opens its turn).
            shared = self.pipeline_cores() is not None
            task_times = (opened if shared else calibrated) or model_times
            overheads = self.calibrate_runtime(task_times)
        return {
            "model_times": model_times,
            "calibrated": calibrated,
            "calibrated_first_in_turn": opened,
            "calibrated_concurrent": concurrent,
            "task_times": task_times,
            "overheads": overheads,
            "notes": [n for n in (calibration_note, why if not calibrated else "") if n],
            "window": (start, time.perf_counter()),
        }

    def calibrate_runtime(self, task_times: dict | None = None):
        """The schedule runtime's per-action work, the link and the host's slowdowns, measured on this pipeline
        group by the same schedule over null chunks (`calibration.measure_overheads`), which burn `task_times`
        (the calibrated or the cost model's seconds per task) so the slowdowns are measured in those units."""
        from trex.runtime.pipeline.calibration import measure_overheads

        return measure_overheads(
            self.schedule_name,
            self.split,
            self.plan.microbatches,
            (self.plan.mbs, self.plan.seq // self.plan.tp, self.config.hidden_size),
            self.config.vocab_size,
            self.applied.meshes.pipeline.get_group(),
            self.device,
            task_times=task_times,
        )

    def calibrate_tasks(self) -> tuple[dict | None, dict | None, dict | None, str]:
        """Each chunk's F, B, I and W seconds measured on the chunk itself with the engine's own backward
        functions (`task_calibration.measure_stage_tasks`), and the same with each rank's first chunk timed by
        the sample that opens its turn (the calibration before RESULTS 14.15); (None, None, why) where that cannot
        run: ZeRO-3 chunks (FSDP2's hooks would all-gather, reduce-scatter and reshard around the lone passes)."""
        from trex.runtime.data import as_global_batch
        from trex.runtime.pipeline.schedules import V_SCHEDULES
        from trex.runtime.pipeline.task_calibration import full_backward_split, measure_stage_tasks_first_in_turn

        if self.plan.zero == 3:
            return None, None, None, "cost-model task times (the chunks' own passes are not timed alone under zero=3)"
        batch = as_global_batch(self.source.global_batch(0)).to(self.device)
        rows = batch.replica_rows(self.applied.replica_index, self.applied.replicas)
        mbs = self.plan.mbs
        ids, targets = rows.inputs[:mbs], rows.targets[:mbs]
        normalizer = max(1, int((batch.targets != IGNORE_INDEX).sum()))
        tokens = ids.shape[1] // self.plan.tp  # a chunk's input under tp: this rank's sequence shard
        hidden = (mbs, tokens, self.config.hidden_size)
        if self.config.model_type == "deepseek_v4":
            hidden = (mbs, tokens, self.config.hc_mult, self.config.hidden_size)
        generator = torch.Generator().manual_seed(self.job.seed)

        def make_input(module) -> torch.Tensor:
            if module.chunk.first:
                return ids
            return torch.randn(hidden, generator=generator).to(self.device).requires_grad_(True)

        def loss_of(logits: torch.Tensor) -> torch.Tensor:
            return self.token_sum_loss(logits, targets) / normalizer

        def autocast():
            if self.plan.precision == "bf16":
                return torch.autocast(self.device.type, dtype=torch.bfloat16)
            return nullcontext()

        def context():  # each timed pass runs as in the step: autocast, and the vocabulary-parallel loss under tp
            from contextlib import ExitStack

            stack = ExitStack()
            stack.enter_context(autocast())
            stack.enter_context(self.applied.loss_context())
            return stack

        times, opened, concurrent = measure_stage_tasks_first_in_turn(
            self.chunks,
            self.runners,
            make_input,
            loss_of,
            self.schedule_name in V_SCHEDULES,
            self.stage_rank,
            self.split.pp,
            len(self.split.chunks),
            self.applied.meshes.pipeline.get_group(),
            context=context,
            concurrent=self.job.calibrate_concurrent,
        )
        together = full_backward_split(concurrent) if concurrent else None
        return full_backward_split(times), full_backward_split(opened), together, ""

    def predicted_chunks(self):
        """The cost model's per-chunk times for this run (`cost_model.step.estimate_step` on the `cpu` target
        with the split that runs); (None, why) when it cannot price the model."""
        import dataclasses

        from trex.cost_model.catalog import get_cluster
        from trex.cost_model.model_spec import spec_from_config
        from trex.cost_model.step import estimate_step

        try:
            spec = spec_from_config(self.config, getattr(self.config, "model_type", "model"))
            spec = dataclasses.replace(spec, mtp_layers=())  # transformers builds no MTP layers
            plan = dataclasses.replace(self.plan, layers_per_chunk=tuple(self.split.layers_per_chunk))
            if plan.optimizer == "auto":
                plan = dataclasses.replace(plan, optimizer=self.job.optimizer)
            estimate = estimate_step(spec, get_cluster("cpu", dist.get_world_size()), plan)
        except TrexError as error:
            return None, f"relative task times (the cost model could not price the chunks: {error})"
        return estimate.chunks, ""

    def pipeline_cores(self) -> float | None:
        """Cores one pipeline group's ranks share when every rank runs on this host (CPU ranks): the host's
        cores split over the data-parallel copies of the pipeline; None when there is a core per rank."""
        import os

        if self.device.type != "cpu":
            return None
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        world = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        share = cores * self.split.pp / world
        return share if share < self.split.pp else None

    def captured_ops(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for runner in self.runners:
            session = getattr(runner, "trex", None)
            for graph in session.graphs if session is not None else []:
                module = graph.joint or graph.forward
                for node in module.graph.nodes if module is not None else []:
                    name = str(node.target)
                    if node.op == "call_function" and ("moe_experts" in name or "c10d" in name):
                        counts[name] = counts.get(name, 0) + 1
        return counts

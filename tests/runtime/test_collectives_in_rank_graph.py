"""A `--compile`d rank captures its whole micro-batch program (`runtime.rank_loss.RankLoss`): the vocabulary-parallel
loss's all-reduces are nodes of the dumped forward graph (tp), the gradient reductions of ZeRO-0/1/2 and of ep's
data-parallel replicas nodes of the dumped backward graph, every one priced by the cost model (`node.meta["cost"]`),
nothing reduced after the backward; and the losses and gathered gradients are the 1-rank run's.

tests/runtime/test_gradient_reduction_in_graph.py checks the same reductions in an eager rank's autograd graph."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from test_distributed_equivalence import SHAPE, STEPS, assert_same_run, reference

from trex.runtime.launcher import launch_function

MODEL = "tiny-qwen3-moe"
PLANS = ["tp=2", "zero=1", "zero=2", "ep=2"]
ALL_REDUCE, REDUCE_SCATTER = "_c10d_functional.all_reduce.default", "_c10d_functional.reduce_scatter_tensor.default"


def _collectives(module: torch.fx.GraphModule) -> dict[str, list]:
    """Functional-collective nodes of `module` by op, each with its cost (None if the cost model gave none)."""
    from trex.cost_model.annotate import annotate

    annotate(module, "cpu")
    found: dict[str, list] = {}
    for node in module.graph.nodes:
        if node.op == "call_function" and "_c10d_functional" in str(node.target):
            found.setdefault(str(node.target), []).append(node.meta.get("cost"))
    return found


def _compiled_ranks(plans: list[str], dump_root: str) -> list[dict]:
    """On each of 2 gloo ranks, each plan trained for STEPS steps with --compile, dumping to dump_root/plan/rank<r>."""
    import torch.distributed as dist

    from trex.runtime.data_parallel import _reducible_in_graph
    from trex.runtime.trainer import ProgressFile, Trainer, TrainJob

    dist.init_process_group("gloo")
    rank, out = dist.get_rank(), []
    try:
        for plan in plans:
            os.environ["TREX_DUMP"] = f"{dump_root}/{plan}/rank{rank}"
            job = TrainJob.create(
                MODEL, plan, 2, **SHAPE, steps=STEPS, gather_gradients=True, verbose=False, compile=True
            )
            trainer = Trainer(job, torch.device("cpu"), ProgressFile(None, rank))
            after = _watch_reductions_outside_the_graph()
            try:
                result = asdict(trainer.run())
            finally:
                after.restore()
            graphs = trainer.forward.trex.graphs
            slots = getattr(trainer.applied.optimizer, "slots", [])
            result.update(
                forward=[_collectives(g.forward) for g in graphs],
                backward=[_collectives(g.backward) for g in graphs],
                reducible=sum(1 for s in slots if _reducible_in_graph(s)),
                after=after.calls,
            )
            out.append(result)
    finally:
        os.environ.pop("TREX_DUMP", None)
        dist.destroy_process_group()
    return out


class _watch_reductions_outside_the_graph:
    """Records a blocking gradient reduction (a c10d call: a tp hook in the backward, `reduce_gradients` after it) and a
    DTensor redistribution inside `reduce_gradients` (a Partial gradient summed after the backward). The step's
    loss report (a 0-dim all-reduce over the replicas) is not a gradient and is left out."""

    def __init__(self):
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        from trex.runtime.data_parallel import DataParallelAdamW

        self.calls: list[str] = []
        self.saved = [
            (dist, "all_reduce"),
            (dist, "reduce_scatter_tensor"),
            (DTensor, "redistribute"),
            (DataParallelAdamW, "reduce_gradients"),
        ]
        self.saved = [(owner, name, getattr(owner, name)) for owner, name in self.saved]
        reduce, scatter, redistribute, reduce_gradients = (call for _, _, call in self.saved)
        reducing = []

        def blocking(name, call):
            def wrapper(tensor, *args, **kwargs):
                if tensor.dim() > 0:
                    self.calls.append(name)
                return call(tensor, *args, **kwargs)

            return wrapper

        def redistributing(tensor, *args, **kwargs):
            if reducing:
                self.calls.append("redistribute")
            return redistribute(tensor, *args, **kwargs)

        def reducing_gradients(optimizer):
            reducing.append(True)
            try:
                return reduce_gradients(optimizer)
            finally:
                reducing.pop()

        dist.all_reduce = blocking("all_reduce", reduce)
        dist.reduce_scatter_tensor = blocking("reduce_scatter", scatter)
        DTensor.redistribute = redistributing
        DataParallelAdamW.reduce_gradients = reducing_gradients

    def restore(self) -> None:
        for owner, name, call in self.saved:
            setattr(owner, name, call)


def _dumped(directory: Path, name: str, op: str) -> int:
    """How many calls of `op` the dumped `name`.py graphs under `directory` hold (every captured graph)."""
    return sum(path.read_text().count(f"torch.ops.{op}(") for path in sorted(directory.glob(f"graph_*/{name}.py")))


@pytest.mark.slow
def test_compiled_ranks_hold_the_loss_and_gradient_collectives_in_their_graphs(tmp_path):
    ref = reference(MODEL)
    results = launch_function(_compiled_ranks, (PLANS, str(tmp_path)), 2)
    for rank, runs in results.items():
        by_plan = dict(zip(PLANS, runs))
        for plan, run in by_plan.items():
            assert_same_run(run, ref, f"{plan} compiled, rank {rank}")
            for graphs in (run["forward"], run["backward"]):
                for found in graphs:
                    for op, costs in found.items():  # every collective node priced
                        assert all(c is not None and c.priced and (c.time_s > 0 or "wait" in op) for c in costs), (
                            plan,
                            op,
                        )
            assert run["after"] == [], (plan, run["after"])  # nothing reduced outside the graph
        dump = {plan: tmp_path / plan / f"rank{rank}" for plan in PLANS}
        # tp=2: the loss's two all-reduces (row maxima; sums of exponentials with the target logits) are the
        # forward's only all-reduces (sequence parallelism all-gathers and reduce-scatters), in the graph and its dump
        tp = by_plan["tp=2"]
        # (one graph per micro-batch kind: the last one reads the parameters through their reductions)
        assert [len(f.get(ALL_REDUCE, [])) for f in tp["forward"]] == [2] * len(tp["forward"]), tp["forward"]
        assert _dumped(dump["tp=2"], "forward", ALL_REDUCE) == 2 * len(tp["forward"])
        # ZeRO-1 (two micro-batches per replica): the last one's backward all-reduces every reducible gradient
        # (the first accumulates locally); ZeRO-2: every backward reduce-scatters each one. ep=2 (dp=2 dense
        # replicas, one expert replica): the dense gradients' all-reduce.
        for plan, op in (("zero=1", ALL_REDUCE), ("zero=2", REDUCE_SCATTER), ("ep=2", ALL_REDUCE)):
            run = by_plan[plan]
            assert run["reducible"] > 0
            counts = sorted(len(b.get(op, [])) for b in run["backward"])
            assert counts[-1] == run["reducible"], (plan, counts, run["reducible"])
            assert _dumped(dump[plan], "backward", op) == sum(counts), plan


def _vocab_parallel_loss_and_gradient() -> tuple[float, float]:
    """On each of 2 gloo ranks: the vocabulary-parallel loss of this rank's half of some logits (float64, one target
    ignored) against `F.cross_entropy` of the whole; returns (loss error, this half's gradient error)."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from trex.runtime.vocab_parallel import vocab_parallel_cross_entropy

    dist.init_process_group("gloo")
    try:
        rank, half = dist.get_rank(), 7
        generator = torch.Generator().manual_seed(0)
        logits = torch.randn(12, 2 * half, generator=generator, dtype=torch.float64) * 4
        targets = torch.randint(0, 2 * half, (12,), generator=generator)
        targets[3] = -100
        whole = logits.clone().requires_grad_()
        want = F.cross_entropy(whole, targets, reduction="sum")
        (3 * want).backward()
        mine = logits[:, rank * half : (rank + 1) * half].clone().requires_grad_()
        got = vocab_parallel_cross_entropy(mine, targets, rank * half, dist.group.WORLD.group_name)
        (3 * got).backward()
        expected = whole.grad[:, rank * half : (rank + 1) * half]
        return abs(float(got.detach() - want.detach())), float((mine.grad - expected).abs().max())
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_cross_entropy_equals_the_whole_vocabulary_loss_and_gradient():
    for rank, (loss_error, grad_error) in launch_function(_vocab_parallel_loss_and_gradient, (), 2).items():
        assert loss_error < 1e-12 and grad_error < 1e-12, (rank, loss_error, grad_error)

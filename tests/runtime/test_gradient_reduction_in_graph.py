"""ZeRO-0/1/2 gradient reductions are issued by the backward of the rank's own graph (`ReducedGradient`, functional
collectives), not by the optimizer afterwards; the losses and gradients of those plans equal the 1-rank run
(tests/runtime/test_distributed_equivalence.py runs them)."""

from __future__ import annotations

import pytest
import torch


def _reductions_of_one_step(plan_text: str) -> dict:
    """On each of 2 gloo ranks: one training step of tiny Qwen3-MoE under `plan_text`, two micro-batches;
    which reduction nodes the last micro-batch's autograd graph holds, and which collectives ran where."""
    import torch.distributed as dist

    from trex.models import build_model, load_config
    from trex.runtime.data_parallel import _reducible_in_graph, through_reductions
    from trex.runtime.run_plan import resolve_plan

    config = load_config("tiny-qwen3-moe")
    plan = resolve_plan(plan_text, config, dist.get_world_size(), seq=8, gbs=4, mbs=1)
    from trex.runtime.parallelize import parallelize

    applied = parallelize(build_model(config, seed=0), plan, torch.device("cpu"), lr=1e-3, weight_decay=0.0)
    issued_after: list[str] = []
    original = dist.all_reduce, dist.reduce_scatter_tensor
    dist.all_reduce, dist.reduce_scatter_tensor = (  # a tp hook (blocking c10d) during the backward would show here
        lambda *a, **k: (issued_after.append("all_reduce in backward"), original[0](*a, **k))[1],
        lambda *a, **k: (issued_after.append("reduce_scatter in backward"), original[1](*a, **k))[1],
    )

    def counting(name, call):
        def wrapper(*args, **kwargs):
            issued_after.append(name)
            return call(*args, **kwargs)

        return wrapper

    torch.manual_seed(dist.get_rank() if plan.tp == 1 else 0)  # tp peers read the same tokens
    nodes: list[str] = []
    for last in (False, True):
        ids = torch.randint(0, config.vocab_size, (1, 8))
        parameters = through_reductions(applied.gradient_reductions(last))
        logits = torch.func.functional_call(applied.model, parameters, (), {"input_ids": ids}, strict=False).logits
        loss = logits.float().logsumexp(-1).sum()
        if last:
            seen, stack = set(), [loss.grad_fn]
            while stack:
                node = stack.pop()
                if node is None or node in seen:
                    continue
                seen.add(node)
                nodes.append(type(node).__name__)
                stack.extend(next_node for next_node, _ in node.next_functions)
        loss.backward()
    from torch.distributed.tensor import DTensor

    redistribute = DTensor.redistribute
    dist.all_reduce, dist.reduce_scatter_tensor = (
        counting("all_reduce", original[0]),
        counting("reduce_scatter", original[1]),
    )
    DTensor.redistribute = counting("redistribute", redistribute)  # a Partial DTensor gradient summed afterwards
    try:
        applied.optimizer.reduce_gradients()
    finally:
        dist.all_reduce, dist.reduce_scatter_tensor = original
        DTensor.redistribute = redistribute
    reducible = sum(1 for slot in applied.optimizer.slots if _reducible_in_graph(slot))
    grads = {s.name: s.master.grad.clone() for s in applied.optimizer.slots}
    return {
        "in_graph": nodes.count("ReducedGradientBackward"),
        "reducible": reducible,
        "issued_after": issued_after,
        "grads": grads,
        "partial": [s.name for s in applied.optimizer.slots if s.home.partial_over is not None],
        "dtensors": sum(1 for s in applied.optimizer.slots if isinstance(s.param, DTensor)),
    }


def _stages(plans: tuple[str, ...]) -> list[dict]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        return [_reductions_of_one_step(plan) for plan in plans]
    finally:
        dist.destroy_process_group()


def _check(plans: tuple[str, ...], nproc: int) -> None:
    from trex.runtime.launcher import launch_function

    results = launch_function(_stages, (plans,), nproc)
    for plan, rank0, rank1 in zip(plans, results[0], results[1]):
        zero = 2 if "zero=2" in plan else 1
        assert rank0["reducible"] > 0
        # every parameter's reduction hangs off the last micro-batch's graph, none is issued after the backward
        assert rank0["in_graph"] == rank0["reducible"], zero
        assert rank0["issued_after"] == [], (zero, rank0["issued_after"][:3])
        if zero == 1:  # the summed gradient is the same on both replicas (each keeps its shard for the optimizer)
            for name, grad in rank0["grads"].items():
                assert grad.shape == rank1["grads"][name].shape, name
        if plan == "tp=2":  # a tp-only plan: the DTensor parameters (no replicas) are reduced in the graph too
            assert rank0["dtensors"] > 0
        if plan.startswith("tp=2"):  # ranks 0 and 1 are tp peers: each one's part summed, both hold the whole
            assert rank0["partial"] and rank0["partial"] == rank1["partial"]
            for name in rank0["partial"]:
                assert torch.equal(rank0["grads"][name], rank1["grads"][name]), name


def test_zero_1_and_2_and_tp_partial_reductions_are_nodes_of_the_backward_graph():
    """dp=2 under ZeRO-1 and ZeRO-2, and tp=2: the tp-replicated parameters (norms, q/k norms, router) whose
    gradient each tp rank holds only a part of are summed by the same node, not by a blocking hook; at tp=2
    (no replicas) the DTensor parameters' Partial gradients are redistributed by that node, not afterwards."""
    _check(("zero=1", "zero=2", "tp=2"), 2)


@pytest.mark.slow  # 4 gloo ranks (~1 min)
def test_dtensor_parameters_reductions_are_nodes_of_the_backward_graph_under_tp_and_dp():
    """tp=2 x dp=2: Qwen3-MoE's DTensor parameters (tensor-parallel styles) are reduced over dp - and a Partial
    gradient redistributed over tp - by the same node, under ZeRO-1 and ZeRO-2."""
    _check(("tp=2,zero=1", "tp=2,zero=2"), 4)

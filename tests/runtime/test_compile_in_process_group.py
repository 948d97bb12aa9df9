"""trex.compile(model, plan=...) with degrees > 1 inside an initialised process group (what torchrun gives).

Without a process group the plan is refused naming torchrun; on 2 gloo ranks a tp=2 plan of tiny
DeepSeek-V3 is applied before capture, the captured graph holds the tensor-parallel collectives as
functional-collective nodes priced by the cost model, and one training step gives the 1-rank loss.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import trex
from trex.cost_model.model_spec import spec_from_config
from trex.errors import TrexError
from trex.models import build_model, tiny_config
from trex.plan import Plan
from trex.planner import plan_parallel
from trex.runtime.launcher import launch_function

FAMILY = "deepseek-v3"
SEQ, ROWS = 16, 2


def plan_with(devices: int, **degrees) -> Plan:
    spec = spec_from_config(tiny_config(FAMILY), f"tiny-{FAMILY}")
    one = plan_parallel(spec, "cpu", 1, seq=SEQ, gbs=ROWS, baseline=None).best
    parallel = dataclasses.replace(one.parallel, **degrees, zero=0, recompute="none", mbs=1)
    return dataclasses.replace(one, devices=devices, parallel=parallel)


def test_a_multi_process_plan_without_a_process_group_names_torchrun():
    with pytest.raises(TrexError, match=r"needs 2 processes .*torchrun --nproc-per-node 2"):
        trex.compile(build_model(tiny_config(FAMILY)), plan=plan_with(2, tp=2, dp=1))


def one_step(model, forward, applied, ids) -> float:
    """One training step: next-token loss over this rank's rows, normalised by the global batch's tokens."""
    rows = ids if applied is None else ids.chunk(applied.replicas)[applied.replica_index]
    logits = forward(input_ids=rows[:, :-1], use_cache=False).logits
    context = applied.loss_context() if applied is not None else torch.enable_grad()
    with context:
        loss = F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten(), reduction="sum")
        loss = loss / ids[:, 1:].numel()
        loss.backward()
    value = (loss.full_tensor() if hasattr(loss, "full_tensor") else loss).detach()
    if applied is not None and applied.replica_group is not None:  # the global batch's loss: sum over replicas
        import torch.distributed as dist

        dist.all_reduce(value, group=applied.replica_group)
    return float(value)


def compiled_rank(plans: list[Plan]) -> list[dict]:
    import torch.distributed as dist

    from trex.cost_model.annotate import annotate

    dist.init_process_group("gloo")
    out = []
    try:
        for plan in plans:
            model = build_model(tiny_config(FAMILY), seed=0)
            compiled = trex.compile(model, plan=plan, backend="eager")
            ids = torch.randint(0, model.config.vocab_size, (ROWS, SEQ + 1), generator=torch.Generator().manual_seed(1))
            loss = one_step(model, compiled, compiled.trex.applied, ids)
            found, priced = {}, {}
            for graph in compiled.trex.graphs:
                module = graph.joint or graph.forward
                annotate(module, "cpu")
                for node in module.graph.nodes:
                    if node.op != "call_function":
                        continue
                    name = str(node.target)
                    parts = name.split(".")  # torch ops print as namespace.op.overload; python callables have no dots
                    short = parts[-2] if len(parts) > 1 else name
                    expert_parallel = short in (
                        "ep_exchange",
                        "ep_counts",
                        "ep_experts_local",
                        "ep_experts_local_input_backward",
                        "ep_experts_local_weight_backward",
                    )
                    if not ("c10d_functional" in name or expert_parallel):
                        continue
                    found[short] = found.get(short, 0) + 1
                    cost = node.meta.get("cost")
                    if cost is not None and cost.priced and (cost.time_s > 0 or short == "wait_tensor"):
                        priced[short] = priced.get(short, 0) + 1
            out.append({"loss": loss, "found": found, "priced": priced})
    finally:
        dist.destroy_process_group()
    return out


@pytest.mark.slow
def test_tp_and_ep_plans_compile_on_two_ranks_with_their_collectives_priced_in_the_graph():
    model = build_model(tiny_config(FAMILY), seed=0)
    ids = torch.randint(0, model.config.vocab_size, (ROWS, SEQ + 1), generator=torch.Generator().manual_seed(1))
    want = one_step(model, model, None, ids)
    plans = [plan_with(2, tp=2, dp=1), plan_with(2, ep=2, dp=2)]
    results = launch_function(compiled_rank, (plans,), 2)
    layers = model.config.num_hidden_layers
    moe_layers = layers - model.config.first_k_dense_replace
    for rank, (tp, ep) in results.items():
        for label, result in (("tp=2", tp), ("ep=2", ep)):
            assert math.isclose(result["loss"], want, rel_tol=1e-5), (rank, label, result["loss"], want)
            assert result["priced"] == result["found"], (label, result)  # every collective node has a cost
        # tp: per layer, attention and the (dense or shared-expert) MLP all-gather the sequence in and
        # reduce-scatter it out; their backwards are the opposite collectives, in the same joint graph
        assert tp["found"].get("all_gather_into_tensor", 0) >= 4 * layers, tp["found"]
        assert tp["found"].get("reduce_scatter_tensor", 0) >= 4 * layers, tp["found"]
        # ep: per MoE layer a counts exchange, dispatch and combine exchanges (forward and backward: four), the
        # local experts forward and backward (data gradients and weight gradients: two nodes); every exchange
        # priced as an all-to-all on the EP group
        assert ep["found"].get("ep_exchange") == 4 * moe_layers, ep["found"]
        assert ep["found"].get("ep_counts") == moe_layers, ep["found"]
        assert ep["found"].get("ep_experts_local") == moe_layers, ep["found"]
        assert ep["found"].get("ep_experts_local_input_backward") == moe_layers, ep["found"]
        assert ep["found"].get("ep_experts_local_weight_backward") == moe_layers, ep["found"]

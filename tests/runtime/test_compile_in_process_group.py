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
    parallel = dataclasses.replace(one.parallel, **degrees, zero=0, recompute="none")
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
    value = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
    return float(value.detach())


def compiled_rank(plan: Plan) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        model = build_model(tiny_config(FAMILY), seed=0)
        compiled = trex.compile(model, plan=plan, backend="eager")
        ids = torch.randint(0, model.config.vocab_size, (ROWS, SEQ + 1), generator=torch.Generator().manual_seed(1))
        loss = one_step(model, compiled, compiled.trex.applied, ids)
        collectives, priced = {}, 0
        for graph in compiled.trex.graphs:
            module = graph.joint or graph.forward
            for node in module.graph.nodes:
                if node.op == "call_function" and "c10d_functional" in str(node.target):
                    name = str(node.target).split(".")[-2]
                    collectives[name] = collectives.get(name, 0) + 1
                    priced += "cost" in node.meta
        return {"loss": loss, "collectives": collectives, "priced": priced}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_tp_plan_compiles_on_two_ranks_with_its_collectives_in_the_graph():
    model = build_model(tiny_config(FAMILY), seed=0)
    ids = torch.randint(0, model.config.vocab_size, (ROWS, SEQ + 1), generator=torch.Generator().manual_seed(1))
    want = one_step(model, model, None, ids)
    results = launch_function(compiled_rank, (plan_with(2, tp=2, dp=1),), 2)
    for rank, result in results.items():
        assert math.isclose(result["loss"], want, rel_tol=1e-5), (rank, result["loss"], want)
        # per layer: attention and MLP all-gather the sequence in and reduce-scatter it out
        layers = model.config.num_hidden_layers
        assert result["collectives"].get("all_gather_into_tensor", 0) >= 2 * layers, result["collectives"]
        assert result["collectives"].get("reduce_scatter_tensor", 0) >= 2 * layers, result["collectives"]
        assert result["priced"] == sum(result["collectives"].values()) - result["collectives"].get("wait_tensor", 0)

"""reorder_comm on the distributed plans of a tiny DeepSeek-V3 over an emulated link (slow: 4 compiles).

EP (split dispatch / experts / combine nodes) and ZeRO-3 inside the graph, each compiled by trex with and
without the pass on 2 gloo ranks: the losses of two AdamW steps are identical with and without it and equal
to one process training the whole batch; with the pass the graph's collectives are rescheduled (decisions).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trex.models import build_model, tiny_config
from trex.runtime.launcher import launch_function

FAMILY, ROWS, SEQ = "deepseek-v3", 4, 16


def batch():
    model = build_model(tiny_config(FAMILY), seed=0)
    return torch.randint(0, model.config.vocab_size, (ROWS, SEQ + 1), generator=torch.Generator().manual_seed(1))


def train(model, forward, rows, ids, reduce=None, steps=2):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    losses = []
    for _ in range(steps):
        logits = forward(input_ids=rows[:, :-1], use_cache=False).logits
        loss = (
            F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten(), reduction="sum") / ids[:, 1:].numel()
        )
        loss.backward()
        if reduce is not None:
            reduce(model)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


def plans_rank(link: str) -> dict:
    import torch.distributed as dist

    import trex
    from trex.runtime import emulated_link
    from trex.runtime.data_parallel import shard_parameters_in_graph
    from trex.runtime.expert_parallel import route_through_ep, shard_experts

    dist.init_process_group(emulated_link.install(link))
    rank = dist.get_rank()
    ids = batch()
    mine = ids.chunk(2)[rank]
    out = {}

    for plan in ("ep", "zero3"):
        for label, passes in (("pass", None), ("no_pass", "-reorder_comm")):
            torch._dynamo.reset()
            model = build_model(tiny_config(FAMILY), seed=0)
            expert_names = set(shard_experts(model, dist.group.WORLD)) if plan == "ep" else set()
            if plan == "zero3":
                shard_parameters_in_graph(model, dist.group.WORLD)
            compiled = trex.compile(model, backend="eager", passes=passes)
            if plan == "ep":
                route_through_ep(model)

            def reduce(m, names=expert_names):
                for name, p in m.named_parameters():
                    if p.grad is not None and name not in names:
                        dist.all_reduce(p.grad)

            losses = train(model, compiled, mine, ids, reduce if plan == "ep" else None)
            for loss in losses:
                dist.all_reduce(loss)
            records = [r for g in compiled.trex.graphs for r in g.report.records if r.name == "reorder_comm" and r.ran]
            out[f"{plan}/{label}"] = {
                "losses": [float(x) for x in losses],
                "decisions": sorted({d.action for r in records for d in r.decisions}),
            }
    dist.destroy_process_group()
    return out


@pytest.mark.slow
def test_ep_and_in_graph_zero3_give_the_same_losses_with_and_without_reorder_comm():
    model = build_model(tiny_config(FAMILY), seed=0)
    ids = batch()
    want = [float(x) for x in train(model, model, ids, ids)]
    results = launch_function(plans_rank, ("alpha_us=500,gbps=0.5",), 2)
    for rank, result in results.items():
        for plan in ("ep", "zero3"):
            with_pass, without = result[f"{plan}/pass"], result[f"{plan}/no_pass"]
            assert with_pass["losses"] == without["losses"], (rank, plan, with_pass, without)
            assert with_pass["losses"] == pytest.approx(want, rel=1e-5), (rank, plan)
            assert "schedule" in with_pass["decisions"] and not without["decisions"]
        assert {"ep_one_chunk", "ep_split_pays"} & set(result["ep/pass"]["decisions"])

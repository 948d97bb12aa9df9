"""Expert-parallel layers run in micro-chunks (runtime.expert_parallel, `trex_ep_chunks`): the same loss and
gradients as one chunk and as one process holding every expert, on 2 gloo ranks; compiled, the graph holds one
dispatch / experts / combine set per chunk and reorder_comm reports the split it finds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trex.models import build_model, tiny_config
from trex.runtime.launcher import launch_function

FAMILY, ROWS, SEQ = "deepseek-v3", 4, 16


def _model():
    config = tiny_config(FAMILY)
    config.num_hidden_layers = 2  # one dense, one MoE layer
    return build_model(config, seed=0)


def _batch(vocab):
    return torch.randint(0, vocab, (ROWS, SEQ + 1), generator=torch.Generator().manual_seed(1))


def _loss(forward, rows, total):
    logits = forward(input_ids=rows[:, :-1], use_cache=False).logits
    return F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten(), reduction="sum") / total


def _rank(compiled: bool) -> dict:
    import torch.distributed as dist

    import trex
    from trex.integrations.transformers_moe import experts_modules
    from trex.runtime.expert_parallel import route_through_ep, shard_experts

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = {}
    for chunks in (1, 2):
        torch._dynamo.reset()
        model = _model()
        ids = _batch(model.config.vocab_size)
        experts = set(shard_experts(model, dist.group.WORLD))
        for _, module in experts_modules(model):
            module.trex_ep_chunks = chunks
        forward = model
        if compiled:
            forward = trex.compile(model, backend="eager")
            route_through_ep(model)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            loss = _loss(forward, ids.chunk(2)[rank], ids[:, 1:].numel())
        loss.backward()
        grads = {}
        for name, p in model.named_parameters():
            if name not in experts:
                dist.all_reduce(p.grad)
            grads[name] = p.grad.clone()
        dist.all_reduce(loss := loss.detach().clone())
        calls = sum(1 for e in profile.events() if e.name == "trex::ep_experts_local")
        out[chunks] = {"loss": float(loss), "grads": grads, "experts_calls": calls}
        if compiled:
            joint = forward.trex.graphs[0].joint
            out[chunks]["experts_nodes"] = sum(
                1 for n in joint.graph.nodes if "ep_experts_local.default" in str(n.target)
            )
            out[chunks]["decisions"] = sorted(
                {
                    d.action
                    for g in forward.trex.graphs
                    for r in g.report.records
                    if r.name == "reorder_comm"
                    for d in r.decisions
                }
            )
    dist.destroy_process_group()
    return out


def _check(results):
    model = _model()
    ids = _batch(model.config.vocab_size)
    want = _loss(model, ids, ids[:, 1:].numel())
    want.backward()
    experts_names = {
        n for n, _ in model.named_parameters() if "experts" in n and n.endswith(("gate_up_proj", "down_proj"))
    }
    for rank, result in results.items():
        for chunks in (1, 2):
            got = result[chunks]
            assert got["loss"] == pytest.approx(float(want.detach()), rel=1e-5), (rank, chunks)
            for name, p in model.named_parameters():
                grad = p.grad
                if name in experts_names:  # this rank holds half of the experts
                    grad = grad.chunk(2)[rank]
                torch.testing.assert_close(
                    got["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=f"{rank} {chunks} {name}"
                )
    return results


def test_two_micro_chunks_give_the_one_chunk_loss_and_gradients():
    results = _check(launch_function(_rank, (False,), 2))
    for result in results.values():  # the MoE layer really ran its local experts once per chunk
        assert result[2]["experts_calls"] == 2 * result[1]["experts_calls"] > 0


@pytest.mark.slow
def test_compiled_micro_chunks_hold_one_experts_node_per_chunk_and_reorder_comm_reports_the_split():
    results = _check(launch_function(_rank, (True,), 2))
    for result in results.values():
        assert result[2]["experts_nodes"] == 2 * result[1]["experts_nodes"] > 0
        assert "ep_chunks_applied" in result[2]["decisions"]
        assert "ep_chunks_applied" not in result[1]["decisions"]

"""The recompute pass: a budgeted save/recompute choice that keeps the program's meaning.

Every check runs the real partition (`default_partition` on the tagged joint graph) and the real
backward, and measures saved activations with `torch.autograd.graph.saved_tensors_hooks` (which
sees AOTAutograd's `ctx.save_for_backward`): what a budget promises is what the step holds.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from functorch.compile import aot_function, nop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._functorch.partitioners import default_partition
from torch.utils.checkpoint import CheckpointPolicy

import trex
from trex.models import build_model, tiny_config
from trex.pass_manager import PassContext, PassManager
from trex.passes.recompute import MemoryBudget, Recompute, RecomputeBudgetError
from trex.testing import programs

FP32 = {"rtol": 1e-5, "atol": 1e-5}


class SavedActivations:
    """Bytes of distinct storages saved for backward, leaving out the tensors the caller holds anyway."""

    def __init__(self, held: list[torch.Tensor]):
        self.held = {t.untyped_storage().data_ptr() for t in held}
        self.storages: dict[int, int] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.held:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def _compiled_with_budget(fn, budget, records: list):
    def partition(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        report = PassManager([Recompute(budget)]).run(joint, PassContext(phase="joint"))
        records.append(report.records[0])
        forward, backward = default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        records.append((forward, backward))
        records.append(joint)
        return forward, backward

    return aot_function(fn, fw_compiler=nop, bw_compiler=nop, partition_fn=partition)


def _loss_and_grads(fn, inputs):
    leaves = [i.detach().requires_grad_(True) for i in inputs]
    outputs = fn(*leaves)
    loss = sum((o.float() * (index + 1)).sum() for index, o in enumerate(outputs))
    loss.backward()
    return loss, [leaf.grad for leaf in leaves]


def _decision(record, action):
    return [d for d in record.decisions if d.action == action]


def test_memory_budget_reads_fractions_and_amounts():
    assert MemoryBudget.parse(0.4) == MemoryBudget(fraction=0.4)
    assert MemoryBudget.parse("3GiB") == MemoryBudget(bytes=3 * 2**30)
    assert MemoryBudget.parse("512 MB") == MemoryBudget(bytes=512 * 10**6)
    assert MemoryBudget.parse(4096) == MemoryBudget(bytes=4096)
    for bad in (0.0, 1.5, "lots", "3 parsecs", -2, True, [1]):
        with pytest.raises(RecomputeBudgetError, match="memory_budget"):
            MemoryBudget.parse(bad)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(max_steps=6, dtypes=(torch.float32,)), fraction=st.sampled_from((0.1, 0.3, 0.5, 0.8, 1.0)))
def test_random_joint_graphs_keep_loss_and_gradients_within_budget(program, fraction):
    inputs = program.make_inputs(seed=3)
    expected_loss, expected_grads = _loss_and_grads(program.run, inputs)
    records: list = []
    compiled = _compiled_with_budget(program.run, fraction, records)
    leaves = [i.detach().requires_grad_(True) for i in inputs]
    try:
        with SavedActivations(leaves) as saved:
            outputs = compiled(*leaves)
    except RecomputeBudgetError as error:  # the budget is below what any choice reaches: the minimum is named
        minimum = float(re.search(r"use memory_budget >= ([0-9.]+)", str(error)).group(1))
        assert minimum > fraction
        return
    loss = sum((o.float() * (index + 1)).sum() for index, o in enumerate(outputs))
    loss.backward()
    torch.testing.assert_close(loss, expected_loss, **FP32)
    for got, want in zip([leaf.grad for leaf in leaves], expected_grads):
        if want is None:
            assert got is None or not got.any()
        else:
            torch.testing.assert_close(got, want, **FP32)
    record = records[0]
    (solve,) = _decision(record, "solve")
    assert saved.bytes <= solve.data["budget_bytes"] * 1.05, (
        f"{saved.bytes} saved for a budget of {solve.data['budget_bytes']}\n{program}"
    )


def test_a_budget_below_the_minimum_is_refused_naming_it_and_the_minimum_works():
    def layer(x, w1, w2):
        h = torch.nn.functional.dropout(torch.relu(x @ w1), p=0.5, training=True)
        return (torch.tanh(h @ w2) @ w2.t()).sin()

    torch.manual_seed(0)
    inputs = [torch.randn(32, 16), torch.randn(16, 16) * 0.3, torch.randn(16, 16) * 0.3]
    with pytest.raises(
        RecomputeBudgetError, match=r"below the minimum feasible: .* use memory_budget >= ([0-9.]+)"
    ) as refused:
        _compiled_with_budget(layer, 0.01, [])(*[i.clone().requires_grad_(True) for i in inputs])
    minimum = float(re.search(r"use memory_budget >= ([0-9.]+)", str(refused.value)).group(1))
    assert 0.01 < minimum < 1.0
    records: list = []
    leaves = [i.clone().requires_grad_(True) for i in inputs]
    with SavedActivations(leaves) as saved:
        out = _compiled_with_budget(layer, min(1.0, minimum + 1e-3), records)(*leaves)
    out.sum().backward()
    (solve,) = _decision(records[0], "solve")
    assert saved.bytes <= solve.data["budget_bytes"] * 1.05


def test_random_ops_are_saved_never_recomputed():
    def layer(x, w):
        h = torch.nn.functional.dropout(torch.exp(x @ w), p=0.3, training=True)
        return torch.sigmoid(h * 2.0).sum(-1)

    inputs = [torch.randn(64, 32, requires_grad=True), torch.randn(32, 32, requires_grad=True)]
    records: list = []
    _compiled_with_budget(layer, 0.6, records)(*inputs).sum().backward()
    record, (forward, backward), joint = records
    assert len(_decision(record, "recompute")) > 0, "at 0.6 of save-everything something must be recomputed"
    random = [n for n in backward.graph.nodes if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())]
    assert random == [], f"the backward redraws random numbers: {random}"
    drawn = [n for n in joint.graph.nodes if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())]
    assert drawn and all(n.meta.get("recompute") != CheckpointPolicy.MUST_RECOMPUTE for n in drawn)


def test_a_tight_budget_moves_forward_ops_into_the_backward_and_says_which():
    def mlp(x, w1, w2):
        return torch.tanh(torch.nn.functional.gelu(x @ w1) @ w2)

    inputs = [
        torch.randn(64, 32, requires_grad=True),
        torch.randn(32, 128, requires_grad=True),
        torch.randn(128, 32, requires_grad=True),
    ]
    records: list = []
    _compiled_with_budget(mlp, 0.3, records)(*inputs).sum().backward()
    record, (forward, backward), _ = records
    recomputed = _decision(record, "recompute")
    assert recomputed and all({"bytes", "recompute_seconds"} <= d.data.keys() for d in recomputed)
    names = {n.name for n in backward.graph.nodes}
    assert {d.subject for d in recomputed} <= names
    kept = _decision(record, "save")
    assert kept and all(d.data["bytes"] >= 0 for d in kept)


def _train_step(model, input_ids):
    loss = model(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    loss.backward()
    return loss


# bf16: the tolerances of the compile-vs-eager model tests (tests/compiler/test_compile_models.py)
BF16_LOSS = {"rtol": 1.6e-1, "atol": 1e-2}
BF16_GRADS = {"rtol": 5e-2, "atol": 2e-2}


def _check_family(
    family: str,
    fraction: float,
    *,
    num_layers: int = 2,
    hidden_size: int = 32,
    dump_dir=None,
    dtype=torch.float32,
):
    config = tiny_config(family, num_layers=num_layers, hidden_size=hidden_size, num_experts=4)
    model = build_model(config, dtype=dtype, seed=1)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, memory_budget=fraction, dump_dir=dump_dir)
    input_ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with SavedActivations([*model.parameters(), *model.buffers(), input_ids]) as saved:
        loss = compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    loss.backward()
    expected = _train_step(reference, input_ids)
    loss_tolerance, grad_tolerance = (FP32, FP32) if dtype == torch.float32 else (BF16_LOSS, BF16_GRADS)
    torch.testing.assert_close(loss, expected, **loss_tolerance)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, **grad_tolerance, msg=lambda m, n=name: f"grad of {n}: {m}")
    decisions = [d for _, d in compiled.trex.graphs[0].report.decisions]
    (solve,) = [d for d in decisions if d.action == "solve"]
    assert saved.bytes <= solve.data["budget_bytes"] * 1.05, (
        f"measured {saved.bytes} B saved, budget {solve.data['budget_bytes']} B"
    )
    kinds = [d for d in decisions if d.action == "layer_kind"]
    return compiled, decisions, kinds, saved


def test_tiny_qwen3_moe_trains_like_eager_within_budget_and_tiles_its_layers(tmp_path):
    import json

    compiled, decisions, kinds, _ = _check_family("qwen3-moe", 0.4, dump_dir=tmp_path)
    (dumped,) = tmp_path.glob("graph_0_joint/*_recompute.decisions.jsonl")
    entries = [json.loads(line) for line in dumped.read_text().splitlines()]
    for action in ("recompute", "save"):
        listed = [e for e in entries if e["action"] == action]
        assert listed and all("bytes" in e["data"] and "recompute_seconds" in e["data"] for e in listed), action
    assert any(len(k.data["blocks"]) == 2 for k in kinds), [k.subject for k in kinds]
    joint = compiled.trex.graphs[0].joint
    tagged = {n.name for n in joint.graph.nodes if n.meta.get("recompute") == CheckpointPolicy.MUST_RECOMPUTE}
    for d in decisions:
        if d.action == "recompute":
            assert set(d.data["nodes"]) <= tagged and len(d.data["nodes"]) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.9])
@pytest.mark.parametrize("family", ["deepseek-v4", "deepseek-v3", "qwen3-moe"])
def test_tiny_families_train_like_eager_at_every_budget(family, fraction):
    try:
        _check_family(family, fraction, num_layers=3)
    except RecomputeBudgetError as error:
        assert "below the minimum feasible" in str(error) and fraction <= 0.2


def test_bf16_trains_like_eager_bf16_within_budget():
    _check_family("qwen3-moe", 0.3, dtype=torch.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.15, 0.5, 0.8])
@pytest.mark.parametrize("family", ["deepseek-v4", "qwen3-moe"])
def test_bf16_trains_like_eager_bf16_at_several_budgets(family, fraction):
    _check_family(family, fraction, num_layers=3, dtype=torch.bfloat16)


def test_compile_refuses_a_malformed_budget_before_capturing():
    model = build_model(tiny_config("qwen3-moe", num_layers=1, hidden_size=32, num_experts=2), dtype=torch.float32)
    with pytest.raises(RecomputeBudgetError, match="not an amount of memory"):
        trex.compile(model, memory_budget="plenty")


def test_a_plans_recompute_policy_becomes_the_fraction_of_saved_bytes_it_keeps():
    import dataclasses

    from trex.cost_model.model_spec import spec_from_config
    from trex.passes.recompute.policy import budget_for_plan
    from trex.planner import plan_parallel

    config = tiny_config("deepseek-v3")
    plan = plan_parallel(spec_from_config(config, "tiny-deepseek-v3"), "cpu", 1, seq=32, gbs=2, baseline=None).best
    model = build_model(config, dtype=torch.float32)

    def with_policy(policy):
        return dataclasses.replace(plan, parallel=dataclasses.replace(plan.parallel, recompute=policy))

    assert budget_for_plan(with_policy("none"), model) is None
    full = budget_for_plan(with_policy("full"), model)
    selective = budget_for_plan(with_policy("selective:core_attn"), model)
    assert 0 < full.fraction < selective.fraction < 1.0
    assert full.at_least_minimum, "a derived budget below the minimum must not fail the compile"


def test_a_derived_budget_below_the_minimum_uses_the_minimum_and_says_so():
    def layer(x, w):
        return torch.nn.functional.dropout(torch.exp(x @ w), p=0.3, training=True).sum(-1)

    inputs = [torch.randn(64, 32, requires_grad=True), torch.randn(32, 32, requires_grad=True)]
    records: list = []
    _compiled_with_budget(layer, MemoryBudget(fraction=0.01, at_least_minimum=True), records)(*inputs).sum().backward()
    fallback = _decision(records[0], "fallback")
    assert fallback and "below the reachable minimum" in fallback[0].reason


class _FailsOnce:
    """A user pass that fails the first time it runs (the compile) and not when the reproducer replays it."""

    name = "fails_once"
    failed = False

    def run(self, gm, ctx):
        from trex.pass_manager import PassResult

        if not _FailsOnce.failed:
            _FailsOnce.failed = True
            raise RuntimeError("first run fails")
        return PassResult(False, [])


def test_a_reproducer_replays_the_recompute_pass_with_its_budget(tmp_path):
    from trex.errors import PassError
    from trex.repro import load_pipeline, reproduce, write_reproducer

    def mlp(x, w1, w2):
        return torch.tanh(torch.nn.functional.gelu(x @ w1) @ w2)

    budget = MemoryBudget(fraction=0.35)
    failures: list = []

    def partition(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        manager = PassManager(
            [_FailsOnce(), Recompute(budget, time_limit_s=1.5)],
            reproducer=lambda g, remaining, ctx: write_reproducer(g, remaining, ctx, tmp_path),
        )
        try:
            manager.run(joint, PassContext(phase="joint"))
        except PassError as error:
            failures.append(error)
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    _FailsOnce.failed = False
    inputs = [torch.randn(64, 32), torch.randn(32, 128), torch.randn(128, 32)]
    aot_function(mlp, fw_compiler=nop, bw_compiler=nop, partition_fn=partition)(
        *[i.requires_grad_(True) for i in inputs]
    )
    assert failures, "the failing pass must have written a reproducer"
    (folder,) = tmp_path.glob("repro_graph_*")
    replayed = load_pipeline(folder)
    assert [p.name for p in replayed] == ["fails_once", "recompute"]
    assert replayed[1].memory_budget == budget and replayed[1].time_limit_s == 1.5
    report = reproduce(folder)
    (solve,) = [d for d in report.records[1].decisions if d.action == "solve"]
    assert "0.35 of the save-everything" in solve.reason
    assert solve.data["save_everything_bytes"] > 0 and solve.data["budget_bytes"] == int(
        0.35 * solve.data["save_everything_bytes"]
    )


class _Stack(torch.nn.Module):
    """Three alike layers; each layer's output is the next one's input."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x)) * 2.0
        return x.sum()


def test_values_other_layers_read_are_recomputed_when_the_budget_needs_it():
    torch.manual_seed(0)
    model = _Stack()
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, memory_budget=0.05, backend="eager")
    x = torch.randn(64, 32)
    with SavedActivations([*model.parameters(), x]) as saved:
        loss = compiled(x)
    loss.backward()
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected, **FP32)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **FP32)
    graph = compiled.trex.graphs[0]
    decisions = [d for _, d in graph.report.decisions]
    (solve,) = [d for d in decisions if d.action == "solve"]
    assert saved.bytes <= solve.data["budget_bytes"] * 1.05
    by_name = {n.name: n for n in graph.joint.graph.nodes}
    from trex.passes.recompute.problem import forward_node_names, layer_of

    forward = forward_node_names(graph.joint)
    crossing = [
        d.subject
        for d in decisions
        if d.action == "recompute"
        and any(
            u.name in forward and layer_of(u) != layer_of(by_name[d.subject]) and "nn_module_stack" in u.meta
            for u in by_name[d.subject].users
        )
    ]
    assert crossing, "at 5% of save-everything a layer's output must be recomputed for the next layer's backward"


def test_free_views_made_available_by_recompute_keep_the_optimum_of_the_plain_formulation():
    """The solver makes a view that is free to recompute from its buffer available only by
    recomputation (a tighter LP); on a real model's joint graph, full of such views, the proven
    optimum at every budget equals the plain formulation's, where each view can hold its buffer."""
    from trex.passes.recompute import problem_for
    from trex.passes.recompute.milp import free_views, solve

    torch.manual_seed(0)
    model = build_model(tiny_config("qwen3-moe"))
    compiled = trex.compile(model, backend="eager")
    compiled(torch.randint(0, model.config.vocab_size, (2, 16)), labels=torch.randint(0, 100, (2, 16))).loss.backward()
    problem = problem_for(compiled.trex.graphs[0].joint, "cpu")
    assert any(free_views(kind.representative) for kind in problem.kinds)
    exact = {"limits/gap": 0.0}
    for fraction in (0.15, 0.35, 0.6):
        budget = fraction * problem.save_everything_bytes
        tight = solve(problem, budget, time_limit_s=60, scip_params=exact)
        plain = solve(problem, budget, time_limit_s=60, scip_params=exact, views_by_recompute=False)
        assert tight.status == plain.status == "optimal"
        assert tight.saved_bytes <= budget
        assert tight.objective_seconds == pytest.approx(plain.objective_seconds, rel=1e-6, abs=1e-12)

"""The `reorder_comm` pass keeps meaning and collective order, and hides communication on the model.

Graphs are built with real functional collectives over a one-rank gloo group in this process (so they
execute: a one-rank all-reduce or all-gather is the identity), with costs written into
`node.meta["cost"]` by the test. Hypothesis draws random graphs of compute and collectives with random
costs; the rescheduled graph must compute the same outputs bit for bit, issue the same collectives in
the same order, and never predict more exposed communication than the original.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from trex.cost_model.annotate import NodeCost
from trex.graph_copy import copy_graph_module
from trex.pass_manager import PassContext
from trex.passes.reorder_comm import (
    CollectiveOrderError,
    ReorderComm,
    check_same_order,
    collective_sequence,
    exposure_bound,
    is_start,
    is_wait,
    simulate,
    simulate_ranks,
    traffic_seconds,
)

funcol = torch.ops._c10d_functional


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        yield
        dist.destroy_process_group()
    else:
        yield


def group_name() -> str:
    return dist.group.WORLD.group_name


def finish(graph: fx.Graph, outputs: list[fx.Node], inputs: list[torch.Tensor], costs: dict[str, float]):
    graph.output(tuple(outputs))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    FakeTensorProp(gm).propagate(*inputs)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            seconds = costs.get(node.name, 0.0)
            kind = "collective" if is_start(node) else "sync" if is_wait(node) else "gemm"
            node.meta["cost"] = NodeCost(str(node.target), kind, 0.0, 0.0, seconds)
    return gm


def run_pass(gm: fx.GraphModule, **options):
    return ReorderComm().run(gm, PassContext(options=options))


def test_a_wait_is_deferred_under_independent_compute_and_the_decision_says_what_hides_it():
    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    start = graph.call_function(funcol.all_reduce.default, (x, "sum", group_name()))
    wait = graph.call_function(funcol.wait_tensor.default, (start,))
    used = graph.call_function(torch.ops.aten.relu.default, (wait,))
    independent = graph.call_function(torch.ops.aten.mm.default, (w, w))  # after the wait in program order
    later = graph.call_function(torch.ops.aten.mm.default, (independent, w))
    inputs = [torch.randn(4, 4), torch.randn(4, 4)]
    gm = finish(graph, [used, later], inputs, {start.name: 5e-3, independent.name: 3e-3, later.name: 3e-3})
    before = copy_graph_module(gm)
    result = run_pass(gm)
    assert result.modified
    order = [n.name for n in gm.graph.nodes]
    assert order.index(independent.name) < order.index(wait.name) < order.index(used.name)
    summary = next(d for d in result.decisions if d.action == "summary")
    assert summary.data["exposed_before_s"] == pytest.approx(5e-3)
    assert summary.data["exposed_after_s"] == pytest.approx(0.0, abs=1e-12)  # 6 ms of compute hide 5 ms
    decision = next(d for d in result.decisions if d.subject == start.name)
    assert independent.name in decision.data["hidden_by"] and "hidden under" in decision.reason
    for got, want in zip(gm(*inputs), before(*inputs)):
        assert torch.equal(got, want)


def test_an_early_start_is_held_back_by_the_memory_budget():
    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    busy = graph.call_function(torch.ops.aten.mm.default, (w, w))
    start = graph.call_function(funcol.all_gather_into_tensor.default, (x, 1, group_name()))  # a prefetch
    wait = graph.call_function(funcol.wait_tensor.default, (start,))
    used = graph.call_function(torch.ops.aten.add.Tensor, (wait, busy))
    inputs = [torch.randn(64, 64), torch.randn(64, 64)]
    costs = {busy.name: 2e-3, start.name: 2e-3}
    free = finish(graph, [used], inputs, costs)
    tight = copy_graph_module(free)
    run_pass(free)
    assert [n.name for n in free.graph.nodes].index(start.name) < [n.name for n in free.graph.nodes].index(busy.name)
    result = run_pass(tight, comm_memory_budget_bytes=16)  # the gathered buffer is 16 KiB: it may not come early
    names = [n.name for n in tight.graph.nodes]
    assert names.index(start.name) > names.index(busy.name)
    assert "over the budget" in next(d for d in result.decisions if d.subject == start.name).reason


def test_the_order_check_names_the_first_difference():
    check_same_order(["a@g[f32]", "b@g[f32]"], ["a@g[f32]", "b@g[f32]"])
    with pytest.raises(CollectiveOrderError, match=r"position 0: \['a@g\[f32\]', 'b@g\[f32\]'\] became"):
        check_same_order(["a@g[f32]", "b@g[f32]"], ["b@g[f32]", "a@g[f32]"])


def test_small_all_gathers_of_ready_inputs_are_bucketed_when_the_link_is_latency_bound(monkeypatch):
    monkeypatch.setenv("TREX_EMULATE_LINK", "alpha_us=1000,gbps=1")  # alpha*B = 1 MB: small messages
    graph = fx.Graph()
    params = [graph.placeholder(f"p{i}") for i in range(3)]
    x = graph.placeholder("x")
    starts = [graph.call_function(funcol.all_gather_into_tensor.default, (p, 1, group_name())) for p in params]
    waits = [graph.call_function(funcol.wait_tensor.default, (s,)) for s in starts]
    outs = [graph.call_function(torch.ops.aten.mm.default, (x, w)) for w in waits]
    inputs = [torch.randn(4, 4) for _ in range(3)] + [torch.randn(2, 4)]
    gm = finish(graph, outs, inputs, {s.name: 1.1e-3 for s in starts})
    before = copy_graph_module(gm)
    sequence = collective_sequence(gm.graph)
    result = run_pass(gm)
    bucket = next(d for d in result.decisions if d.action == "bucket")
    assert bucket.data["members"] == 3 and "2 link latencies saved" in bucket.reason
    assert sum(1 for n in gm.graph.nodes if is_start(n)) == 1
    assert collective_sequence(gm.graph) == sequence  # the bucket stands for its members, in order
    gm.recompile()
    for got, want in zip(gm(*inputs), before(*inputs)):
        assert torch.equal(got, want)


def test_on_a_bandwidth_bound_link_the_timeline_chooses_a_bucket_cap_that_saves_latencies(monkeypatch):
    """Messages above alpha * B are not latency-bound, so the default cap leaves them alone; but when nothing can
    hide them every latency is exposed, and the timeline picks a larger cap that sends them as one bucket, unless
    the bucket would hold more memory than the budget."""
    from trex.passes import reorder_comm

    alpha, bandwidth = 5e-3, 1e4  # 5 ms, 10 kB/s: alpha * B = 50 B, each 64 B parameter is bandwidth-bound
    monkeypatch.setenv("TREX_EMULATE_LINK", f"alpha_us={alpha * 1e6},gbps={bandwidth / 1e9}")

    def link_priced(gm, cluster):  # buckets priced on the link (a one-rank group would make them free)
        for n in gm.graph.nodes:
            if "cost" not in n.meta and n.op == "call_function":
                moved = sum(v.numel() * v.element_size() for v in n.meta["val"]) if is_start(n) else 0
                seconds = alpha + moved / bandwidth if is_start(n) else 0.0
                n.meta["cost"] = NodeCost(str(n.target), "collective" if is_start(n) else "view", 0.0, 0.0, seconds)

    monkeypatch.setattr(reorder_comm, "_price_new_nodes", link_priced)

    def parameters_gathered():
        graph = fx.Graph()
        params = [graph.placeholder(f"p{i}") for i in range(3)]
        x = graph.placeholder("x")
        starts = [graph.call_function(funcol.all_gather_into_tensor.default, (p, 1, group_name())) for p in params]
        waits = [graph.call_function(funcol.wait_tensor.default, (s,)) for s in starts]
        outs = [graph.call_function(torch.ops.aten.mm.default, (x, w)) for w in waits]
        inputs = [torch.randn(4, 4) for _ in range(3)] + [torch.randn(2, 4)]
        return finish(graph, outs, inputs, {s.name: alpha + 64 / bandwidth for s in starts}), inputs

    gm, inputs = parameters_gathered()
    before, sequence = copy_graph_module(gm), collective_sequence(gm.graph)
    result = run_pass(gm)
    cap = next(d for d in result.decisions if d.action == "bucket_cap")
    # latency-bound only or 2 * alpha * B (100 B): no bucket forms; 4 * alpha * B holds the three
    assert (cap.data["cap_alpha_b"], cap.data["latency_bound_only"]) == (4, False)
    assert list(cap.data["exposed_by_cap_s"]) == ["4*alpha*B"]
    bucket = next(d for d in result.decisions if d.action == "bucket")
    assert bucket.data["members"] == 3 and "2 link latencies saved" in bucket.reason
    summary = next(d for d in result.decisions if d.action == "summary")
    assert summary.data["exposed_before_s"] == pytest.approx(3 * (alpha + 64 / bandwidth))
    assert summary.data["exposed_after_s"] == pytest.approx(alpha + 3 * 64 / bandwidth)
    assert collective_sequence(gm.graph) == sequence
    gm.recompile()
    for got, want in zip(gm(*inputs), before(*inputs)):
        assert torch.equal(got, want)
    # a 192 B bucket does not fit a 100 B budget: the messages stay apart
    gm, _ = parameters_gathered()
    result = run_pass(gm, comm_memory_budget_bytes=100)
    assert not any(d.action in ("bucket", "bucket_cap") for d in result.decisions)
    assert sum(1 for n in gm.graph.nodes if is_start(n)) == 3


def test_gradient_reduce_scatters_are_bucketed_where_the_last_gradient_is_ready(monkeypatch):
    monkeypatch.setenv("TREX_EMULATE_LINK", "alpha_us=1000,gbps=1")  # latency-bound small messages
    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    grads, starts, waits = [], [], []
    for _ in range(3):  # a backward: each gradient ready in turn, reduce-scattered and waited for right after it
        grads.append(graph.call_function(torch.ops.aten.mm.default, (grads[-1] if grads else x, w)))
        starts.append(graph.call_function(funcol.reduce_scatter_tensor.default, (grads[-1], "sum", 1, group_name())))
        waits.append(graph.call_function(funcol.wait_tensor.default, (starts[-1],)))
    inputs = [torch.randn(4, 4), torch.randn(4, 4)]
    # 0.2 ms of compute between gradients: waiting for the next one costs less than the 1 ms latency it saves
    gm = finish(graph, waits, inputs, {**{s.name: 1.1e-3 for s in starts}, **{g.name: 2e-4 for g in grads}})
    before = copy_graph_module(gm)
    sequence = collective_sequence(gm.graph)
    result = run_pass(gm)
    bucket = next(d for d in result.decisions if d.action == "bucket")
    assert bucket.data["members"] == 3 and "where the last input is ready" in bucket.reason
    assert collective_sequence(gm.graph) == sequence
    summary = next(d for d in result.decisions if d.action == "summary")
    assert summary.data["exposed_after_s"] < summary.data["exposed_before_s"]
    gm.recompile()
    for got, want in zip(gm(*inputs), before(*inputs)):
        assert torch.equal(got, want)


def test_reduce_scatters_far_apart_are_not_held_for_a_bucket(monkeypatch):
    monkeypatch.setenv("TREX_EMULATE_LINK", "alpha_us=1000,gbps=1")
    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    first = graph.call_function(torch.ops.aten.mm.default, (x, w))
    early = graph.call_function(funcol.reduce_scatter_tensor.default, (first, "sum", 1, group_name()))
    second = graph.call_function(torch.ops.aten.mm.default, (first, w))
    late = graph.call_function(funcol.reduce_scatter_tensor.default, (second, "sum", 1, group_name()))
    waits = [graph.call_function(funcol.wait_tensor.default, (s,)) for s in (early, late)]
    # 5 ms of compute between the two: holding the first for the second would cost more than one latency
    gm = finish(
        graph, waits, [torch.randn(4, 4), torch.randn(4, 4)], {early.name: 1.1e-3, late.name: 1.1e-3, second.name: 5e-3}
    )
    result = run_pass(gm)
    assert not any(d.action == "bucket" for d in result.decisions)


UNARY = (torch.ops.aten.relu.default, torch.ops.aten.neg.default, torch.ops.aten.tanh.default)
BINARY = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor, torch.ops.aten.mm.default)


@st.composite
def graphs_with_collectives(draw):
    """A random program over 4x4 tensors: compute ops, collectives started on any value and waited for
    at a random later point (values are used only after their wait), random costs."""
    graph = fx.Graph()
    # a first input named as a tangent makes the graph a joint one: what depends on it is its backward, and the
    # values only the output reads are weight gradients the pass may hold back
    joint = draw(st.booleans())
    inputs = [graph.placeholder("tangents_1" if i == 0 and joint else f"x{i}") for i in range(draw(st.integers(1, 3)))]
    values = list(inputs)
    pending: list[tuple[fx.Node, fx.Node]] = []  # (start, source)
    costs: dict[str, float] = {}
    for _ in range(draw(st.integers(2, 14))):
        action = draw(st.sampled_from(["unary", "binary", "binary", "start", "wait"]))
        if action == "start":
            source = draw(st.sampled_from(values))
            kind = draw(st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]))
            if kind == "all_reduce":
                node = graph.call_function(funcol.all_reduce.default, (source, "sum", group_name()))
            elif kind == "reduce_scatter":
                node = graph.call_function(funcol.reduce_scatter_tensor.default, (source, "sum", 1, group_name()))
            else:
                node = graph.call_function(funcol.all_gather_into_tensor.default, (source, 1, group_name()))
            pending.append((node, source))
        elif action == "wait" and pending:
            start, _ = pending.pop(draw(st.integers(0, len(pending) - 1)))
            values.append(graph.call_function(funcol.wait_tensor.default, (start,)))
            node = values[-1]
        elif action == "unary":
            node = graph.call_function(draw(st.sampled_from(UNARY)), (draw(st.sampled_from(values)),))
            values.append(node)
        else:
            a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            node = graph.call_function(draw(st.sampled_from(BINARY)), (a, b))
            values.append(node)
        costs[node.name] = draw(st.sampled_from([0.0, 1e-4, 1e-3, 4e-3]))
    for start, _ in pending:
        values.append(graph.call_function(funcol.wait_tensor.default, (start,)))
    outputs = [v for v in values if v.op != "placeholder"] or values
    tensors = [torch.randn(4, 4, generator=torch.Generator().manual_seed(i)) for i in range(len(inputs))]
    return finish(graph, outputs, tensors, costs), tensors


@given(graphs_with_collectives(), st.sampled_from([0, 64, 1 << 30]))
def test_random_graphs_keep_their_meaning_and_collective_order(case, budget):
    gm, inputs = case
    before = copy_graph_module(gm)
    sequence = collective_sequence(gm.graph)
    exposed = simulate(gm.graph.nodes).exposed_s
    one = simulate_ranks(gm.graph.nodes, [{}])[0]
    one.spans = []  # only simulate_ranks records the spans
    assert one == simulate(gm.graph.nodes)  # one rank: the same model
    result = run_pass(gm, comm_memory_budget_bytes=budget)
    gm.graph.lint()
    gm.recompile()
    assert collective_sequence(gm.graph) == sequence
    if sequence:
        summary = next(d for d in result.decisions if d.action == "summary")
        assert summary.data["exposed_after_s"] <= exposed + 1e-12
        if not any(d.action == "keep_order" for d in result.decisions):  # the pass's schedule: forward first
            assert summary.data["exposed_bound_s"] <= summary.data["exposed_after_s"] + 1e-12
    else:
        assert not result.modified and not result.decisions  # nothing to schedule
    for got, want in zip(gm(*inputs), before(*inputs)):
        assert torch.equal(got, want)
    for node in gm.graph.nodes:  # every wait still follows its start, every use follows its wait
        if is_wait(node):
            names = [n for n in gm.graph.nodes]
            assert names.index(node.args[0]) < names.index(node)
            assert all(names.index(node) < names.index(u) for u in node.users if u.op != "output")
    assert sum(map(is_wait, gm.graph.nodes)) == sum(map(is_wait, before.graph.nodes))


def exchange_between_gemms(graph: fx.Graph):
    """x @ w -> all-reduce -> wait, with an independent w @ w issued between start and wait."""
    x, w = graph.placeholder("x"), graph.placeholder("w")
    before = graph.call_function(torch.ops.aten.mm.default, (x, w))
    start = graph.call_function(funcol.all_reduce.default, (before, "sum", group_name()))
    independent = graph.call_function(torch.ops.aten.mm.default, (w, w))
    return w, before, start, independent, graph.call_function(funcol.wait_tensor.default, (start,))


def test_a_collective_waits_for_the_slowest_rank_to_issue_it():
    graph = fx.Graph()
    _, before, start, independent, wait = exchange_between_gemms(graph)
    used = graph.call_function(torch.ops.aten.relu.default, (wait,))
    costs = {before.name: 1e-3, start.name: 3e-3, independent.name: 1e-3}
    gm = finish(graph, [used, independent], [torch.randn(4, 4), torch.randn(4, 4)], costs)
    nodes = {n.name: n for n in gm.graph.nodes}
    # rank 1 computes 4 ms longer before the all-reduce: rank 0's transfer cannot begin until rank 1 issues it
    fast, slow = simulate_ranks(gm.graph.nodes, [{}, {nodes[before.name]: 5e-3}])
    assert fast.exposed_s == pytest.approx(4e-3 + 3e-3 - 1e-3)  # waits for rank 1, then the link less 1 ms hidden
    assert slow.exposed_s == pytest.approx(3e-3 - 1e-3)
    assert fast.step_s == pytest.approx(slow.step_s) == pytest.approx(5e-3 + 3e-3)
    assert fast.hidden_by[start.name] == [independent.name]


def test_traffic_reprices_exchanges_and_experts_on_the_rows_they_really_moved():
    """An expert-parallel layer priced at balanced routing, then at the traffic one run recorded: the exchange at
    the bytes it sent (what the emulated link charges), the local experts at the rows that arrived."""
    from trex.cost_model.annotate import annotate, annotate_node
    from trex.errors import TrexError
    from trex.runtime import expert_parallel  # noqa: F401 - registers the trex.ep_* ops
    from trex.runtime.emulated_link import parse_link

    pair, hidden, rows, local, inner = "emulated-pair", 16, 8, 2, 8
    graph = fx.Graph()
    x, send, recv, counts = (graph.placeholder(n) for n in ("x", "send", "recv", "counts"))
    gate_up, down = graph.placeholder("gate_up"), graph.placeholder("down")
    ep = torch.ops.trex
    dispatch = graph.call_function(ep.ep_exchange.default, (x, send, recv, rows, pair))
    received = graph.call_function(funcol.wait_tensor.default, (dispatch,))
    experts = graph.call_function(
        ep.ep_experts_local.default, (received, counts, gate_up, down, "silu", 0.0, False, rows)
    )
    out = graph.call_function(operator.getitem, (experts, 0))
    combine = graph.call_function(ep.ep_exchange.default, (out, recv, send, rows, pair))
    done = graph.call_function(funcol.wait_tensor.default, (combine,))
    graph.output((done,))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    inputs = [
        torch.randn(rows, hidden),
        torch.tensor([rows // 2, rows // 2]),
        torch.tensor([rows // 2, rows // 2]),
        torch.tensor([[2, 2], [2, 2]]),
        torch.randn(local, 2 * inner, hidden),
        torch.randn(local, hidden, inner),
    ]
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(t) for t in inputs]
        FakeTensorProp(gm, mode).propagate(*fake)
    link = parse_link("alpha_us=10,gbps=0.5")
    cluster, groups = link.cluster(), {pair: [0, 1]}
    annotate(gm, cluster, groups=groups)
    row_bytes = hidden * 4
    # this rank sent its 8 rows, received 12 (routing not balanced), then sent 12 back and received its 8
    traffic = [("all_to_all", 8 * row_bytes, 12 * row_bytes), ("all_to_all", 12 * row_bytes, 8 * row_bytes)]
    seconds = traffic_seconds(gm.graph, traffic, cluster, groups)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert seconds[nodes[dispatch.name]] == pytest.approx(link.collective_seconds("all_to_all", 8 * row_bytes, 2))
    assert seconds[nodes[combine.name]] == pytest.approx(link.collective_seconds("all_to_all", 12 * row_bytes, 2))
    balanced = nodes[experts.name].meta["cost"].time_s
    assert balanced == pytest.approx(annotate_node(nodes[experts.name], cluster, groups, overrides={"S": 8}).time_s)
    assert seconds[nodes[experts.name]] == pytest.approx(
        annotate_node(nodes[experts.name], cluster, groups, overrides={"S": 12, "T": 12}).time_s
    )
    assert seconds[nodes[experts.name]] > balanced
    with pytest.raises(TrexError, match="the traffic has 1 collectives, the graph 2"):
        traffic_seconds(gm.graph, traffic[:1], cluster, groups)


def test_the_default_budget_is_the_memory_headroom_of_the_plan_or_the_graph():
    from trex.cost_model.catalog import get_cluster
    from trex.passes.reorder_comm import default_budget

    graph = fx.Graph()  # a joint graph: forward output, then one gradient per primals input (None: no gradient)
    weight, x, tangent = graph.placeholder("primals_1"), graph.placeholder("primals_2"), graph.placeholder("tangents_1")
    out = graph.call_function(torch.ops.aten.mm.default, (x, weight))
    x_t = graph.call_function(torch.ops.aten.t.default, (x,))
    grad = graph.call_function(torch.ops.aten.mm.default, (x_t, tangent))
    inputs = [torch.randn(256, 256), torch.randn(8, 256), torch.randn(8, 256)]
    gm = finish(graph, [out, grad, None], inputs, {})
    cluster = get_cluster("cpu")
    assert default_budget(gm, cluster, {"comm_memory_budget_bytes": 123}) == (123, "given")
    assert default_budget(gm, cluster, {"plan_memory_headroom_bytes": 5 << 20})[0] == 5 << 20
    budget, source = default_budget(gm, cluster, {})
    # usable memory - 4 x the 256 KiB weight (parameter, gradient, AdamW moments) - the peak of live values:
    # the 8 KiB product, then x^T (8 KiB) and the 256 KiB gradient with it
    assert budget == int(cluster.device.usable_memory_bytes) - 4 * 256 * 256 * 4 - (8 * 256 * 4 * 2 + 256 * 256 * 4)
    assert "device memory headroom" in source


def test_weight_gradients_are_held_back_to_fill_the_wait_of_the_exchange_the_data_gradient_feeds():
    graph = fx.Graph()
    x, w, grad = graph.placeholder("x"), graph.placeholder("w"), graph.placeholder("tangents_1")
    weight_grad = graph.call_function(torch.ops.aten.mm.default, (grad, x))  # only the output needs it
    data_grad = graph.call_function(torch.ops.aten.mm.default, (grad, w))
    start = graph.call_function(funcol.all_reduce.default, (data_grad, "sum", group_name()))
    wait = graph.call_function(funcol.wait_tensor.default, (start,))
    used = graph.call_function(torch.ops.aten.relu.default, (wait,))
    inputs = [torch.randn(4, 4) for _ in range(3)]
    costs = {weight_grad.name: 4e-3, data_grad.name: 1e-3, start.name: 5e-3}
    gm = finish(graph, [used, weight_grad], inputs, costs)
    before = copy_graph_module(gm)
    result = run_pass(gm)
    order = [n.name for n in gm.graph.nodes]
    # in program order the weight gradient runs first and the exchange waits 5 ms; held back it runs under it
    assert (
        order.index(data_grad.name) < order.index(start.name) < order.index(weight_grad.name) < order.index(wait.name)
    )
    assert all(torch.equal(got, want) for got, want in zip(gm(*inputs), before(*inputs)))
    deferral = next(d for d in result.decisions if d.action == "defer_weight_gradients")
    assert weight_grad.name in deferral.data["deferred"] and "held back" in deferral.reason
    assert (deferral.data["exposed_in_order_s"], deferral.data["exposed_deferred_s"]) == pytest.approx((5e-3, 1e-3))
    # no schedule can do better: 1 ms of compute must precede the exchange, 5 ms on the link, 5 ms of compute
    summary = next(d for d in result.decisions if d.action == "summary").data
    assert (summary["exposed_after_s"], summary["exposed_bound_s"]) == pytest.approx((1e-3, 1e-3))


def test_the_exposure_bound_counts_compute_that_must_precede_the_first_and_follow_the_last_collective():
    graph = fx.Graph()
    w, first, start, independent, wait = exchange_between_gemms(graph)
    last = graph.call_function(torch.ops.aten.mm.default, (wait, w))
    costs = {first.name: 2e-3, start.name: 5e-3, independent.name: 1e-3, last.name: 3e-3}
    gm = finish(graph, [last, independent], [torch.randn(4, 4), torch.randn(4, 4)], costs)
    bound = exposure_bound(gm.graph, joint=False)
    # 2 ms before the exchange, 5 ms on the link, 3 ms after it: at least 10 ms for 6 ms of compute
    assert bound.exposed_s == pytest.approx(4e-3)
    assert simulate(gm.graph.nodes).exposed_s == pytest.approx(4e-3)  # 1 ms of independent compute hides 1 ms
    assert "5.000 ms on the link" in bound.parts[0]


def test_a_joint_graph_whose_collectives_interleave_forward_and_backward_is_bounded_as_one_segment():
    graph = fx.Graph()
    grad, x = graph.placeholder("tangents_1"), graph.placeholder("x")
    backward_start = graph.call_function(funcol.all_reduce.default, (grad, "sum", group_name()))
    forward_start = graph.call_function(funcol.all_gather_into_tensor.default, (x, 1, group_name()))
    backward_work = graph.call_function(torch.ops.aten.mm.default, (grad, grad))
    waits = [graph.call_function(funcol.wait_tensor.default, (s,)) for s in (backward_start, forward_start)]
    costs = {backward_start.name: 4e-3, forward_start.name: 4e-3, backward_work.name: 6e-3}
    gm = finish(graph, [*waits, backward_work], [torch.randn(4, 4), torch.randn(4, 4)], costs)
    # the forward's all-gather is issued after the backward's all-reduce: the backward's compute can hide it, so
    # the forward alone (4 ms on the link, no compute) is no bound
    bound = exposure_bound(gm.graph)
    assert bound.exposed_s == pytest.approx(exposure_bound(gm.graph, joint=False).exposed_s) == pytest.approx(2e-3)
    assert simulate(gm.graph.nodes).exposed_s >= bound.exposed_s - 1e-12


def _group_shapes_on_a_two_by_two_mesh() -> dict[str, str]:
    """On each of 4 gloo ranks: the signature's description of this rank's group along each dim of a 2 x 2 mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    from trex.passes.reorder_comm import _group_shape

    dist.init_process_group("gloo")
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        return {dim: _group_shape(mesh.get_group(dim).group_name) for dim in ("dp", "tp")}
    finally:
        dist.destroy_process_group()


def test_every_rank_of_a_mesh_dim_describes_its_group_alike_for_the_cross_rank_order_check():
    """Ranks 0 and 1 hold different groups along dp ({0, 2} and {1, 3}, named differently by each rank): the
    collective order check across ranks compares what is the same on all of them, the size and the rank step."""
    from trex.runtime.launcher import launch_function

    shapes = launch_function(_group_shapes_on_a_two_by_two_mesh, (), 4)
    assert all(s == {"dp": "2:2", "tp": "2:1"} for s in shapes.values()), shapes

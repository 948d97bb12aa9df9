"""The Inductor backend: trex's regions compiled by Inductor train like eager, in as few regions as
possible, and the user picks and orders backends with `backend=` or TREX_BACKENDS."""

from __future__ import annotations

import copy

import pytest
import torch

import trex
from trex.backends import backend_names_from_env, default_backend_names
from trex.backends.inductor import inductor_unavailable_reason
from trex.driver import CompileOptions
from trex.errors import UnknownNameError

needs_inductor = pytest.mark.skipif(
    inductor_unavailable_reason() is not None, reason=str(inductor_unavailable_reason())
)


class TinyBlock(torch.nn.Module):
    """RMSNorm + SwiGLU MLP + a trex MoE layer: pointwise, reductions, GEMMs and the trex ops."""

    def __init__(self, hidden=16, experts=4):
        super().__init__()
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-6)
        self.up = torch.nn.Linear(hidden, 2 * hidden, bias=False)
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * hidden, hidden) * hidden**-0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, hidden) * hidden**-0.5)

    def forward(self, x):
        gate, up = self.up(self.norm(x)).chunk(2, dim=-1)
        x = x + torch.nn.functional.silu(gate) * up
        weights, index = torch.topk(torch.softmax(self.router(x), -1), 2, dim=-1)
        x = x + torch.ops.trex.moe_experts(x, index, weights, self.gate_up, self.down, "silu", 0.0, False)[0]
        return (x * x).mean()


@needs_inductor
def test_inductor_takes_forward_and_backward_as_one_region_each_and_matches_eager():
    torch.manual_seed(0)
    model, x = TinyBlock(), torch.randn(12, 16)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=["inductor", "eager"])
    loss = compiled(x)
    loss.backward()
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)

    graph = compiled.trex.graphs[0]
    for which in ("forward", "backward"):
        lowering = graph.lowerings[which]
        assert [p[0] for p in lowering.partitions] == ["inductor"], f"{which}: {lowering.describe()}"
        assert set(lowering.assignment.values()) == {"inductor"}  # the trex MoE primitives too, as extern calls
        assert all(seconds > 0 for seconds in lowering.region_seconds.values())
        assert lowering.predicted_seconds["inductor"] > 0
        assert lowering.boxed is not None  # one region: called with AOTAutograd's list, inputs freed early
    summary = compiled.trex.summary()
    assert "forward: inductor" in summary and "ms predicted" in summary and "region(s) compiled in" in summary


def test_trex_backends_environment_orders_the_backends(monkeypatch):
    monkeypatch.setenv("TREX_BACKENDS", "eager")
    options = CompileOptions.build()
    assert [b.name for b in options.backends] == ["eager"]
    monkeypatch.setenv("TREX_BACKENDS", "inductor, eager")
    assert backend_names_from_env(dict(TREX_BACKENDS="inductor, eager")) == ["inductor", "eager"]
    assert [b.name for b in CompileOptions.build().backends] == ["inductor", "eager"]
    # an explicit backend= wins over the environment
    assert [b.name for b in CompileOptions.build(backend="eager").backends] == ["eager"]


def test_trex_backends_environment_names_an_unknown_backend(monkeypatch):
    monkeypatch.setenv("TREX_BACKENDS", "inductor,tritonn")
    with pytest.raises(UnknownNameError, match="tritonn.*TREX_BACKENDS"):
        CompileOptions.build()


def test_default_backends_are_inductor_then_eager_where_inductor_works(monkeypatch):
    monkeypatch.delenv("TREX_BACKENDS")
    expected = ["eager"] if inductor_unavailable_reason() is not None else ["inductor", "eager"]
    assert default_backend_names() == expected
    assert [b.name for b in CompileOptions.build().backends] == expected


@needs_inductor
def test_inductor_declines_nodes_on_devices_it_has_no_code_generator_for():
    from trex.backends.inductor import InductorBackend

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(torch.ops.aten.relu.default, (x,))
    node.meta["val"] = torch.empty(2, device="meta")
    assert not InductorBackend().supports(node)
    node.meta["val"] = torch.empty(2)
    assert InductorBackend().supports(node)


@needs_inductor
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["deepseek-v4", "deepseek-v3", "qwen3-moe"])
def test_tiny_models_train_like_eager_through_inductor(family, dtype, step_matches_eager):
    """One training step of each tiny MoE model through trex + Inductor has eager's loss and gradients: in fp32
    within the fp32 tolerances, in bf16 no further from the same step run in fp32 than twice eager bf16's
    distance (loss and every gradient; trex's fp32 GEMMs and Inductor's fused loops round and sum in other
    orders than ATen's kernels, so elementwise closeness to eager bf16 is not what accuracy means).

    Every program of the comparison takes the routing decisions eager makes on the batch (`hold_routing`,
    tests/held_routing.py). Why: a router's choice is discontinuous in its input. On tiny DeepSeek-V3 bf16 one
    token's two best expert groups are 4.8e-4 apart; the one-ulp differences of Inductor's generated loops from
    ATen's kernels send it to other experts, and that flip alone made the loss 6.1e-4 from the fp32 run against
    eager's 4.9e-5 - plain torch.compile fails the same criterion on 8 of 24 batches, trex on 7 (bench/RESULTS.md
    section 11, eighth session). Without holding, the criterion judges which side of a tie the noise fell on; with
    it, only rounding and accumulation separate the programs. The bf16 step runs on 16 batches and the loss and each
    gradient are judged on their 16 values together (the 2-norm of the distances to the fp32 runs; see
    `step_matches_eager`): even with routing held, one loss (or a gradient of 3 elements, V4's hyper-connection
    scales) is one draw of its rounding noise, and an equally accurate program's draw is over twice eager's on 30%
    (14%) of batches - held tiny V3: trex's loss on 8 of 24, plain Inductor's on 9 -, over 16 batches with
    probability 0.4% (2e-6). The bound stays 2x on a 2-norm, as it was. That this still fails on a real numerics
    defect: `test_bf16_criterion_fails_on_a_numerics_defect`."""
    from trex.models import build_model, tiny_config

    config = tiny_config(family)
    model = build_model(config, dtype=dtype, seed=1)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=["inductor", "eager"])
    # bf16: trex (fp32 GEMMs, its own sum orders) and eager are each judged against the same step in fp32
    step_matches_eager(compiled, model, reference, config, dtype, fp32_reference=True, hold_routing=True, batches=16)
    lowering = compiled.trex.graphs[0].lowerings
    assert len(lowering["forward"].partitions) == 1 and len(lowering["backward"].partitions) == 1


def _record_inductor_settings(monkeypatch, read) -> list:
    """Replace Inductor's `compile_fx_inner` by a recorder: each compile appends `read()` (the Inductor settings
    it ran under) to the returned list, and the graph runs op by op."""
    import torch._inductor.compile_fx as compile_fx

    seen: list = []

    def by_fx(gm, example_inputs, **kwargs):
        seen.append(read())

        def run(args):
            values = list(args)
            args.clear()
            return list(gm(*values))

        return run

    monkeypatch.setattr(compile_fx, "compile_fx_inner", by_fx)
    return seen


@needs_inductor
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_inductor_rounds_where_eager_rounds_in_low_precision_graphs(dtype, monkeypatch):
    """A bf16 graph is compiled with Inductor's `emulate_precision_casts` (each value rounded to its dtype as
    eager rounds it: without it tiny V4's bf16 sinks gradient was 3.2x eager's distance from fp32, see
    `backends.inductor.backend._eager_roundings`); an fp32 graph is compiled with Inductor's own setting."""
    import torch._inductor.config as inductor_config

    seen = _record_inductor_settings(monkeypatch, lambda: inductor_config.emulate_precision_casts)
    default = inductor_config.emulate_precision_casts
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Softmax(-1)).to(dtype)
    compiled = trex.compile(copy.deepcopy(model), backend=["inductor", "eager"])
    x = torch.randn(4, 8, dtype=dtype)
    compiled(x).sum().backward()
    assert seen == [dtype == torch.bfloat16 or default] * 2  # forward and backward
    assert inductor_config.emulate_precision_casts == default  # only for the compile


class _DecliningMul:
    """Inductor that leaves every `aten.mul` to eager: the graph becomes regions with eager ops between them."""

    def __new__(cls):
        from trex.backends.inductor import InductorBackend

        class Declining(InductorBackend):
            def supports(self, node):
                return node.target is not torch.ops.aten.mul.Tensor and super().supports(node)

        return Declining()


@needs_inductor
@pytest.mark.parametrize(
    "case, expected",
    [("whole graph", (False, False)), ("runtime_checks", None), ("user's environment", None), ("eager between", None)],
)
def test_whole_graph_regions_compile_without_inductors_runtime_asserts(case, expected, monkeypatch):
    """A region that is the whole forward or backward graph is compiled without Inductor's size/stride and
    alignment asserts: its inputs are the graph's, fixed by Dynamo's guards and AOTAutograd before it runs
    (`backends.inductor.backend._runtime_checks`). `runtime_checks=True`, the user's own TORCHINDUCTOR_*_ASSERTS
    and a region with eager ops around it keep Inductor's setting (None: the setting outside the compile)."""
    import torch._inductor.config as inductor_config

    from trex.backends.inductor import InductorBackend

    for name in ("TORCHINDUCTOR_SIZE_ASSERTS", "TORCHINDUCTOR_ALIGNMENT_ASSERTS"):
        monkeypatch.delenv(name, raising=False)
    seen = _record_inductor_settings(
        monkeypatch, lambda: (inductor_config.size_asserts, inductor_config.alignment_asserts)
    )
    outside = (inductor_config.size_asserts, inductor_config.alignment_asserts)
    backend = {"runtime_checks": InductorBackend(runtime_checks=True), "eager between": _DecliningMul()}.get(
        case, InductorBackend()
    )
    if case == "user's environment":
        monkeypatch.setenv("TORCHINDUCTOR_SIZE_ASSERTS", "1")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    compiled = trex.compile(copy.deepcopy(model), backend=[backend, "eager"])
    x = torch.randn(4, 8)
    loss = (compiled(x) * 2).sum()
    loss.backward()
    torch.testing.assert_close(loss, (model(x) * 2).sum())
    regions = [p for g in compiled.trex.graphs for lw in g.lowerings.values() for p in lw.partitions]
    assert (len(regions) > 2) == (case == "eager between"), regions
    assert seen and set(seen) == {expected or outside}, seen
    assert (inductor_config.size_asserts, inductor_config.alignment_asserts) == outside  # only for the compile


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_trex_extern_ops_return_the_layout_of_their_fake_implementations(dtype):
    """What Inductor's output asserts checked at run time in a whole-graph region, checked here for trex's own
    extern kernels: the real output has the size, stride and dtype its fake implementation promised, in the
    forms the MoE decompositions emit (rows past the last offset and an empty expert included)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import trex.ops.moe_decompositions  # noqa: F401 - registers the extern ops

    ops = torch.ops.trex
    offsets = torch.tensor([3, 3, 7, 9], dtype=torch.int32)  # expert 1 empty; rows 9.. belong to no expert
    x, w = torch.randn(12, 8, dtype=dtype), torch.randn(4, 8, 16, dtype=dtype)  # strides of 16-byte multiples
    a, b = torch.randn(12, 8, dtype=dtype), torch.randn(12, 16, dtype=dtype)
    calls = [
        (ops.extern_aten_grouped_mm.default, (x, w, offsets)),
        (ops.extern_aten_grouped_mm.default, (a.t(), b, offsets)),
        (ops.extern_aten_grouped_mm.default, (x, w.transpose(1, 2).contiguous().transpose(1, 2), offsets)),
    ]
    if dtype == torch.float32:
        calls += [
            (ops.extern_grouped_mm.default, (x, w, offsets)),
            (ops.extern_grouped_mm_weight_grad.default, (a, b, offsets)),
        ]
    for op, args in calls:
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = op(*[mode.from_tensor(t) for t in args])
        assert (real.shape, real.stride(), real.dtype) == (fake.shape, fake.stride(), fake.dtype), op


def _bf16_accumulated_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` with a bf16 accumulator: each product and each partial sum rounded to bf16."""
    total = a.new_zeros(a.size(0), b.size(1))
    for k in range(a.size(1)):
        total = total + a[:, k : k + 1] * b[k : k + 1, :]
    return total


def _rounded_to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


class _Bf16AccumulatingGemms:
    """A defect for the criterion to catch (a perturbed kernel): every bf16 `mm` of the forward and backward
    graphs accumulates in bf16, as a GEMM kernel with a bf16 accumulator would; ATen's GEMMs accumulate in fp32
    and round once."""

    name = "bf16_accumulating_gemms"
    stage = "partitioned"

    def run(self, gm, ctx):
        from trex.pass_manager import PassResult

        gemms = [
            n
            for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.mm.default)
            if n.meta["val"].dtype == torch.bfloat16
        ]
        for node in gemms:
            node.target = _bf16_accumulated_mm
        gm.recompile()
        self.rewritten = getattr(self, "rewritten", 0) + len(gemms)
        return PassResult(bool(gemms))


class _CrossEntropyInBf16:
    """A defect for the criterion to catch (an upcast dropped): the cross-entropy's log-probabilities rounded to
    bf16, as `cross_entropy` computes them on bf16 logits without transformers' fp32 upcast (the backward reads
    the rounded values too, as it would)."""

    name = "cross_entropy_in_bf16"
    stage = "partitioned"

    def run(self, gm, ctx):
        from trex.pass_manager import PassResult

        nodes = list(gm.graph.find_nodes(op="call_function", target=torch.ops.aten._log_softmax.default))
        for node in nodes:
            with gm.graph.inserting_after(node):
                rounded = gm.graph.call_function(_rounded_to_bf16, (node,))
            rounded.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(rounded, delete_user_cb=lambda user, r=rounded: user is not r)
        gm.recompile()
        self.rewritten = getattr(self, "rewritten", 0) + len(nodes)
        return PassResult(bool(nodes))


@pytest.mark.parametrize("defect", [None, _Bf16AccumulatingGemms, _CrossEntropyInBf16])
def test_bf16_criterion_fails_on_a_numerics_defect(defect, step_matches_eager):
    """Holding the routing and judging loss and gradients over 16 batches do not blunt the bf16 criterion of the
    slow test above: a tiny Qwen3-MoE step through trex (eager backend: seconds, not Inductor's minutes; the
    criterion does not depend on the backend) passes it, and the same step with one deliberate numerics defect in
    trex's pipeline fails it - a GEMM accumulating in bf16 (one batch: most gradients 3-4x eager bf16's distance
    from fp32) or the loss's fp32 upcast dropped (one batch: the loss 22x; 16 batches: 16x)."""
    from trex.models import build_model, tiny_config
    from trex.passes import DEFAULT_PIPELINE

    config = tiny_config("qwen3-moe", num_layers=1)
    model = build_model(config, dtype=torch.bfloat16, seed=1)
    reference = copy.deepcopy(model)
    passes: list = list(DEFAULT_PIPELINE)
    if defect is not None:
        passes.insert(passes.index("cpu_gemm_precision"), defect())  # before it: on any CPU the GEMMs are bf16
    compiled = trex.compile(model, backend="eager", passes=passes)
    step = lambda: step_matches_eager(  # noqa: E731
        compiled, model, reference, config, torch.bfloat16, fp32_reference=True, hold_routing=True, batches=16
    )
    if defect is None:
        step()
    else:
        with pytest.raises(AssertionError, match="distance to the fp32 run"):
            step()
        assert passes[passes.index("cpu_gemm_precision") - 1].rewritten > 0  # the defect was in the program


@pytest.mark.parametrize("family, layer", [("deepseek-v3", 1), ("qwen3-moe", 0)])
def test_held_routing_removes_a_near_tie_flip_and_nothing_else(family, layer):
    """What holding the routing removes, on one MoE block of a tiny model (fp32, deterministic): a token whose
    last chosen expert leads the first unchosen one (in V3, within the chosen group) by 1e-4 in logit flips to it
    under a 1e-3 change of its hidden state, and the block's output jumps by a chosen expert's share; held to the
    recorded choice, the same change moves the output continuously (by 2-3e-4 of that jump), and holding a block to
    the choice it makes anyway changes no bit."""
    import held_routing

    from trex.models import build_model, tiny_config

    model = build_model(tiny_config(family, num_layers=layer + 1), dtype=torch.float32, seed=1)
    block = model.model.layers[layer].mlp
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 8, 64, generator=generator)
    with torch.no_grad():
        logits = x[0, 0] @ block.gate.weight.T  # token 0's
        (chosen,) = held_routing.record_routing(block, lambda b: b(x)).values()
        chosen = chosen[0].tolist()
        group = block.gate.num_experts // block.gate.num_group if family == "deepseek-v3" else logits.numel()
        last = min(chosen, key=lambda e: logits[e])
        rivals = [e for e in range(logits.numel()) if e not in chosen and e // group == last // group]
        rival = max(rivals, key=lambda e: logits[e])
        # the rival's row: the last expert's, 1e-4 lower on token 0, plus a unit direction orthogonal to it
        x0 = x[0, 0]
        side = torch.randn(64, generator=generator)
        side = side - (side @ x0) / (x0 @ x0) * x0
        side = side / side.norm()
        block.gate.weight[rival] = block.gate.weight[last] - 1e-4 * x0 / (x0 @ x0) + side
        nudged = x.clone()
        nudged[0, 0] += 1e-3 * side  # the rival now leads by ~9e-4

        choices = held_routing.record_routing(block, lambda b: b(x))
        flipped = held_routing.record_routing(block, lambda b: b(nudged))
        (before,), (after,) = choices.values(), flipped.values()
        assert sorted(before[0].tolist()) == sorted(chosen) and rival in after[0].tolist() and last not in after[0]
        assert torch.equal(before[1:], after[1:])  # one decision changed, at token 0

        out, jumped = block(x), block(nudged)
        held = held_routing.hold_routing(copy.deepcopy(block), choices)
        assert torch.equal(held(x), out)
        moved = held(nudged)
    jump = (jumped - out).norm().item()
    assert jump > 0.1 * out[0, 0].norm().item()  # a discrete jump: a share of the token's output (80-90% here)
    assert (moved - out).norm().item() < 1e-2 * jump  # continuous: of the order of the 1e-3 nudge


@pytest.mark.parametrize("family", ["deepseek-v4", "deepseek-v3", "qwen3-moe"])
def test_holding_a_model_to_its_own_routing_changes_no_bit(family):
    """The held routers recompute each weight by the router's own ops in its own order, so a model held to the
    choices it makes anyway trains bit for bit as it does (2 layers: V4's hash and top-k routers and its sparse
    attention's indexer, V3's dense and MoE layers)."""
    import held_routing

    from trex.models import build_model, tiny_config

    config = tiny_config(family, num_layers=2)
    model = build_model(config, dtype=torch.bfloat16, seed=1)
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    choices = held_routing.record_routing(copy.deepcopy(model), lambda m: m(input_ids=ids, use_cache=False))
    expected = {"deepseek-v4": 2, "deepseek-v3": 1, "qwen3-moe": 2}[family]  # V4: layer 1's router and indexer
    assert len(choices) == expected, sorted(choices)
    held = held_routing.hold_routing(copy.deepcopy(model), choices)
    losses = []
    for m in (model, held):
        loss = m(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        losses.append(loss)
    assert torch.equal(*losses)
    for (name, p), q in zip(model.named_parameters(), held.parameters()):
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), name

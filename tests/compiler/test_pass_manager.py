"""The pass manager instruments every pass: dumps, decisions, disabling, fuel, errors, reproducers."""

import json
import subprocess
import sys
from typing import ClassVar

import pytest
import torch

import trex
from trex.pass_manager import Decision, PassContext, PassManager, PassResult, disabled_from_env, fuel_from_env
from trex.passes import DEFAULT_PIPELINE, resolve_pipeline
from trex.repro import load_dumped_graph


def _train_once(compiled, x):
    loss = compiled(x)
    loss.backward()
    return loss


def test_dump_dir_holds_runnable_graph_after_every_pass_and_decisions(small_moe, tmp_path):
    model, x = small_moe
    compiled = trex.compile(model, dump_dir=tmp_path)
    _train_once(compiled, x)
    graph_dir = tmp_path / "graph_0_joint"
    names = sorted(p.name for p in graph_dir.iterdir())
    assert names == [
        "000_capture.py",
        "001_canonicalize_moe.decisions.jsonl",
        "001_canonicalize_moe.py",
        "002_dead_code_elimination.decisions.jsonl",
        "002_dead_code_elimination.py",
        "003_triton_patterns.decisions.jsonl",
        "003_triton_patterns.py",
        "005_decompose_moe.decisions.jsonl",
        "005_decompose_moe.py",
        "006_reorder_comm.decisions.jsonl",
        "006_reorder_comm.py",
        "007_cost_driven_fusion.decisions.jsonl",
        "007_cost_driven_fusion.py",
        "backward.py",
        "forward.py",
        "lowering_backward.txt",
        "lowering_forward.txt",
        "summary.txt",
    ]
    for which in ("forward", "backward"):  # cpu_gemm_precision, compute_once, hoist_gradients: after the partition
        assert sorted(p.name for p in (tmp_path / f"graph_0_{which}").iterdir()) == [
            "000_capture.py",
            "004_cpu_gemm_precision.decisions.jsonl",
            "004_cpu_gemm_precision.py",
            "008_compute_once.decisions.jsonl",
            "008_compute_once.py",
            "009_hoist_gradients.decisions.jsonl",
            "009_hoist_gradients.py",
        ]
    header = (graph_dir / "001_canonicalize_moe.py").read_text().splitlines()[:2]
    assert "canonicalize_moe" in header[0]
    assert "took" in header[1] and "ms" in header[1] and "nodes" in header[1] and "(+" in header[1]
    decisions = [
        json.loads(line) for line in (graph_dir / "001_canonicalize_moe.decisions.jsonl").read_text().splitlines()
    ]
    assert len(decisions) == 4  # 2 layers x (forward, backward)
    assert {d["data"]["phase"] for d in decisions} == {"forward", "backward"}
    assert all(d["pass"] == "canonicalize_moe" and d["reason"] for d in decisions)


def test_dumped_graph_runs_as_a_script_and_loads_back_as_the_same_graph(small_moe, tmp_path):
    model, x = small_moe
    compiled = trex.compile(model, dump_dir=tmp_path)
    _train_once(compiled, x)
    script = tmp_path / "graph_0_joint" / "002_dead_code_elimination.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    gm, inputs = load_dumped_graph(script)
    joint = compiled.trex.graphs[0].joint
    ops = lambda g: [str(n.target) for n in g.graph.nodes if n.op == "call_function"]  # noqa: E731
    assert [o.rsplit(".", 1)[0] for o in ops(gm)] == [o.rsplit(".", 1)[0] for o in ops(joint)]


def test_trex_dump_environment_variable_is_honoured(small_moe, tmp_path, monkeypatch):
    monkeypatch.setenv("TREX_DUMP", str(tmp_path / "env"))
    model, x = small_moe
    _train_once(trex.compile(model), x)
    assert (tmp_path / "env" / "graph_0_joint" / "000_capture.py").exists()


def test_foreign_files_in_the_dump_dir_are_never_removed(small_moe, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "graph_0_joint").mkdir()
    (tmp_path / "graph_0_joint" / "keep.py").write_text("# mine too")
    model, x = small_moe
    for _ in range(2):  # the second compile replaces trex's own files only
        torch._dynamo.reset()
        compiled = trex.compile(model, dump_dir=tmp_path)
        _train_once(compiled, x)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "graph_0_joint" / "keep.py").read_text() == "# mine too"
    assert "notes.txt" in compiled.trex.compiler.foreign_dump_files
    assert (tmp_path / "graph_0_joint" / "001_canonicalize_moe.py").exists()


def test_trex_passes_disables_a_pass_by_name(small_moe, monkeypatch):
    monkeypatch.setenv("TREX_PASSES", "-canonicalize_moe")
    model, x = small_moe
    compiled = trex.compile(model)
    loss = _train_once(compiled, x)
    record = compiled.trex.graphs[0].report.records[0]
    assert record.name == "canonicalize_moe" and not record.ran and "disabled" in record.skipped_reason
    joint = compiled.trex.graphs[0].joint
    assert any(n.target == torch.ops.trex.moe_experts.default for n in joint.graph.nodes)
    torch.testing.assert_close(loss, model(x))


def test_fuel_bounds_the_number_of_rewrites(small_moe, monkeypatch):
    monkeypatch.setenv("TREX_FUEL", "1")
    model, x = small_moe
    compiled = trex.compile(model)
    _train_once(compiled, x)
    report = compiled.trex.graphs[0].report
    assert len(report.records[0].decisions) == 1
    assert not report.records[1].ran and "out of fuel" in report.records[1].skipped_reason
    fused = [n for n in compiled.trex.graphs[0].joint.graph.nodes if "moe_experts" in str(n.target)]
    assert len(fused) == 3  # one of the four fused nodes was inlined


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"TREX_PASSES": "canonicalize_moe"}, "starts with '-'"),
        ({"TREX_FUEL": "lots"}, "not an integer"),
        ({"TREX_FUEL": "-1"}, "negative"),
    ],
)
def test_malformed_environment_settings_are_explained(environ, message):
    with pytest.raises(trex.TrexError, match=message):
        disabled_from_env(environ) if "TREX_PASSES" in environ else fuel_from_env(environ)


def test_disabling_an_unknown_pass_lists_the_pipeline(small_moe, monkeypatch):
    monkeypatch.setenv("TREX_PASSES", "-no_such_pass")
    model, _ = small_moe
    with pytest.raises(trex.UnknownNameError, match="canonicalize_moe"):
        trex.compile(model).trex.compiler.pass_manager()


class _Explodes:
    """A pass that fails, to check what the user is told."""

    name: ClassVar[str] = "explodes"

    def run(self, gm, ctx):
        raise ValueError("boom")


def test_failing_pass_is_named_with_the_passes_before_it_and_a_reproducer(small_moe, tmp_path):
    model, x = small_moe
    compiled = trex.compile(model, passes=["canonicalize_moe", _Explodes()], dump_dir=tmp_path)
    with pytest.raises(trex.PassError) as failure:
        _train_once(compiled, x)
    message = str(failure.value)
    assert "pass 'explodes' failed" in message and "boom" in message
    assert "passes that ran before it: canonicalize_moe" in message
    assert "TREX_PASSES=-explodes" in message
    repro = tmp_path / "repro_graph_0_joint_explodes"
    assert (repro / "pipeline.txt").read_text().strip() == "explodes"
    gm, _ = load_dumped_graph(repro / "graph.py")
    assert not any(n.target == torch.ops.trex.moe_experts.default for n in gm.graph.nodes), (
        "the input of the failing pass, after canonicalize_moe"
    )


class _BreaksThenExplodes:
    """A pass that rewrites part of the graph and then fails."""

    name: ClassVar[str] = "breaks_then_explodes"

    def run(self, gm, ctx):
        output = next(n for n in gm.graph.nodes if n.op == "output")
        gm.graph.erase_node(output)
        raise ValueError("half done")


def test_reproducer_holds_the_failing_pass_input_not_its_half_done_rewrite(small_moe, tmp_path):
    model, x = small_moe
    passes = ["canonicalize_moe", "dead_code_elimination", _BreaksThenExplodes()]
    compiled = trex.compile(model, passes=passes, dump_dir=tmp_path)
    with pytest.raises(trex.PassError, match="half done"):
        _train_once(compiled, x)
    gm, _ = load_dumped_graph(tmp_path / "repro_graph_0_joint_breaks_then_explodes" / "graph.py")
    assert any(n.op == "output" for n in gm.graph.nodes), "the graph before the failing pass, rebuilt by replay"
    assert not any(n.target == torch.ops.trex.moe_experts.default for n in gm.graph.nodes)


def test_reproducer_script_replays_the_failure(small_moe, tmp_path):
    model, x = small_moe
    compiled = trex.compile(model, passes=["canonicalize_moe", _Explodes(), "dead_code_elimination"], dump_dir=tmp_path)
    with pytest.raises(trex.PassError):
        _train_once(compiled, x)
    repro = tmp_path / "repro_graph_0_joint_explodes"
    assert (repro / "pipeline.txt").read_text().strip() == "explodes,dead_code_elimination"
    result = subprocess.run([sys.executable, str(repro / "repro.py")], capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "pass 'explodes' failed" in result.stderr and "boom" in result.stderr


def test_pass_that_breaks_shape_propagation_is_caught_at_that_pass(small_moe):
    class WrongShape:
        name: ClassVar[str] = "wrong_shape"

        def run(self, gm, ctx):
            for node in gm.graph.nodes:
                if node.target == torch.ops.aten.mm.default:
                    node.args = (node.args[0], node.args[0])  # [M,K] @ [M,K]: does not type-check
                    return PassResult(modified=True)
            return PassResult(modified=False)

    model, x = small_moe
    compiled = trex.compile(model, passes=[WrongShape()])
    with pytest.raises(trex.PassError, match="wrong_shape"):
        _train_once(compiled, x)


def test_passes_never_print(small_moe, capsys):
    model, x = small_moe
    _train_once(trex.compile(model), x)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_pipeline_is_data_and_resolves_from_a_string():
    assert [p.name for p in resolve_pipeline(None)] == list(DEFAULT_PIPELINE)
    assert [p.name for p in resolve_pipeline("dead_code_elimination")] == ["dead_code_elimination"]
    with pytest.raises(trex.UnknownNameError, match="canonicalize_moe"):
        resolve_pipeline("canonicalise_moe")


def test_manager_rejects_objects_that_are_not_passes():
    with pytest.raises(trex.TrexError, match="not a pass"):
        PassManager([object()])


def test_dead_code_elimination_removes_unused_values_and_records_each():
    from torch import fx

    graph = fx.Graph()
    x = graph.placeholder("x")
    used = graph.call_function(torch.ops.aten.relu.default, (x,))
    unused = graph.call_function(torch.ops.aten.exp.default, (x,))
    graph.call_function(torch.ops.aten.neg.default, (unused,))
    graph.output(used)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(torch.randn(3))
    report = PassManager(resolve_pipeline("dead_code_elimination")).run(gm, PassContext())
    assert [d.subject for d in report.records[0].decisions] == ["neg_default", "exp_default"]
    assert [n.name for n in gm.graph.nodes] == ["x", "relu_default", "output"]


class _SeesPartitionedGraphs:
    """A pass of the partitioned stage that records which graphs it was run on."""

    name: ClassVar[str] = "sees_partitioned_graphs"
    stage: ClassVar[str] = "partitioned"

    def __init__(self):
        self.phases = []

    def run(self, gm, ctx):
        self.phases.append(ctx.phase)
        placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
        return PassResult(modified=False, decisions=[Decision("saw", ctx.phase, f"{placeholders} inputs")])


def test_a_partitioned_stage_pass_runs_on_the_forward_and_backward_graphs_and_reports_once(small_moe):
    model, x = small_moe
    seen = _SeesPartitionedGraphs()
    compiled = trex.compile(model, passes=["canonicalize_moe", seen], backend="eager")
    _train_once(compiled, x)
    assert seen.phases == ["forward", "backward"]
    report = compiled.trex.graphs[0].report
    assert [r.name for r in report.records] == ["canonicalize_moe", "sees_partitioned_graphs"]
    record = report.records[1]
    assert record.ran and [d.data["graph"] for d in record.decisions] == ["forward", "backward"]
    with torch.no_grad():  # an inference graph has no partition: the pass runs on it in pipeline order
        inference = trex.compile(model, passes=["canonicalize_moe", seen], backend="eager")
        inference(x)
    assert seen.phases[2:] == ["inference"]


def _storage_groups(gm):
    """Node names grouped by the storage their value's tensors share (the aliasing a propagation gives)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    groups = {}
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        for tensor in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(tensor, torch.Tensor):
                groups.setdefault(StorageWeakRef(tensor.untyped_storage()), set()).add(node.name)
    return sorted(sorted(group) for group in groups.values())


def _layouts(gm):
    def layout(value):
        if isinstance(value, torch.Tensor):
            return (tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype)
        if isinstance(value, (list, tuple)):
            return tuple(layout(v) for v in value)
        return value

    return [(node.name, layout(node.meta.get("val"))) for node in gm.graph.nodes if node.op != "output"]


def test_re_propagating_only_the_changed_nodes_gives_what_a_full_propagation_gives(small_moe):
    from trex.changed_shapes import NodeStates, propagate_changed_shapes
    from trex.graph_copy import copy_graph_module
    from trex.pass_manager import _fake_mode_of, fake_inputs, propagate_shapes

    model, x = small_moe
    compiled = trex.compile(model, passes=[])  # the joint graph as AOTAutograd traced it
    _train_once(compiled, x)
    gm = compiled.trex.graphs[0].joint
    before = NodeStates(gm)
    (rewrite,) = resolve_pipeline(["canonicalize_moe"])
    assert rewrite.run(gm, PassContext(target="cpu", phase="joint")).modified
    recomputed = propagate_changed_shapes(gm, before, _fake_mode_of(fake_inputs(gm)))
    full = copy_graph_module(gm)  # node metadata copied; a full propagation then recomputes every value
    propagate_shapes(full)
    assert _layouts(gm) == _layouts(full)
    assert _storage_groups(gm) == _storage_groups(full)
    computed = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    assert 0 < recomputed < len(computed), "the rewrite's nodes and what they reach, not every node"


def test_the_pipeline_hands_on_the_values_a_full_propagation_gives(small_moe):
    """After every default pass (the MoE layers' inlines copied from one trace per distinct op and shapes, each
    check re-propagating only what changed), the joint graph carries what a full propagation computes."""
    from trex.graph_copy import copy_graph_module
    from trex.pass_manager import propagate_shapes
    from trex.passes.decompose_moe import DecomposeMoe

    model, x = small_moe
    pipeline = [DecomposeMoe(force=True) if p.name == "decompose_moe" else p for p in resolve_pipeline(None)]
    compiled = trex.compile(model, passes=pipeline)  # as when Inductor leads: the MoE primitives decomposed
    _train_once(compiled, x)
    graph = compiled.trex.graphs[0]
    assert {r.name: r for r in graph.report.records}["decompose_moe"].modified
    full = copy_graph_module(graph.joint)
    propagate_shapes(full)
    assert _layouts(graph.joint) == _layouts(full)
    assert _storage_groups(graph.joint) == _storage_groups(full)


def test_a_trace_is_reused_only_for_the_same_key_and_input_layouts():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trex.graph_inline import TraceCache

    cache = TraceCache()
    with FakeTensorMode() as mode:
        a, b, wide = torch.empty(4, 8), torch.empty(4, 8), torch.empty(4, 16)
    first = cache.trace("double", lambda t: t * 2, [a], None)
    assert cache.trace("double", lambda t: t * 2, [b], None) is first and cache.hits == 1
    assert cache.trace("double", lambda t: t * 2, [wide], None) is not first  # another shape
    assert cache.trace("triple", lambda t: t * 3, [a], None) is not first  # another function
    assert cache.trace("double", lambda t: t * 2, [a.t()], None) is not first  # another stride
    assert cache.hits == 1 and mode is not None


def test_a_trace_with_symbolic_sizes_is_traced_afresh_not_cached():
    """A graph captured with dynamic shapes hands the pass SymInt sizes, which do not hash: the cache traces them
    each time instead of failing (the compiled generation of tests/workloads/test_or_clients.py failed so)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from trex.graph_inline import TraceCache

    cache = TraceCache()
    mode = FakeTensorMode(shape_env=ShapeEnv())
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = mode.from_tensor(torch.empty(5, 8), symbolic_context=context)
    assert isinstance(x.shape[0], torch.SymInt)
    first = cache.trace("double", lambda t: t * 2, [x], None)
    second = cache.trace("double", lambda t: t * 2, [x], None)
    assert first is not second and cache.hits == 0
    assert [n.target for n in first.graph.nodes if n.op == "call_function"] == [torch.ops.aten.mul.Tensor]

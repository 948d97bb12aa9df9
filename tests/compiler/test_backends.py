"""Backends are plugins: a toy backend defined here gets exactly the nodes it supports."""

import subprocess
import sys
import textwrap
from typing import ClassVar

import pytest
import torch

import trex
from trex.backends import Backend, available_backends, get_backend, register_backend, unregister_backend


class PointwiseMulAdd(Backend):
    """A toy backend: runs aten.mul and aten.add (by interpreting its subgraph), nothing else."""

    name: ClassVar[str] = "toy_muladd"
    SUPPORTED = (torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor)

    def __init__(self):
        self.lowered = []  # the subgraphs trex handed over
        self.calls = 0

    def supports(self, node):
        return node.op == "call_function" and node.target in self.SUPPORTED

    def lower(self, gm, example_inputs):
        assert all(n.target in self.SUPPORTED for n in gm.graph.nodes if n.op == "call_function")
        self.lowered.append(gm)

        def run(*args):
            self.calls += 1
            return torch.fx.Interpreter(gm).run(*args)

        return run


def test_toy_backend_receives_exactly_the_nodes_it_supports(small_moe):
    model, x = small_moe
    toy = PointwiseMulAdd()
    compiled = trex.compile(model, backend=toy)
    loss = compiled(x)
    loss.backward()
    torch.testing.assert_close(loss, model(x))

    forward = compiled.trex.graphs[0].lowerings["forward"]
    routed = {name for name, backend in forward.assignment.items() if backend == "toy_muladd"}
    expected = {n.name for n in compiled.trex.graphs[0].forward.graph.nodes if n.target in PointwiseMulAdd.SUPPORTED}
    assert routed == expected and routed
    assert all(b == "eager" for name, b in forward.assignment.items() if name not in routed)
    assert toy.lowered and toy.calls > 0  # its code ran in the training step
    assert forward.partitions and all(p[0] == "toy_muladd" for p in forward.partitions)


def test_backend_priority_order_decides_who_gets_a_node(small_moe):
    class MulOnly(PointwiseMulAdd):
        name: ClassVar[str] = "toy_mul"
        SUPPORTED = (torch.ops.aten.mul.Tensor,)

    model, x = small_moe
    compiled = trex.compile(model, backend=[MulOnly(), PointwiseMulAdd()])
    compiled(x).backward()
    assignment = compiled.trex.graphs[0].lowerings["forward"].assignment
    nodes = {n.name: n for n in compiled.trex.graphs[0].forward.graph.nodes}
    for name, backend in assignment.items():
        if nodes[name].target == torch.ops.aten.mul.Tensor:
            assert backend == "toy_mul"
        elif nodes[name].target == torch.ops.aten.add.Tensor:
            assert backend == "toy_muladd"


def test_a_supports_that_raises_counts_as_no_and_is_reported(small_moe):
    class Raises(PointwiseMulAdd):
        name: ClassVar[str] = "toy_raises"

        def supports(self, node):
            raise RuntimeError("cannot tell")

    model, x = small_moe
    compiled = trex.compile(model, backend=Raises())
    compiled(x).backward()
    lowering = compiled.trex.graphs[0].lowerings["forward"]
    assert set(lowering.assignment.values()) == {"eager"}
    assert any("raised RuntimeError: cannot tell" in note for note in lowering.notes)


def test_register_backend_makes_it_available_by_name(small_moe):
    register_backend(PointwiseMulAdd)
    try:
        assert "toy_muladd" in available_backends()
        model, x = small_moe
        compiled = trex.compile(model, backend="toy_muladd")
        compiled(x).backward()
        assert "toy_muladd" in compiled.trex.graphs[0].lowerings["forward"].counts()
        with pytest.raises(trex.BackendError, match="already registered"):
            register_backend(PointwiseMulAdd)
    finally:
        unregister_backend("toy_muladd")


def test_unknown_backend_and_target_names_list_the_valid_ones(small_moe):
    model, _ = small_moe
    with pytest.raises(trex.UnknownNameError, match=r"valid backends: (\w+, )*eager"):
        trex.compile(model, backend="tritn")
    with pytest.raises(trex.UnknownNameError, match="ascend-910b") as error:
        trex.compile(model, target="h1000")
    assert "did you mean 'h100'" in str(error.value)


def test_target_that_executes_elsewhere_explains_itself(small_moe):
    model, _ = small_moe
    with pytest.raises(trex.TrexError, match="executes on cuda devices, but the model's parameters are on cpu"):
        trex.compile(model, target="h100")


def test_reserved_and_nameless_backends_are_refused():
    with pytest.raises(trex.BackendError, match="reserved"):
        register_backend(type("Eager2", (PointwiseMulAdd,), {"name": "eager"}))
    with pytest.raises(trex.BackendError, match="no `name`"):
        register_backend(type("Nameless", (), {"supports": lambda s, n: False, "lower": lambda s, g, i: g}))


def test_entry_point_group_trex_backends_is_discovered(tmp_path):
    """A pip-installed plugin: a dist-info declaring [trex.backends] is enough, no import needed."""
    package = tmp_path / "toy_plugin.py"
    package.write_text(
        textwrap.dedent("""
        from trex.backends import Backend

        class Plugin(Backend):
            name = "toy_plugin"
            def supports(self, node):
                return False
            def lower(self, gm, example_inputs):
                return gm
    """)
    )
    dist = tmp_path / "toy_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[trex.backends]\ntoy_plugin = toy_plugin:Plugin\n")
    code = "import trex; b = trex.get_backend('toy_plugin'); print(type(b).__name__, 'toy_plugin' in trex.available_backends())"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["Plugin", "True"]


def test_get_backend_returns_instances_unchanged():
    toy = PointwiseMulAdd()
    assert get_backend(toy) is toy
    assert get_backend("eager").name == "eager"

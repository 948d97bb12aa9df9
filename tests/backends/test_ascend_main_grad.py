"""Gradient-accumulation fusion (by default in `AscendBackend` for fp32 parameters and for Megatron's contract;
bf16 parameters with a `.grad` optimizer take eager's dtype flow): the routed experts' weight gradients
accumulate in place into a persistent float32 `param.main_grad` through `npu_grouped_matmul_add_`,
with no per-backward zero-fill or cast; over several backwards the buffer holds eager's summed gradient."""

from __future__ import annotations

import copy

import pytest
import torch

import trex
from trex.backends.ascend import AscendBackend
from trex.backends.ascend.main_grad import main_grad_of, main_grads_to_grads, zero_main_grads
from trex.backends.ascend.schemas import AscendSchemaError, check_call
from trex.graph_copy import copy_graph_module


def test_in_place_grouped_matmul_add_accumulates_into_self():
    torch.manual_seed(0)
    x, dy = torch.randn(7, 4), torch.randn(7, 5)
    group_list = torch.tensor([2, 2, 7])  # group 1 is empty
    start = torch.randn(3, 4, 5)
    functional = torch.ops.npu_emul.npu_grouped_matmul_add(start, x, dy, group_list)
    buffer = start.clone()
    result = torch.ops.npu_emul.npu_grouped_matmul_add_(buffer, x, dy, group_list)
    assert result is buffer
    torch.testing.assert_close(buffer, functional)
    torch.testing.assert_close(buffer[0] - start[0], x[:2].t() @ dy[:2])
    torch.testing.assert_close(buffer[1], start[1])
    with pytest.raises(AscendSchemaError, match="'self' must be float32"):
        torch.ops.npu_emul.npu_grouped_matmul_add_(buffer.bfloat16(), x, dy, group_list)


class _Experts(torch.nn.Module):
    """Routed experts through trex's fused experts op (as trex.compile routes transformers' experts)."""

    def __init__(self, experts=4, hidden=8, inner=8, dtype=torch.float32):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(experts, 2 * inner, hidden, dtype=dtype))
        self.down_proj = torch.nn.Parameter((torch.randn(experts, hidden, inner) * 0.3).to(dtype))
        self.proj = torch.nn.Linear(hidden, hidden, dtype=dtype)

    def forward(self, x, index, weights):
        import trex.ops.moe  # noqa: F401 - registers torch.ops.trex

        out = torch.ops.trex.moe_experts(
            self.proj(x), index, weights, self.gate_up_proj, self.down_proj, "silu", 0.0, False
        )
        return (out[0].float() * torch.linspace(-1, 1, x.size(-1))).sum()


def _close(actual, expected, dtype, what):
    """fp32: tight; bf16: within 2% of the gradient's largest entry (eager rounds each micro-batch's gradient
    and their sum to bf16, the fused token ops round once, main_grad sums in float32)."""
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5, msg=what)
    else:
        error = (actual.float() - expected.float()).abs().max()
        assert error <= 2e-2 * expected.float().abs().max(), f"{what}: max error {error}"


def _batch(seed, dtype):
    generator = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(4, generator=generator)[:2] for _ in range(10)])
    return torch.randn(10, 8, generator=generator).to(dtype), index, torch.rand(10, 2, generator=generator).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_megatron_contract_expert_weight_gradients_only_in_main_grad_like_eager(dtype):
    torch.manual_seed(0)
    model = _Experts(dtype=dtype)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=[AscendBackend(publish_grads=False)])  # Megatron's contract
    for step in range(2):  # two micro-batches: the buffer sums them, as eager's .grad does
        batch = _batch(step, dtype)
        loss, expected = compiled(*batch), reference(*batch)
        loss.backward()
        expected.backward()
        rtol, atol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-2, 1e-2)
        torch.testing.assert_close(loss, expected, rtol=rtol, atol=atol)
    for name in ("gate_up_proj", "down_proj"):
        param, eager = getattr(model, name), getattr(reference, name)
        assert param.grad is None, f"{name}: the graph still returned a gradient"
        assert param.main_grad.dtype == torch.float32
        _close(param.main_grad, eager.grad.float(), dtype, name)
    _close(model.proj.weight.grad, reference.proj.weight.grad, dtype, "proj.weight")

    emitted = compiled.trex.lowered_ops()["ascend"]
    assert emitted.count("npu_grouped_matmul_add_") == 2 and "npu_grouped_matmul_add" not in emitted
    lowered = [
        child.compiled.module
        for lowering in compiled.trex.graphs[0].lowerings.values()
        for child in lowering.module.children()
        if hasattr(getattr(child, "compiled", None), "module")
    ]
    calls = [n for gm in lowered for n in gm.graph.nodes if n.meta.get("trex_npu_op") == "npu_grouped_matmul_add_"]
    assert len(calls) == 2
    for call in calls:
        check_call("npu_grouped_matmul_add_", call.args, call.kwargs)  # torch_npu's schema, from the wheel
    # no per-backward accumulator: no zero-fill and no float32 result cast back among the glue
    backend = next(b for b in compiled.trex.options.backends if b.name == "ascend")
    glue = {op for report in backend.reports for op in report.glue_by_op}
    assert not any("zeros" in op for op in glue), glue
    assert "2 expert weight gradient(s) accumulate in place into float32 `main_grad`" in compiled.trex.summary()

    # outputs that do not line up with the parameters (unknown or a different count): nothing is rewritten
    backward = compiled.trex.graphs[0].backward
    parameters = compiled.trex.graphs[0].graph_inputs
    for inputs, rewritten in ((parameters, 2), (None, 0), (parameters[:-1], 0)):
        copy_ = copy_graph_module(backward)
        backend.prepare(copy_, "backward", inputs)
        assert sum(1 for n in copy_.graph.nodes if n.meta.get("trex_npu_op")) == rewritten

    # the optimizer's step: .grad from main_grad once, then one zero-fill for the next step
    assert main_grads_to_grads(model) == 2
    assert model.down_proj.grad.dtype == dtype
    _close(model.down_proj.grad, reference.down_proj.grad, dtype, "down_proj.grad")
    assert zero_main_grads(model) == 2 and not model.down_proj.main_grad.any()


def test_a_main_grad_of_the_wrong_kind_is_refused():
    param = torch.nn.Parameter(torch.randn(2, 3))
    param.main_grad = torch.zeros(2, 3, dtype=torch.bfloat16)
    with pytest.raises(AscendSchemaError, match="float32"):
        main_grad_of(param)


def test_a_wrong_in_place_accumulation_call_is_caught_naming_op_and_argument():
    x = torch.zeros(4, 3)
    with pytest.raises(AscendSchemaError, match=r"npu_grouped_matmul_add_: argument 'group_type'"):
        check_call("npu_grouped_matmul_add_", (x, x, x, x), {"group_type": 2.0})  # int in torch_npu's schema
    with pytest.raises(AscendSchemaError, match=r"npu_grouped_matmul_add_: no argument named 'transpose_a'"):
        check_call("npu_grouped_matmul_add_", (x, x, x, x), {"transpose_a": True})


@pytest.mark.parametrize(
    ("dtype", "main_grad"),
    [(torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, True)],
    ids=["fp32-default", "bf16-default", "bf16-main_grad"],
)
def test_ascend_keeps_torch_grad_contract_for_a_plain_optimizer(dtype, main_grad):
    """backend=["ascend"] leaves `.grad` as torch would: over three optimizer steps of two micro-batches
    (zero_grad with and without set_to_none, an in-place clip of .grad, a .grad the user set by hand) a plain
    torch SGD sees eager's gradients and ends at eager's weights. fp32 parameters (default) accumulate in place
    into main_grad, which is .grad; bf16 parameters by default take eager's dtype flow (a K-split
    npu_grouped_matmul in bf16, no main_grad); AscendBackend(main_grad=True) sums them in an fp32 main_grad and
    publishes a bf16 cast after each backward."""
    torch.manual_seed(0)
    model = _Experts(dtype=dtype)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=["ascend" if main_grad is None else AscendBackend(main_grad=main_grad)])
    accumulates = dtype == torch.float32 or main_grad is True
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    experts = ("gate_up_proj", "down_proj")
    for step in range(3):
        if step == 2:  # a .grad set by hand before the backward: autograd adds to it, so must the graph
            for m in (model, reference):
                m.down_proj.grad = torch.full_like(m.down_proj, 0.25)
        for micro in range(2):
            batch = _batch(10 * step + micro, dtype)
            compiled(*batch).backward()
            reference(*batch).backward()
        for name in experts:
            param, eager = getattr(model, name), getattr(reference, name)
            assert param.grad is not None and param.grad.dtype == dtype, name
            if accumulates:
                assert (param.grad is param.main_grad) == (dtype == torch.float32), name  # fp32: no copy at all
            else:
                assert getattr(param, "main_grad", None) is None, name
            _close(param.grad, eager.grad, dtype, f"step {step} {name}")
        if step == 1:  # in place on .grad (a bf16 .grad is a cast of main_grad: the next backward notices)
            for m in (model, reference):
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
        optimizer.step()
        reference_optimizer.step()
        optimizer.zero_grad(set_to_none=step != 0)  # step 0: zero in place (fp32: zeroes main_grad itself)
        reference_optimizer.zero_grad(set_to_none=step != 0)
    for name in (*experts, "proj.weight"):
        actual, expected = model.get_parameter(name), reference.get_parameter(name)
        _close(actual, expected, dtype, f"{name} after 3 steps")
    emitted = compiled.trex.lowered_ops()["ascend"]
    k_split = [n for n in _npu_calls(compiled, "npu_grouped_matmul") if n.kwargs.get("group_type") == 2]
    assert emitted.count("npu_grouped_matmul_add_") == (2 if accumulates else 0)
    assert len(k_split) == (0 if accumulates else 2)  # gate_up and down
    assert ("published to .grad after each backward" in compiled.trex.summary()) == accumulates


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_main_grad_can_be_turned_off(dtype):
    """AscendBackend(main_grad=False): no main_grad buffer on any parameter; each expert weight gradient is one
    K-split npu_grouped_matmul(group_type=2) writing the parameter's dtype, as eager's GEMM does (no fp32
    accumulator to zero-fill, no cast back), bound against the wheel's schema."""
    torch.manual_seed(0)
    model = _Experts(dtype=dtype)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=[AscendBackend(main_grad=False)])
    batch = _batch(0, dtype)
    compiled(*batch).backward()
    reference(*batch).backward()
    emitted = compiled.trex.lowered_ops()["ascend"]
    assert "npu_grouped_matmul_add" not in emitted and "npu_grouped_matmul_add_" not in emitted, emitted
    k_split = [n for n in _npu_calls(compiled, "npu_grouped_matmul") if n.kwargs.get("group_type") == 2]
    assert len(k_split) == 2  # gate_up and down
    for node in k_split:
        check_call("npu_grouped_matmul", node.args, node.kwargs)
        assert node.meta["val"][0].dtype == dtype and node.meta["val"][0].dim() == 3
    for (name, param), eager in zip(model.named_parameters(), reference.parameters()):
        assert getattr(param, "main_grad", None) is None, name
        _close(param.grad, eager.grad, dtype, name)


def _npu_calls(compiled, op):
    return [
        node
        for lowering in compiled.trex.graphs[0].lowerings.values()
        for child in lowering.module.children()
        if hasattr(getattr(child, "compiled", None), "module")
        for node in child.compiled.module.graph.nodes
        if node.meta.get("trex_npu_op") == op
    ]

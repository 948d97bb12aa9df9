"""Every torch_npu op the Ascend backend emits has a cost formula of its own, read from the call's tensor shapes
and priced on the ascend-910c profile; none is priced 0 (a 0 would under-count the fused share)."""

from __future__ import annotations

import pytest
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode

from trex.backends.ascend import emulation
from trex.backends.ascend.schemas import EMITTED_OPS
from trex.cost_model.annotate import annotate_node, cluster_of
from trex.cost_model.op_formulas import formula_for


@pytest.mark.parametrize("name", EMITTED_OPS)
def test_every_emitted_op_has_a_formula_under_both_namespaces(name):
    formula = formula_for(emulation.op(name, emulate=True))
    assert formula is not None, name
    assert formula.kind not in ("view", "sync"), (name, formula.kind)  # a kind priced 0 by construction


def _call(op_name, args, kwargs=None):
    """One fx call of the emulated op with FakeTensor metadata, as the backend's lowered graphs carry it."""
    graph = fx.Graph()
    mode = FakeTensorMode()
    with mode:
        fake = [torch.empty(a[0], dtype=a[1]) if isinstance(a, tuple) and isinstance(a[0], list) else a for a in args]
        target = emulation.op(op_name, emulate=True)
        nodes = []
        for value in fake:
            if isinstance(value, torch.Tensor):
                node = graph.placeholder(f"a{len(nodes)}")
                node.meta["val"] = value
                nodes.append(node)
            else:
                nodes.append(value)
        call = graph.call_function(target, tuple(nodes), kwargs or {})
        call.meta["val"] = target(*fake, **(kwargs or {}))
    return call


def _price(call):
    cost = annotate_node(call, cluster_of("ascend-910c"))
    assert cost.priced and cost.time_s > 0, cost
    return cost


def test_rotary_mul_is_priced_from_its_shapes_and_scales_with_them():
    """x * r1 + rotate(x) * r2: 3 FLOPs per output element; x, both tables and the output moved once."""
    x, table = ([1, 8, 64, 64], torch.bfloat16), ([1, 1, 64, 64], torch.bfloat16)
    small = _price(_call("npu_rotary_mul", [x, table, table, "interleave"]))
    assert small.flops == 3 * 8 * 64 * 64
    assert small.bytes == 2 * (2 * 8 * 64 * 64 + 2 * 64 * 64)
    x, table = ([1, 8, 4096, 64], torch.bfloat16), ([1, 1, 4096, 64], torch.bfloat16)
    big = _price(_call("npu_rotary_mul", [x, table, table, "interleave"]))
    device = cluster_of("ascend-910c").device
    assert big.time_s >= big.bytes / device.hbm_bytes_per_s > small.bytes / device.hbm_bytes_per_s
    assert big.time_s > small.time_s >= device.kernel_overhead_s


def test_rotary_mul_backward_counts_the_input_gradient_and_both_table_gradients():
    g, table = ([2, 4, 16, 32], torch.float32), ([1, 1, 16, 32], torch.float32)
    cost = _price(_call("npu_rotary_mul_backward", [g, g, table, table, "half"]))
    assert cost.flops == 7 * 2 * 4 * 16 * 32  # dx 3, dr1 2, dr2 2 per gradient element
    assert cost.bytes == 4 * (3 * 2 * 4 * 16 * 32 + 4 * 16 * 32)  # grad, x, r1, r2 in; dx, dr1, dr2 out


def test_grouped_matmul_add_prices_the_weight_gradient_gemm_at_its_inputs_precision():
    """group_type 2: fp32 self [E, K, N] += x_e^T @ dy_e; the GEMM runs in bf16 (its inputs), not at fp32's rate."""
    experts, rows, k, n = 8, 4096, 1024, 512
    acc, x, dy = ([experts, k, n], torch.float32), ([rows, k], torch.bfloat16), ([rows, n], torch.bfloat16)
    groups = ([experts], torch.int64)
    cost = _price(_call("npu_grouped_matmul_add_", [acc, x, dy, groups]))
    assert cost.flops == 2 * rows * k * n
    assert cost.bytes == 2 * rows * (k + n) + 2 * 4 * experts * k * n
    device = cluster_of("ascend-910c").device
    assert cost.time_s < cost.flops / device.peak_flops("fp32")  # faster than fp32 peak: priced as bf16


def test_grouped_matmul_forward_binds_its_tensor_list_arguments():
    """npu_grouped_matmul([x], [w], group_list=..., group_type=0): x [S, K] times w [E, K, N]."""
    graph = fx.Graph()
    with FakeTensorMode():
        values = {
            "x": torch.empty(512, 64, dtype=torch.bfloat16),
            "w": torch.empty(4, 64, 96, dtype=torch.bfloat16),
            "g": torch.empty(4, dtype=torch.int64),
        }
        nodes = {}
        for name, value in values.items():
            nodes[name] = graph.placeholder(name)
            nodes[name].meta["val"] = value
        target = emulation.op("npu_grouped_matmul", emulate=True)
        options = {"split_item": 3, "group_type": 0, "group_list_type": 0}
        call = graph.call_function(target, ([nodes["x"]], [nodes["w"]]), {"group_list": nodes["g"], **options})
        call.meta["val"] = target([values["x"]], [values["w"]], group_list=values["g"], **options)
    cost = _price(call)
    assert cost.flops == 2 * 512 * 64 * 96
    assert cost.bytes == 2 * (512 * 64 + 4 * 64 * 96 + 512 * 96) + 8 * 4  # x, w, out; the int64 group list


def test_k_split_grouped_matmul_is_priced_as_a_weight_gradient_gemm():
    """npu_grouped_matmul([a^T], [dy], group_type=2): a^T [K, S] times dy [S, N] -> [E, K, N] in bf16."""
    graph = fx.Graph()
    with FakeTensorMode():
        values = {
            "a_t": torch.empty(1024, 4096, dtype=torch.bfloat16),
            "dy": torch.empty(4096, 512, dtype=torch.bfloat16),
            "g": torch.empty(8, dtype=torch.int64),
        }
        nodes = {}
        for name, value in values.items():
            nodes[name] = graph.placeholder(name)
            nodes[name].meta["val"] = value
        target = emulation.op("npu_grouped_matmul", emulate=True)
        options = {"split_item": 3, "group_type": 2, "group_list_type": 0}
        call = graph.call_function(target, ([nodes["a_t"]], [nodes["dy"]]), {"group_list": nodes["g"], **options})
        call.meta["val"] = target([values["a_t"]], [values["dy"]], group_list=values["g"], **options)
    assert tuple(call.meta["val"][0].shape) == (8, 1024, 512)
    cost = _price(call)
    assert cost.flops == 2 * 4096 * 1024 * 512
    assert cost.bytes == 2 * (4096 * 1024 + 4096 * 512 + 8 * 1024 * 512) + 8 * 8
    device = cluster_of("ascend-910c").device
    # the device's GEMM model over [K, S_e] x [S_e, N] per expert, in bf16
    assert cost.time_s == pytest.approx(device.gemm_time(1024, 512, 4096 / 8, "bf16", 8), rel=1e-9)

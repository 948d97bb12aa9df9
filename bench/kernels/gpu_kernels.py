"""What bench/kernels/gpu_check.sh runs: trex's Triton kernels compiled for a GPU and timed against
Liger-Kernel and Inductor (torch.compile of the reference) at DeepSeek-V4-Flash layer shapes; fused
linear+CE peak memory against Liger's; expert GEMM throughput (`torch._grouped_mm` vs a per-expert loop
on 4 CUDA streams) at 256-4096 rows per expert for Qwen3-235B and DeepSeek-V4 expert shapes; one MoE
layer's forward+backward host time vs device time, eager and as a CUDA graph.

    python bench/kernels/gpu_kernels.py --out DIR          (a CUDA device)
    python bench/kernels/gpu_kernels.py --dry-run          (CPU, toy shapes, Triton interpreter: checks the code runs)

Every timed kernel is first checked against its reference (forward and backward) at the timed shape; the
router kernel's choice on tied rows is compared with torch.topk's on the device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

# DeepSeek-V4-Flash (transformers DeepseekV4Config defaults): hidden 4096, experts 256 x 2048, top-6,
# vocab 129280, rope dim 64. Qwen3-235B-A22B: hidden 4096, experts 128 x 1536, top-8.
V4 = {"hidden": 4096, "intermediate": 2048, "experts": 256, "top_k": 6, "vocab": 129280, "rope_dim": 64, "heads": 64}
QWEN3_235B = {"hidden": 4096, "intermediate": 1536, "experts": 128, "top_k": 8}
TOKENS = 4096  # one micro-batch of tokens per device


def timed(fn, device, repeat=20):
    """Median seconds of fn() (device time on CUDA via events)."""
    import torch

    fn()
    samples = []
    for _ in range(repeat):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def fwd_bwd(op, inputs, trained):
    """A closure running op forward and backward on fresh leaves (what is timed)."""
    import torch

    leaves = [t.detach().requires_grad_(i in trained) for i, t in enumerate(inputs)]

    def run():
        out = op(*leaves)
        out.backward(torch.ones_like(out))
        for leaf in leaves:
            leaf.grad = None

    return run


def liger(name, labels):
    """A Liger-Kernel callable with the timed op's signature, or the reason it is unavailable."""
    try:
        if name == "rms_norm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            return lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-6)
        if name == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            return LigerSiLUMulFunction.apply
        if name == "rope":
            from liger_kernel.ops.rope import LigerRopeFunction

            return lambda q, cos, sin: LigerRopeFunction.apply(q, q.clone(), cos, sin)[0]
        if name == "linear_cross_entropy":
            from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

            return lambda h, w: LigerFusedLinearCrossEntropyFunction.apply(h, w, labels)[0]
    except Exception as error:  # noqa: BLE001 - reported in the table
        return f"unavailable: {type(error).__name__}: {error}"
    return "unavailable: no Liger counterpart"


def kernel_cases(device, dry):
    import torch

    from trex.backends.triton.kernels import (
        grouped_gemm,
        linear_cross_entropy,
        moe_permute,
        rms_norm,
        rope,
        router,
        swiglu,
    )

    dtype = torch.float32 if dry else torch.bfloat16
    tokens = 64 if dry else TOKENS
    hidden = 48 if dry else V4["hidden"]
    inter = 32 if dry else V4["intermediate"]
    experts = 4 if dry else V4["experts"]
    vocab = 1100 if dry else V4["vocab"]
    rope_dim = 16 if dry else V4["rope_dim"]
    heads = 2 if dry else V4["heads"]
    mk = lambda *shape: torch.randn(*shape, device=device, dtype=dtype)  # noqa: E731
    rows = tokens * (2 if dry else V4["top_k"])
    offsets = torch.cumsum(torch.bincount(torch.randint(0, experts, (rows,), device=device), minlength=experts), 0).to(
        torch.int32
    )
    angles = torch.randn(1, tokens, rope_dim // 2, device=device)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    labels = torch.randint(0, vocab, (tokens,), device=device)
    kernel_cases.labels = labels  # Liger's linear+CE takes the same labels
    top_k = 2 if dry else V4["top_k"]
    index = torch.randint(0, experts, (tokens, top_k), device=device)
    _, _, inverse, _ = moe_permute.moe_permute_reference(torch.empty(tokens, 1, device=device), index, experts)
    bias = torch.randn(experts, device=device) * 0.01  # the aux-free balancing bias (fp32, as the models keep it)
    # V4 scores with sqrt(softplus) over its experts, normalises and scales by 2.5 (routed_scaling_factor)
    route = (top_k, "sqrtsoftplus", True, 1e-20, 2.5)
    # DeepSeek-V3: sigmoid, 8 groups of 32 experts, the best 4 groups kept, top-8, scaled by 2.5
    route_v3 = (2, "sigmoid", True, 1e-20, 2.5, 2, 1) if dry else (8, "sigmoid", True, 1e-20, 2.5, 8, 4)
    return [
        (
            "rms_norm",
            lambda x, w: rms_norm.rms_norm(x, w, 1e-6),
            lambda x, w: rms_norm.rms_norm_reference(x, w, 1e-6),
            [mk(tokens, hidden), mk(hidden)],
            (0, 1),
        ),
        ("swiglu", swiglu.swiglu, swiglu.swiglu_reference, [mk(rows, inter), mk(rows, inter)], (0, 1)),
        ("rope", rope.rope, rope.rope_reference, [mk(1, heads, tokens, rope_dim), cos, sin], (0,)),
        (
            "grouped_gemm",
            lambda x, w: grouped_gemm.grouped_mm(x, w, offsets),
            lambda x, w: grouped_gemm.grouped_mm_reference(x, w, offsets),
            [mk(rows, hidden), mk(experts, hidden, 2 * inter) * hidden**-0.5],
            (0, 1),
        ),
        (
            "moe_permute",
            lambda h: moe_permute.moe_permute(h, index, experts)[0],
            lambda h: moe_permute.moe_permute_reference(h, index, experts)[0],
            [mk(tokens, hidden)],
            (0,),
        ),
        (
            "moe_unpermute",
            lambda out, w: moe_permute.moe_unpermute(out, inverse, w),
            lambda out, w: moe_permute.moe_unpermute_reference(out, inverse, w),
            [mk(rows, hidden), torch.rand(tokens, top_k, device=device)],
            (0, 1),
        ),
        (
            "router_topk",
            lambda logits: router.router_topk(logits, bias, *route)[0],
            lambda logits: router.router_topk_reference(logits, bias, *route)[0],
            [torch.randn(tokens, experts, device=device)],
            (0,),
        ),
        (
            "router_topk_grouped",
            lambda logits: router.router_topk(logits, bias, *route_v3)[0],
            lambda logits: router.router_topk_reference(logits, bias, *route_v3)[0],
            [torch.randn(tokens, experts, device=device)],
            (0,),
        ),
        (
            "router_weights",
            lambda logits: router.router_weights(logits, index, "sqrtsoftplus", True, 1e-20, 1.5),
            lambda logits: router.router_weights_reference(logits, index, "sqrtsoftplus", True, 1e-20, 1.5),
            [torch.randn(tokens, experts, device=device)],
            (0,),
        ),
        (
            "linear_cross_entropy",
            lambda h, w: linear_cross_entropy.linear_cross_entropy(h, w, labels, -100, 1024),
            lambda h, w: linear_cross_entropy.linear_cross_entropy_reference(h, w, labels),
            [mk(tokens, hidden), mk(vocab, hidden) * hidden**-0.5],
            (0, 1),
        ),
    ]


def check_against_reference(op, reference, inputs, trained, dtype):
    import torch

    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    a = [t.detach().clone().requires_grad_(i in trained) for i, t in enumerate(inputs)]
    b = [t.detach().clone().requires_grad_(i in trained) for i, t in enumerate(inputs)]
    out, expected = op(*a), reference(*b)
    torch.testing.assert_close(out.float(), expected.float(), **tol)
    grad = torch.randn_like(expected)
    out.backward(grad)
    expected.backward(grad)
    for x, y in zip(a, b):
        if x.requires_grad:
            torch.testing.assert_close(x.grad.float(), y.grad.float(), **tol)


def bench_kernels(device, dry):
    import torch

    rows = []
    for name, op, reference, inputs, trained in kernel_cases(device, dry):
        check_against_reference(op, reference, inputs, trained, inputs[0].dtype)
        row = {"kernel": name, "trex_s": timed(fwd_bwd(op, inputs, trained), device, 3 if dry else 20)}
        compiled = torch.compile(reference) if not dry else reference
        row["inductor_s"] = timed(fwd_bwd(compiled, inputs, trained), device, 3 if dry else 20)
        theirs = liger(name, kernel_cases.labels)
        if callable(theirs) and not dry:
            row["liger_s"] = timed(fwd_bwd(theirs, inputs, trained), device)
        else:
            row["liger_s"] = theirs if isinstance(theirs, str) else "skipped in --dry-run"
        if name == "linear_cross_entropy" and device == "cuda":
            row.update(linear_ce_memory(op, reference, theirs, inputs))
        rows.append(row)
    return rows


def linear_ce_memory(op, reference, theirs, inputs):
    """Peak CUDA memory of forward+backward above the inputs: trex's chunked op, the unfused reference, Liger."""
    import torch

    result = {}
    for label, fn in (("trex", op), ("reference", reference), ("liger", theirs if callable(theirs) else None)):
        if fn is None:
            continue
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        h, w = (t.detach().requires_grad_() for t in inputs)
        fn(h, w).backward()
        torch.cuda.synchronize()
        result[f"{label}_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return result


def bench_expert_gemm(device, dry):
    """TFLOP/s of one expert layer's gate/up GEMM: torch._grouped_mm vs a per-expert loop on 4 streams."""
    import torch

    rows = []
    for model, shape in (("qwen3-235b", QWEN3_235B), ("deepseek-v4", V4)):
        experts = 4 if dry else shape["experts"] // 8  # the experts of one EP=8 rank
        hidden, inter = (32, 16) if dry else (shape["hidden"], shape["intermediate"])
        for per_expert in (16, 32) if dry else (256, 512, 1024, 2048, 4096):
            x = torch.randn(
                experts * per_expert, hidden, device=device, dtype=torch.bfloat16 if not dry else torch.float32
            )
            w = torch.randn(experts, hidden, 2 * inter, device=device, dtype=x.dtype)
            offsets = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * per_expert
            flops = 2 * x.size(0) * hidden * 2 * inter
            grouped = timed(lambda: torch._grouped_mm(x, w, offs=offsets), device, 3 if dry else 20)
            if device == "cuda":
                streams = [torch.cuda.Stream() for _ in range(4)]

                def loop():
                    for e in range(experts):
                        with torch.cuda.stream(streams[e % 4]):
                            x[e * per_expert : (e + 1) * per_expert] @ w[e]
                    for s in streams:
                        torch.cuda.current_stream().wait_stream(s)
            else:

                def loop():
                    for e in range(experts):
                        x[e * per_expert : (e + 1) * per_expert] @ w[e]

            looped = timed(loop, device, 3 if dry else 20)
            rows.append(
                {
                    "model": model,
                    "rows_per_expert": per_expert,
                    "experts": experts,
                    "grouped_tflops": flops / grouped / 1e12,
                    "loop4_tflops": flops / looped / 1e12,
                }
            )
    return rows


def bench_moe_layer_host_vs_device(device, dry):
    """One MoE layer (trex.moe_experts) forward+backward: host (CPU wall) vs device time; eager and CUDA graph."""
    import torch

    import trex.ops  # noqa: F401

    shape = V4
    tokens, hidden, inter, experts, top_k = (
        (32, 16, 8, 4, 2)
        if dry
        else (TOKENS, shape["hidden"], shape["intermediate"], shape["experts"] // 8, shape["top_k"])
    )
    dtype = torch.float32 if dry else torch.bfloat16
    x = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    gate_up = torch.randn(experts, 2 * inter, hidden, device=device, dtype=dtype, requires_grad=True)
    down = torch.randn(experts, hidden, inter, device=device, dtype=dtype, requires_grad=True)
    weights, index = torch.topk(torch.randn(tokens, experts, device=device).softmax(-1), top_k)

    def layer():
        out = torch.ops.trex.moe_experts(x, index, weights.to(dtype), gate_up, down, "silu", 0.0, False)[0]
        out.sum().backward()

    def layer_without_host_syncs():
        """The same layer from sync-free pieces (trex.moe_dispatch counts experts with bincount, whose CUDA
        kernel reads the largest id on the host, which a CUDA graph capture forbids): the aten form that
        passes.decompose_moe inlines, differentiated by autograd."""
        from trex.ops import moe_decompositions as aten_form

        sorted_x, perm, offsets, inverse = aten_form.moe_dispatch(x, index, experts)
        offsets = offsets.to(torch.int32)
        gate, up = torch._grouped_mm(sorted_x, gate_up.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
        expert_out = torch._grouped_mm(torch.nn.functional.silu(gate) * up, down.transpose(-2, -1), offs=offsets)
        aten_form.moe_combine(expert_out, inverse, weights.to(dtype)).sum().backward()

    result = {}
    for label, fn in (("eager", layer), ("eager_sync_free", layer_without_host_syncs)):
        start = time.perf_counter()
        fn()
        host = time.perf_counter() - start
        result[f"{label}_host_s"] = host
        result[f"{label}_device_s"] = timed(fn, device, 3 if dry else 20)
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()  # capture needs its warm-up (autograd's first run) off the default stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                layer_without_host_syncs()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            layer_without_host_syncs()
        start = time.perf_counter()
        graph.replay()
        result["cuda_graph_host_s"] = time.perf_counter() - start
        result["cuda_graph_device_s"] = timed(graph.replay, device)
    return result


def router_ties(device):
    """Whether router_topk picks, on rows full of equal choices, the experts torch.topk picks on this device
    (the kernel keeps the lower id among equal choices, as CUDA's topk does; a CPU's topk does not), flat
    and with DeepSeek-V3's group limit computed by eager's own ops."""
    import torch

    from trex.backends.triton.kernels import router

    experts, top_k = 256, 8
    logits = torch.cat(
        [torch.zeros(4, experts), torch.tensor([0.5, 1.0, 1.0, 0.5]).repeat(4, experts // 4), torch.randn(8, experts)]
    ).to(device)
    bias = torch.zeros(experts, device=device)
    scores = torch.sigmoid(logits)
    result = {}
    for label, groups in (("flat", (1, 1)), ("group_limited", (8, 4))):
        _, indices = router.router_topk(logits, bias, top_k, "sigmoid", True, 1e-20, 2.5, *groups)
        choice = scores + bias
        if groups[0] > 1:  # transformers' DeepSeek-V3 router, op for op
            group_scores = choice.view(-1, groups[0], experts // groups[0]).topk(2, dim=-1)[0].sum(dim=-1)
            kept = torch.zeros_like(group_scores).scatter_(1, torch.topk(group_scores, groups[1], sorted=False)[1], 1)
            mask = kept.unsqueeze(-1).expand(-1, groups[0], experts // groups[0]).reshape(-1, experts)
            choice = choice.masked_fill(~mask.bool(), float("-inf"))
        expected = torch.topk(choice, top_k, dim=-1, sorted=False)[1]
        same = indices.sort(-1).values == expected.sort(-1).values
        result[f"{label}_rows_matching_torch_topk"] = f"{int(same.all(-1).sum())}/{len(same)}"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/kernels/out"))
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU, toy shapes, Triton interpreter: checks the script, measures nothing",
    )
    args = parser.parse_args()
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run gpu_check.sh on a GPU machine, or pass --dry-run")
    results = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "kernels": bench_kernels(device, args.dry_run),
        "expert_gemm": bench_expert_gemm(device, args.dry_run),
        "moe_layer": bench_moe_layer_host_vs_device(device, args.dry_run),
        "router_ties": router_ties(device),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    lines = [
        f"device {results['device']}, torch {results['torch']}",
        "",
        "| kernel | trex ms | Inductor ms | Liger ms |",
        "|---|---|---|---|",
    ]
    fmt = lambda v: f"{v * 1e3:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    for row in results["kernels"]:
        lines.append(f"| {row['kernel']} | {fmt(row['trex_s'])} | {fmt(row['inductor_s'])} | {fmt(row['liger_s'])} |")
    lines += [
        "",
        "| model | rows/expert | experts | grouped_mm TFLOP/s | 4-stream loop TFLOP/s |",
        "|---|---|---|---|---|",
    ]
    for row in results["expert_gemm"]:
        lines.append(
            f"| {row['model']} | {row['rows_per_expert']} | {row['experts']} "
            f"| {row['grouped_tflops']:.1f} | {row['loop4_tflops']:.1f} |"
        )
    lines += ["", "moe layer fwd+bwd: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in results["moe_layer"].items())]
    lines += ["", "router ties (rows where router_topk picks torch.topk's experts): " + str(results["router_ties"])]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

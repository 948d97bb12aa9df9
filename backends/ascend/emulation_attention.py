"""CPU emulation of torch_npu's flash attention pair, `npu_fusion_attention` / `npu_fusion_attention_grad`.

Semantics from torch_npu's operator documentation (`_op_plugin_docs.py`, "npu_fusion_attention"):
    y = softmax(mask(scale * (pse + q @ k^T), atten_mask)) @ v
with `atten_mask` True where a score is masked out, and the sparse modes deciding which mask applies:
    0  defaultMask: `atten_mask` as given (BNSS / B1SS / 11SS / SS), or none
    1  allMask: the full `atten_mask`
    2  leftUpCausal: causal from the top-left corner (torch's `is_causal`), compressed 2048x2048 mask
    3  rightDownCausal: causal from the bottom-right corner, compressed 2048x2048 mask
    4  band: keys in [i - pre_tockens, i + next_tockens] from the bottom-right corner, compressed mask
The forward returns the softmax statistics the backward reads back: `softmax_max` and `softmax_sum`,
shape [B, N, Sq, 8] in float32 (the value repeated over the last axis), so that
    p = exp(scale * q @ k^T - softmax_max) / softmax_sum.
Any (max, sum) pair with max + log(sum) = the row's logsumexp gives the same p; the lowering uses
that to hand the backward a logsumexp saved by another kernel. Heads: Nq a multiple of Nkv (GQA).

`sink` ([head_num] float32, the docs' example "with sink"): one extra logit per head joins every row's
softmax and is dropped before the product with v, i.e. softmax(cat([scores, sink], -1))[..., :-1] @ v
(DeepSeek-V4's and gpt-oss's attention sinks); the statistics include it, and the backward's fifth
output is its gradient, d sink[h] = -sum over (b, s) of p_sink * rowsum(dy * out).

Covered here: layouts BNSD and BSND, sparse modes 0-4, sink, no pse/padding_mask/prefix/varlen,
keep_prob=1 (no dropout); anything else raises `AscendSchemaError` naming the argument.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trex.backends.ascend.emulation_library import _autograd, _fake, _implement
from trex.backends.ascend.schemas import AscendSchemaError

STAT_WIDTH = 8  # softmax_max / softmax_sum repeat each row's value 8 times (torch_npu's layout)
COMPRESSED_MASK = 2048  # modes 2, 3, 4 take an optimised 2048x2048 upper-triangular mask
_LAYOUTS = ("BNSD", "BSND")


def _to_bnsd(t: Tensor, layout: str) -> Tensor:
    return t if layout == "BNSD" else t.transpose(1, 2)


def _from_bnsd(t: Tensor, layout: str) -> Tensor:
    """Back to `layout`, contiguous in it (as the fused op writes its outputs)."""
    return (t if layout == "BNSD" else t.transpose(1, 2)).contiguous()


def _check_options(
    op: str,
    layout: str,
    *,
    pse=None,
    padding_mask=None,
    keep_prob=1.0,
    prefix=None,
    actual_seq_qlen=None,
    actual_seq_kvlen=None,
    sink=None,
    sparse_mode=0,
    atten_mask=None,
) -> None:
    given = {
        "pse": pse,
        "padding_mask": padding_mask,
        "prefix": prefix,
        "actual_seq_qlen": actual_seq_qlen,
        "actual_seq_kvlen": actual_seq_kvlen,
    }
    for name, value in given.items():
        if value is not None:
            raise AscendSchemaError(f"{op}: argument {name!r} is not covered by trex's CPU emulation (pass None)")
    if layout not in _LAYOUTS:
        raise AscendSchemaError(f"{op}: argument 'input_layout'={layout!r}; the CPU emulation covers {_LAYOUTS}")
    if keep_prob != 1.0:
        raise AscendSchemaError(f"{op}: argument 'keep_prob'={keep_prob}; the CPU emulation covers 1.0 (no dropout)")
    if sparse_mode not in (0, 1, 2, 3, 4):
        raise AscendSchemaError(f"{op}: argument 'sparse_mode'={sparse_mode}; the CPU emulation covers 0-4")
    if sparse_mode in (1, 2, 3, 4) and atten_mask is None:
        raise AscendSchemaError(
            f"{op}: sparse_mode={sparse_mode} needs atten_mask (torch_npu ignores the mode without)"
        )


def masked_positions(
    sq: int, skv: int, atten_mask: Tensor | None, sparse_mode: int, pre_tockens: int, next_tockens: int, device
) -> Tensor | None:
    """True where a score is masked out, broadcastable to [B, N, Sq, Skv] (None: nothing masked)."""
    if atten_mask is None:
        return None
    if sparse_mode in (0, 1):
        mask = atten_mask.bool()
        return mask.view(1, 1, sq, skv) if mask.dim() == 2 else mask
    row = torch.arange(sq, device=device).view(sq, 1)
    col = torch.arange(skv, device=device).view(1, skv)
    if sparse_mode == 2:
        return (col > row).view(1, 1, sq, skv)
    offset = skv - sq  # modes 3 and 4 count from the bottom-right corner
    if sparse_mode == 3:
        return (col > row + offset).view(1, 1, sq, skv)
    return ((col > row + offset + next_tockens) | (col < row + offset - pre_tockens)).view(1, 1, sq, skv)


def _scores(q: Tensor, k: Tensor, scale: float, masked: Tensor | None) -> Tensor:
    """scale * q @ k^T in float32 (k's heads repeated for GQA), -inf where masked."""
    groups = q.size(1) // k.size(1)
    k = k.float().repeat_interleave(groups, dim=1) if groups > 1 else k.float()
    scores = scale * (q.float() @ k.transpose(-1, -2))
    return scores if masked is None else scores.masked_fill(masked, float("-inf"))


def _check_sink(op: str, sink: Tensor | None, head_num: int) -> None:
    if sink is not None and (sink.dim() != 1 or sink.size(0) != head_num or sink.dtype != torch.float32):
        raise AscendSchemaError(
            f"{op}: argument 'sink' must be a float32 tensor of shape [head_num={head_num}] "
            f"(got {sink.dtype} {list(sink.shape)})"
        )


def _sink_column(sink: Tensor, scores: Tensor) -> Tensor:
    """The per-head sink logit as one more key column of the [B, N, Sq, Skv] score matrix."""
    return sink.float().view(1, -1, 1, 1).expand(scores.size(0), -1, scores.size(2), 1)


def _heads(op: str, q: Tensor, k: Tensor, v: Tensor, head_num: int) -> None:
    if q.size(1) != head_num:
        raise AscendSchemaError(f"{op}: argument 'head_num'={head_num} but query has {q.size(1)} heads")
    if k.shape != v.shape[:-1] + k.shape[-1:] or q.size(1) % k.size(1):
        raise AscendSchemaError(
            f"{op}: key/value heads must divide query heads and key/value agree (q {list(q.shape)}, "
            f"k {list(k.shape)}, v {list(v.shape)})"
        )


@_implement("npu_fusion_attention")
def npu_fusion_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    head_num: int,
    input_layout: str,
    pse: Tensor | None = None,
    padding_mask: Tensor | None = None,
    atten_mask: Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    prefix: list[int] | None = None,
    actual_seq_qlen: list[int] | None = None,
    actual_seq_kvlen: list[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
    sink: Tensor | None = None,
    dropout_mask: Tensor | None = None,
    seed: int = 0,
    offset: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor, int, int, int]:
    op = "npu_fusion_attention"
    _check_options(
        op,
        input_layout,
        pse=pse,
        padding_mask=padding_mask,
        keep_prob=keep_prob,
        prefix=prefix,
        actual_seq_qlen=actual_seq_qlen,
        actual_seq_kvlen=actual_seq_kvlen,
        sink=sink,
        sparse_mode=sparse_mode,
        atten_mask=atten_mask,
    )
    q, k, v = (_to_bnsd(t, input_layout) for t in (query, key, value))
    _heads(op, q, k, v, head_num)
    _check_sink(op, sink, head_num)
    masked = masked_positions(q.size(2), k.size(2), atten_mask, sparse_mode, pre_tockens, next_tockens, q.device)
    scores = _scores(q, k, scale, masked)
    logits = scores if sink is None else torch.cat([scores, _sink_column(sink, scores)], -1)
    row_max = logits.amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # fully masked rows
    row_sum = torch.exp(logits - row_max).sum(-1, keepdim=True)
    weights = torch.exp(scores - row_max)
    groups = q.size(1) // v.size(1)
    vv = v.float().repeat_interleave(groups, dim=1) if groups > 1 else v.float()
    out = (weights / row_sum.clamp_min(torch.finfo(torch.float32).tiny)) @ vv
    stats = [s.expand(*s.shape[:-1], STAT_WIDTH).contiguous() for s in (row_max, row_sum)]
    return _from_bnsd(out.to(query.dtype), input_layout), stats[0], stats[1], query.new_empty(0), 0, 0, 0


@_fake("npu_fusion_attention")
def _(query, key, value, head_num, input_layout, *args, **kwargs):
    q = _to_bnsd(query, input_layout)
    out_shape = [*query.shape[:-1], value.size(-1)]
    stats = query.new_empty(q.size(0), q.size(1), q.size(2), STAT_WIDTH, dtype=torch.float32)
    return query.new_empty(out_shape), stats, torch.empty_like(stats), query.new_empty(0), 0, 0, 0


@_implement("npu_fusion_attention_grad")
def npu_fusion_attention_grad(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    dy: Tensor,
    head_num: int,
    input_layout: str,
    *,
    pse: Tensor | None = None,
    padding_mask: Tensor | None = None,
    atten_mask: Tensor | None = None,
    softmax_max: Tensor | None = None,
    softmax_sum: Tensor | None = None,
    softmax_in: Tensor | None = None,
    attention_in: Tensor | None = None,
    scale_value: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    seed: int = 0,
    offset: int = 0,
    numels: int = 0,
    prefix: list[int] | None = None,
    actual_seq_qlen: list[int] | None = None,
    actual_seq_kvlen: list[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
    sink: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv (and empty dpse, dsink) from the forward's softmax statistics and output."""
    op = "npu_fusion_attention_grad"
    _check_options(
        op,
        input_layout,
        pse=pse,
        padding_mask=padding_mask,
        keep_prob=keep_prob,
        prefix=prefix,
        actual_seq_qlen=actual_seq_qlen,
        actual_seq_kvlen=actual_seq_kvlen,
        sink=sink,
        sparse_mode=sparse_mode,
        atten_mask=atten_mask,
    )
    if softmax_max is None or softmax_sum is None or attention_in is None:
        raise AscendSchemaError(f"{op}: softmax_max, softmax_sum and attention_in (the forward's outputs) are needed")
    q, k, v, grad, out = (_to_bnsd(t, input_layout) for t in (query, key, value, dy, attention_in))
    _heads(op, q, k, v, head_num)
    _check_sink(op, sink, head_num)
    masked = masked_positions(q.size(2), k.size(2), atten_mask, sparse_mode, pre_tockens, next_tockens, q.device)
    scores = _scores(q, k, scale_value, masked)
    probs = torch.exp(scores - softmax_max[..., :1].float()) / softmax_sum[..., :1].float()
    groups = q.size(1) // k.size(1)
    vv = v.float().repeat_interleave(groups, dim=1) if groups > 1 else v.float()
    kk = k.float().repeat_interleave(groups, dim=1) if groups > 1 else k.float()
    grad = grad.float()
    grad_v = probs.transpose(-1, -2) @ grad
    grad_probs = grad @ vv.transpose(-1, -2)
    row_dot = (grad * out.float()).sum(-1, keepdim=True)
    grad_scores = probs * (grad_probs - row_dot) * scale_value
    grad_q = grad_scores @ kk
    grad_k = grad_scores.transpose(-1, -2) @ q.float()
    if groups > 1:  # sum the gradients of the query heads that share a key/value head
        grad_k = grad_k.unflatten(1, (k.size(1), groups)).sum(2)
        grad_v = grad_v.unflatten(1, (v.size(1), groups)).sum(2)
    outs = (grad_q.to(query.dtype), grad_k.to(key.dtype), grad_v.to(value.dtype))
    grad_sink = query.new_empty(0)
    if sink is not None:  # the sink column's probability times (0 - row_dot), summed over batch and rows
        sink_probs = torch.exp(_sink_column(sink, scores) - softmax_max[..., :1].float()) / softmax_sum[..., :1].float()
        grad_sink = -(sink_probs * row_dot).sum((0, 2, 3)).to(sink.dtype)
    return (*(_from_bnsd(t, input_layout) for t in outs), query.new_empty(0), grad_sink)


@_fake("npu_fusion_attention_grad")
def _(query, key, value, dy, head_num, input_layout, **kwargs):
    sink = kwargs.get("sink")
    return (  # contiguous in the layout, as the kernel writes them (not the strides of possibly strided inputs)
        query.new_empty(query.shape),
        key.new_empty(key.shape),
        value.new_empty(value.shape),
        query.new_empty(0),
        sink.new_empty(sink.shape) if sink is not None else query.new_empty(0),
    )


_SINK_INDEX = 20  # `sink` is the 21st argument of npu_fusion_attention's schema
_GRAD_OPTIONS = ("atten_mask", "scale", "keep_prob", "pre_tockens", "next_tockens", "sparse_mode")


def _attention_setup(ctx, inputs, output):
    query, key, value, head_num, layout = inputs[:5]
    names = [
        "pse",
        "padding_mask",
        "atten_mask",
        "scale",
        "keep_prob",
        "pre_tockens",
        "next_tockens",
        "inner_precise",
        "prefix",
        "actual_seq_qlen",
        "actual_seq_kvlen",
        "sparse_mode",
    ]
    options = dict(zip(names, inputs[5 : 5 + len(names)]))
    sink = inputs[_SINK_INDEX] if len(inputs) > _SINK_INDEX else None
    ctx.save_for_backward(query, key, value, output[0], output[1], output[2], options["atten_mask"], sink)
    ctx.head_num, ctx.layout = head_num, layout
    ctx.options = {n: options[n] for n in _GRAD_OPTIONS if n != "atten_mask"}


@_autograd("npu_fusion_attention", _attention_setup)
def _attention_backward(ctx, grad_out, *_):
    query, key, value, out, softmax_max, softmax_sum, atten_mask, sink = ctx.saved_tensors
    options = dict(ctx.options)
    grads = torch.ops.npu_emul.npu_fusion_attention_grad(
        query,
        key,
        value,
        grad_out,
        ctx.head_num,
        ctx.layout,
        atten_mask=atten_mask,
        softmax_max=softmax_max,
        softmax_sum=softmax_sum,
        attention_in=out,
        scale_value=options.pop("scale"),
        sink=sink,
        **options,
    )
    grad_sink = grads[4] if sink is not None else None
    return (grads[0], grads[1], grads[2]) + (None,) * (_SINK_INDEX - 3) + (grad_sink,) + (None,) * 3

"""Model-FLOP conventions: what "model TFLOP/s" and "MFU" count, stated once.

Two conventions, both per token of a training step (forward + backward, no recompute):

* `megatron_flops_per_token` - Megatron-LM's per-GEMM count (`num_floating_point_operations` in
  megatron/training): every weight GEMM 3 times (forward, data gradient, weight gradient) at 2 FLOPs
  per multiply-accumulate, attention scores and attention-times-values over seq/2 keys (a causal
  mask), the output head once per prediction (main + each MTP module), MTP's eh-projection. Routers
  and the embedding lookup are not counted. With `causal_halving=False` it reduces to Narayanan et
  al. 2021's 72 B s l h^2 (1 + s/6h + V/12lh) for GPT. This is the convention of the published
  figures (NVIDIA, Megatron-MoE ModelZoo): `model_tflops_per_device` and `mfu` use it.
* `six_n_flops_per_token` - 6 N_active + 12 L H Q T (PaLM, Chowdhery et al. 2022 App. B): N_active is
  every parameter a token touches except the input embedding (MTP modules included when present),
  the attention term counts all seq keys of every attention core. Reported as `mfu_6n`.

Executed FLOPs (what the device really does: recompute, duplicated replicated GEMMs, full-square
unfused attention) are separate and never enter MFU.
"""

from __future__ import annotations

from trex.cost_model.model_spec import LayerSpec, ModelSpec


def _layer_megatron_forward(layer: LayerSpec, hidden: int, seq: int, causal_halving: bool) -> float:
    gemms = sum(lin.flops_per_token for lin in layer.linears if lin.model_flops)
    experts = layer.moe.expert_flops_per_token(hidden) if layer.moe else 0
    attention = sum(
        core.flops_per_token(
            core.megatron_keys(seq)
            if causal_halving
            else (seq if core.window is None and not core.compress_rate else core.keys_per_query(seq))
        )
        for core in layer.attention
    )
    return gemms + experts + attention


def megatron_flops_per_token(spec: ModelSpec, seq: int, *, causal_halving: bool = True) -> float:
    """Training FLOPs per token under Megatron's per-GEMM convention (see module docstring)."""
    kinds = spec.layer_kinds
    forward = sum(
        n * _layer_megatron_forward(kinds[kind], spec.hidden_size, seq, causal_halving)
        for kind, n in spec.kind_counts.items()
    )
    head = 2 * spec.hidden_size * spec.vocab_size * (1 + len(spec.mtp_layers))
    return 3.0 * (forward + head)


def six_n_flops_per_token(spec: ModelSpec, seq: int) -> float:
    """6 N_active + 12 L H Q T (PaLM's convention; every attention core over all seq keys)."""
    hidden = spec.hidden_size
    kinds = spec.layer_kinds
    active = sum(n * kinds[kind].active_params(hidden) for kind, n in spec.kind_counts.items()) + spec.head_params
    if spec.tie_embeddings:
        active += spec.vocab_size * hidden  # the tied matrix still does the output GEMM
    attention = 0.0
    for kind, n in spec.kind_counts.items():
        for core in kinds[kind].attention:
            keys = seq if core.window is None and not core.compress_rate else core.keys_per_query(seq)
            attention += n * 6.0 * core.heads * (core.qk_head_dim + core.v_head_dim) * keys
    return 6.0 * active + attention


def narayanan_gpt_flops_per_iteration(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021, Appendix: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)), no recompute."""
    return 72.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))

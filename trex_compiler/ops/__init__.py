"""trex's own operators (namespace `torch.ops.trex`), registered when `trex` is imported."""

from trex.ops import compute_once, cpu_attention, ep_experts, moe, moe_decompositions

__all__ = ["compute_once", "cpu_attention", "ep_experts", "moe", "moe_decompositions"]

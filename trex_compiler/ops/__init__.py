"""trex's own operators (namespace `torch.ops.trex`), registered when `trex` is imported."""

from trex.ops import cpu_attention, ep_experts, moe, moe_decompositions

__all__ = ["cpu_attention", "ep_experts", "moe", "moe_decompositions"]

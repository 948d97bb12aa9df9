"""trex's own operators (namespace `torch.ops.trex`), registered when `trex` is imported."""

from trex.ops import ep_experts, moe, moe_decompositions

__all__ = ["ep_experts", "moe", "moe_decompositions"]

"""trex's own operators (namespace `torch.ops.trex`), registered when `trex` is imported."""

from trex.ops import moe, moe_decompositions

__all__ = ["moe", "moe_decompositions"]

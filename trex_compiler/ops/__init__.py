"""trex's own operators (namespace `torch.ops.trex`), registered when `trex` is imported."""

from trex.ops import moe

__all__ = ["moe"]

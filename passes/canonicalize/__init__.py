"""Canonicalization passes: rewrite captured graphs into the small core op set later passes expect."""

from trex.passes.canonicalize.moe import CanonicalizeMoe

__all__ = ["CanonicalizeMoe"]

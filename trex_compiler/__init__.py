"""trex: a compiler-style graph optimization layer for MoE post-training."""

"""trex's Triton kernels for the MoE training hot spots, one module per kernel family.

Each module defines its Triton kernels lazily (so `TRITON_INTERPRET` is read when a kernel is first
used, not at import), a reference implementation in plain PyTorch with the same meaning, and
`torch.library.custom_op`s in the `trex_triton` namespace with fake and autograd implementations.
"""

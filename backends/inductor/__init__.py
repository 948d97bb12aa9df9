"""The Inductor backend: trex regions compiled by `torch._inductor` (C++/OpenMP on CPU, Triton on GPU)."""

from trex.backends.inductor.backend import InductorBackend, inductor_unavailable_reason

__all__ = ["InductorBackend", "inductor_unavailable_reason"]

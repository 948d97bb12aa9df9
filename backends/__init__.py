"""Backends: the `Backend` interface, the registry, the lowering that splits a graph among them,
and one sub-package per backend (`eager` is the reference every other one is tested against).
"""

from trex.backends.backend import Backend
from trex.backends.lowering import Lowering, lower_graph
from trex.backends.registry import (
    ENTRY_POINT_GROUP,
    available_backends,
    backend_names_from_env,
    default_backend_names,
    get_backend,
    register_backend,
    unregister_backend,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "Lowering",
    "available_backends",
    "backend_names_from_env",
    "default_backend_names",
    "get_backend",
    "lower_graph",
    "register_backend",
    "unregister_backend",
]

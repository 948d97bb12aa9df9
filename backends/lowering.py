"""Lowering: split a graph among backends by what each supports, and let each lower its parts.

Every call node goes to the first backend, in the user's priority order, whose `supports(node)`
says yes; the eager backend takes the rest. Connected groups of one backend's nodes become
submodules (without creating cycles) that the backend lowers; the eager glue runs them in order.
"""

from __future__ import annotations

import warnings

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from trex.backends.backend import Backend
from trex.backends.eager import EagerBackend
from trex.errors import BackendError
from trex.graph_copy import copy_graph_module


@dataclass
class Lowering:
    """The result of lowering one graph: what runs, and who runs which node."""

    module: Callable[..., Any]
    assignment: dict[str, str]  # node name -> backend name
    partitions: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (backend, submodule, nodes)
    notes: list[str] = field(default_factory=list)  # e.g. a supports() that raised

    def counts(self) -> Counter:
        return Counter(self.assignment.values())

    def describe(self) -> str:
        lines = ["nodes per backend: " + ", ".join(f"{b}={n}" for b, n in sorted(self.counts().items()))]
        for backend, submodule, nodes in self.partitions:
            lines.append(f"{submodule} -> {backend}: {len(nodes)} nodes: {', '.join(nodes[:12])}{' ...' if len(nodes) > 12 else ''}")
        lines += [f"note: {n}" for n in self.notes]
        eager = [name for name, b in self.assignment.items() if b == EagerBackend.name]
        lines.append(f"eager: {len(eager)} nodes")
        return "\n".join(lines)


class _AssignedTo(OperatorSupportBase):
    def __init__(self, nodes: set[fx.Node]):
        self.nodes = nodes

    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        return node in self.nodes


class LoweredSubgraph(torch.nn.Module):
    """A backend's compiled callable in place of the submodule it was lowered from."""

    def __init__(self, backend: str, compiled: Callable[..., Any], source: fx.GraphModule):
        super().__init__()
        self.backend = backend
        self.compiled = compiled
        self.source = source  # kept for dumps and debugging

    def forward(self, *args):
        return self.compiled(*args)


class BackendSupportsWarning(UserWarning):
    """A backend's supports() raised (its contract says it never does); trex treated it as False."""


def _safe_supports(backend: Backend, node: fx.Node, notes: list[str], raised: dict[str, list[str]]) -> bool:
    try:
        return bool(backend.supports(node))
    except Exception as error:  # noqa: BLE001 - the contract says never raise; trex tolerates it
        notes.append(f"backend {backend.name!r}: supports({node.name}) raised {type(error).__name__}: {error}; treated as False")
        raised.setdefault(backend.name, []).append(f"{node.name}: {type(error).__name__}: {error}")
        return False


def assign_nodes(gm: fx.GraphModule, backends: Sequence[Backend]) -> tuple[dict[fx.Node, Backend], list[str]]:
    """The backend of every call node: the first in priority order that supports it."""
    notes: list[str] = []
    eager = next((b for b in backends if b.name == EagerBackend.name), EagerBackend())
    assignment = {}
    raised: dict[str, list[str]] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        assignment[node] = next((b for b in backends if b is not eager and _safe_supports(b, node, notes, raised)), eager)
    for name, failures in raised.items():
        warnings.warn(f"backend {name!r}: supports() raised on {len(failures)} node(s) (first: {failures[0]}); trex treated them as "
                      "unsupported, so other backends run them. A backend's supports() must return False, never raise.",
                      BackendSupportsWarning, stacklevel=2)
    return assignment, notes


def lower_graph(gm: fx.GraphModule, backends: Sequence[Backend]) -> Lowering:
    """Lower a copy of `gm` across `backends`; the eager backend is always the last resort."""
    gm = copy_graph_module(gm)
    assignment, notes = assign_nodes(gm, backends)
    names = {node.name: backend.name for node, backend in assignment.items()}
    eager = EagerBackend()
    lowering = Lowering(module=gm, assignment=names, notes=notes)
    for backend in dict.fromkeys(b for b in assignment.values() if b.name != EagerBackend.name):
        nodes = {n for n, b in assignment.items() if b is backend}
        partitioner = CapabilityBasedPartitioner(gm, _AssignedTo(nodes), allows_single_node_partition=True)
        partitions = partitioner.propose_partitions()
        if not partitions:
            continue
        before = set(gm._modules)
        gm = partitioner.fuse_partitions(partitions, prefix=f"trex_{backend.name}_")
        for submodule_name in sorted(set(gm._modules) - before):
            submodule = getattr(gm, submodule_name)
            example_inputs = [p.meta.get("val") for p in submodule.graph.find_nodes(op="placeholder")]
            try:
                compiled = backend.lower(submodule, example_inputs)
            except Exception as error:  # noqa: BLE001
                raise BackendError(f"backend {backend.name!r} failed to lower {submodule_name} ({len(submodule.graph.nodes)} nodes) it said it supports: {error}") from error
            if not callable(compiled):
                raise BackendError(f"backend {backend.name!r}.lower returned {type(compiled).__name__}, not a callable")
            call_nodes = [n.name for n in submodule.graph.nodes if n.op == "call_function"]
            lowering.partitions.append((backend.name, submodule_name, call_nodes))
            setattr(gm, submodule_name, LoweredSubgraph(backend.name, compiled, submodule))
        gm.recompile()
    lowering.module = eager.lower(gm, [p.meta.get("val") for p in gm.graph.find_nodes(op="placeholder")])
    return lowering

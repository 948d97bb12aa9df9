"""`trex train --zero3 graph`: ZeRO-3 whose collectives are nodes of the captured graph.

The default ZeRO-3 of `trex train` is FSDP2 (`fully_shard`), which gathers parameters and reduce-scatters
gradients in module hooks, outside any graph: no pass can move those collectives. With `--zero3 graph` every
parameter is stored as this rank's flat shard and read through the `GatheredParameter` parametrization
(`runtime.data_parallel.shard_parameters_in_graph`, the SimpleFSDP idea): the forward all-gathers it with the
functional collective whose autograd is a reduce-scatter. Captured with `--compile`, the joint graph holds one
all-gather per parameter and one reduce-scatter per gradient, which `reorder_comm` prefetches, buckets and
hides under compute; eager runs issue the same collectives in program order.

The gradients arrive on the shards already summed over the data-parallel ranks (the loss is divided by the
global batch's tokens), so the optimizer is a plain AdamW over the shards. What this mode does not do (each
refused with its reason by `check_zero3_in_graph`): tp, pp, ep (FSDP2 handles those layouts), checkpoints
and `--export` (the flat shards have no global layout for DCP), gradient clipping and the training recipes
that clip (the global gradient norm of flat shards is not computed here).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from trex.cost_model.parallel import ParallelConfig
from trex.errors import TrexError
from trex.runtime.parallelize import AppliedPlan, FullyShardedAdamW

CHOICES = ("fsdp2", "graph")


def check_zero3_in_graph(plan: ParallelConfig, **job) -> None:
    """Refuse a job `--zero3 graph` cannot run, naming the problem and what to do instead."""
    if plan.zero != 3:
        raise TrexError(f"--zero3 graph selects how zero=3 runs, but the plan has zero={plan.zero}; add zero=3")
    for key in ("tp", "pp", "ep"):
        if getattr(plan, key) > 1:
            raise TrexError(
                f"--zero3 graph runs data parallelism only; the plan has {key}={getattr(plan, key)} "
                "(use --zero3 fsdp2 for it)"
            )
    refused = {
        "checkpoint_dir": "checkpoints (--checkpoint-dir)",
        "export_dir": "--export",
        "clip_grad_norm": "gradient clipping",
        "source": "the training recipes (sft / cpt)",
    }
    for key, what in refused.items():
        if job.get(key):
            raise TrexError(f"--zero3 graph does not support {what} yet; use --zero3 fsdp2 (the default) for it")


def check_compiled_zero3(plan: ParallelConfig, zero3: str, compile: bool) -> None:
    """Refuse `--compile` with ZeRO-3 through FSDP2 before any rank starts. `--compile` captures the rank's whole
    micro-batch program as one graph (`runtime.rank_loss`); FSDP2 gathers and reduce-scatters in module hooks that
    torch keeps out of every Dynamo graph by design (`torch._dynamo.disable`, "skipping FSDP hooks"), so capture would
    stop at the first one (a graph break) after the ranks started."""
    if compile and plan.zero == 3 and plan.pp == 1 and zero3 != "graph":
        raise TrexError(
            "--compile cannot capture zero=3 through FSDP2 (--zero3 fsdp2, the default): FSDP2's gathers and "
            "reduce-scatters run in hooks torch keeps out of compiled graphs; use --zero3 graph (ZeRO-3 as graph "
            "collectives, data-parallel plans only) or run this plan without --compile"
        )


def original_name(name: str) -> str:
    """A parametrized parameter's name (`m.parametrizations.weight.original`) -> the model's name (`m.weight`)."""
    if name.endswith(".original") and ".parametrizations." in name:
        return name[: -len(".original")].replace(".parametrizations.", ".")
    return name


class InGraphShardedAdamW(FullyShardedAdamW):
    """AdamW over the flat shards of `shard_parameters_in_graph`; the graph has already reduce-scattered the
    gradients, so `reduce_gradients` only accounts for what is held."""

    def __init__(self, model: nn.Module, shapes: dict[str, tuple[int, ...]], group: dist.ProcessGroup, **kw):
        super().__init__(model, **kw)
        self.shapes, self.group = shapes, group

    def reduce_gradients(self) -> None:
        self.held_gradient_bytes = sum(
            p.grad.numel() * p.grad.element_size() for _, p in self.named if p.grad is not None
        )

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's reduced gradient, whole (an all-gather of the shards), keyed by its model name."""
        out = {}
        world = dist.get_world_size(self.group)
        for name, p in self.named:
            whole = original_name(name)
            shape = self.shapes[whole]
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            gathered = grad.new_empty(grad.numel() * world)
            dist.all_gather_into_tensor(gathered, grad.contiguous(), group=self.group)
            out[whole] = gathered[: torch.Size(shape).numel()].view(shape).clone()
        return out


def apply_zero3_in_graph(
    model: nn.Module, plan: ParallelConfig, device: torch.device, *, lr: float, weight_decay: float
) -> AppliedPlan:
    """Shard `model`'s parameters over the data-parallel ranks as graph collectives; the trainer's AppliedPlan."""
    from trex.runtime.data_parallel import shard_parameters_in_graph
    from trex.runtime.mesh import build_meshes

    check_zero3_in_graph(plan)
    model.to(device)
    meshes = build_meshes(plan, device.type)
    group = meshes.dp_group
    shapes = shard_parameters_in_graph(model, group)
    optimizer = InGraphShardedAdamW(model, shapes, group, lr=lr, weight_decay=weight_decay)
    notes = [
        f"zero=3 inside the graph: {len(shapes)} parameters as flat shards over {dist.get_world_size(group)} ranks"
    ]
    return AppliedPlan(model, plan, optimizer, meshes, {}, notes)

"""The learning-rate schedule and global gradient clipping, for every plan the runtime executes.

Both must give the 1-rank run's numbers under any plan, so neither looks at local shards alone:

- `learning_rate(step)`: linear warmup from 0 to the peak over `warmup` steps, then cosine decay to
  `min_ratio * peak` at `total` steps (the schedule of most LLM post-training recipes). It is a pure
  function of the step, so a resumed run continues on the same curve without saving scheduler state.
- `global_gradient_norm(applied)`: the L2 norm of the whole model's gradient. Each rank squares the
  gradient pieces it holds and weights every piece by 1/(number of ranks holding the same piece) -
  read from the piece's DTensor placements (Replicate dims) and its mesh's share of the world - so one
  all-reduce over the world sums each element exactly once, whatever mix of ZeRO shards, tensor-parallel
  shards, expert shards and replicas the plan has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate


@dataclass(frozen=True)
class Schedule:
    peak: float
    warmup: int = 0
    total: int = 0  # 0: constant after warmup
    min_ratio: float = 0.1

    def learning_rate(self, step: int) -> float:
        if self.warmup and step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        if not self.total or self.total <= self.warmup:
            return self.peak
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        floor = self.peak * self.min_ratio
        return floor + (self.peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def gradient_pieces(applied) -> list[tuple[torch.Tensor, torch.Tensor | DTensor]]:
    """(the tensor the optimizer steps with, its gradient as a global view) for every parameter."""
    from trex.runtime.parallelize import FullyShardedAdamW

    optimizer = applied.optimizer
    if isinstance(optimizer, FullyShardedAdamW):
        return [(p.grad, p.grad) for _, p in optimizer.named if p.grad is not None]
    pieces = []
    for slot in optimizer.slots:
        if slot.master.grad is not None:
            pieces.append((slot.master.grad, optimizer.global_view(slot, slot.master.grad)))
    return pieces


def _copies(view: torch.Tensor | DTensor, world: int) -> int:
    """How many ranks hold this same piece of the gradient."""
    if not isinstance(view, DTensor):
        return world
    mesh = view.device_mesh
    replicated = math.prod(mesh.size(d) for d, p in enumerate(view.placements) if isinstance(p, Replicate))
    return replicated * (world // mesh.size())


def global_gradient_norm(applied) -> float:
    world = dist.get_world_size() if dist.is_initialized() else 1
    total = torch.zeros((), dtype=torch.float64)
    for _, view in gradient_pieces(applied):
        local = view.to_local() if isinstance(view, DTensor) else view
        total += local.detach().double().pow(2).sum().cpu() / _copies(view, world)
    if world > 1:
        dist.all_reduce(total)
    return float(total.sqrt())


def clip_gradients(applied, max_norm: float) -> float:
    """Scale every gradient so the global norm is at most `max_norm`; returns the norm before clipping."""
    norm = global_gradient_norm(applied)
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for grad, _ in gradient_pieces(applied):
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            local.mul_(scale)
    return norm

"""Data parallelism: gradient reduction over the right group, and ZeRO-0/1/2 sharded AdamW.

Each parameter has a *home*: a 2-D device mesh (replica dim, model dim) and its placement on the
model dim. Dense parameters live on the world mesh (dp, tp) and are replicated over dp; routed-expert
weights live on the expert mesh (edp, ep), sharded over ep on dim 0 and replicated over edp. The
replica dim is the group a parameter's gradient is summed over and its optimizer state is sharded
over: dp for dense weights, edp (expert-data-parallel) for experts (Megatron's distributed optimizer,
Rajbhandari et al., "ZeRO", SC'20):

  zero=0  gradients all-reduced; every rank steps AdamW on the whole parameter
  zero=1  gradients all-reduced; each rank steps AdamW on its shard (dim `shard_dim`, torch.chunk
          split) and the shards are all-gathered back into the parameter
  zero=2  as 1, but the gradient is reduce-scattered, so a rank only ever holds its gradient shard
          after the reduction
  zero=3  FSDP2 (`fully_shard`, see `runtime.fully_sharded`): parameters are sharded too

The loss a rank back-propagates is already divided by the tokens of the *global* batch, so gradients
are summed (not averaged) over replicas. Optimizer state is exposed per parameter as DTensors on the
parameter's home mesh with its global shape, which is what lets a checkpoint resume under another plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard


@dataclass
class ParamHome:
    """Where a parameter lives: a mesh whose dim 0 holds its replicas, and its placement on every mesh dim
    (Replicate on dim 0; Replicate or Shard(d) on a model dim such as tp or ep)."""

    mesh: DeviceMesh | None  # None in a 1-process run
    placements: tuple[Placement, ...]
    global_shape: tuple[int, ...]
    # A model-dim group over which this rank's gradient is only a part (tp: a parameter replicated on the tp ranks
    # but computed on this rank's tokens or heads - norms, router, MLA down-projections): summed over it before
    # (or, being linear, together with) the replicas' sum.
    partial_over: dist.ProcessGroup | None = None

    @property
    def replica_group(self) -> dist.ProcessGroup | None:
        return None if self.mesh is None else self.mesh.get_group(0)

    @property
    def replicas(self) -> int:
        return 1 if self.mesh is None else self.mesh.size(0)

    @property
    def replica_rank(self) -> int:
        return 0 if self.mesh is None else self.mesh.get_local_rank(0)


def local_tensor(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def chunk_bounds(size: int, parts: int, index: int) -> tuple[int, int]:
    """torch.chunk's split of `size` into `parts` (ceil-sized chunks, trailing ones short or empty),
    the same split DTensor's `Shard` uses."""
    chunk = math.ceil(size / parts) if size else 0
    start = min(index * chunk, size)
    return start, min(start + chunk, size)


@dataclass
class ShardedParam:
    name: str
    param: nn.Parameter  # the model's parameter (plain tensor or DTensor)
    home: ParamHome
    shard_dim: int | None  # the dim ZeRO shards over replicas (None: the whole tensor on every replica)
    master: nn.Parameter  # what the optimizer steps: the replica's shard (or the local tensor itself)

    @property
    def bounds(self) -> tuple[int, int]:
        local = local_tensor(self.param)
        return chunk_bounds(local.size(self.shard_dim), self.home.replicas, self.home.replica_rank)


def zero_shard_dim(shape: torch.Size, placements: tuple[Placement, ...]) -> int | None:
    """The dim ZeRO splits across replicas: the first dim no model dim (tp/ep) splits. When model dims split
    every dim (a 1-D tensor split with its heads: V4's attention sinks), ZeRO splits the rank's model shard
    again on that same dim - a strided shard of the whole tensor, as FSDP2 does at zero=3 (`_StridedShard`) -
    so every tensor with a dimension is sharded over its replicas, which is what the cost model prices
    (`cost_model.memory.static_memory` divides all dense parameters by dp). None only for a 0-dim tensor."""
    taken = {p.dim for p in placements if isinstance(p, Shard)}
    free = next((d for d in range(len(shape)) if d not in taken), None)
    return free if free is not None or not taken else min(taken)


def replica_placement(shard_dim: int | None, placements: tuple[Placement, ...], mesh: DeviceMesh) -> Placement:
    """How ZeRO's split over replicas (mesh dim 0) appears in a DTensor of the whole tensor: Shard on a dim no
    model dim splits; on a dim the model dims split too, the replica splits each model shard (right to left,
    as `zero_shard_dim` does), which DTensor's left-to-right convention writes as a `_StridedShard` whose
    split factor is the number of model shards of that dim."""
    if shard_dim is None:
        return Replicate()
    splits = math.prod(
        mesh.size(i) for i, p in enumerate(placements) if i > 0 and isinstance(p, Shard) and p.dim == shard_dim
    )
    return _StridedShard(shard_dim, split_factor=splits) if splits > 1 else Shard(shard_dim)


class DataParallelAdamW:
    """AdamW over data-parallel replicas with ZeRO stage 0, 1 or 2 (see the module docstring).

    `reduce_gradients()` after the backward of the last micro-batch, then `step()`.
    """

    def __init__(
        self,
        named_params: list[tuple[str, nn.Parameter, ParamHome]],
        zero: int,
        *,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        eps: float = 1e-8,
        optimizer: str = "adamw",
    ):
        if zero not in (0, 1, 2):
            raise ValueError(f"DataParallelAdamW runs ZeRO stages 0-2, got {zero}")
        self.zero = zero
        self.slots: list[ShardedParam] = []
        self.in_graph: set[str] = set()  # parameters whose reduction this step's backward issued (gradient_reductions)
        # True once the trainer reads the parameters through `gradient_reductions` (`runtime.rank_loss`): the backward's
        # `ReducedGradient` nodes then sum the tp-partial gradients too, and their hooks stand aside.
        self.reduces_in_graph = False
        for name, param, home in named_params:
            local = local_tensor(param)
            shard_dim = zero_shard_dim(local.shape, home.placements) if zero > 0 and home.replicas > 1 else None
            # The master is a view of the parameter's storage (the whole local tensor, or this replica's slice):
            # the step updates the model in place, and fp32 training holds no second copy of the weights.
            master = local.detach()
            if shard_dim is not None:
                start, end = chunk_bounds(local.size(shard_dim), home.replicas, home.replica_rank)
                master = master.narrow(shard_dim, start, end - start)
            slot = ShardedParam(name, param, home, shard_dim, nn.Parameter(master, requires_grad=True))
            self.slots.append(slot)
            if home.partial_over is not None:
                param.register_hook(self._partial_sum(home.partial_over))
            if zero == 2 and shard_dim is not None:
                # ZeRO-2: reduce-scatter each gradient as soon as it is accumulated, keeping only the shard.
                param.register_post_accumulate_grad_hook(lambda p, slot=slot: self._scatter_now(slot))
        # foreach=False: the per-tensor kernel, so every plan performs the same elementwise arithmetic.
        if optimizer == "muon":
            from trex.runtime.muon import MuonWithAdamW

            self.optimizer = MuonWithAdamW(
                [(s.name, s.master) for s in self.slots], lr=lr, betas=betas, weight_decay=weight_decay, eps=eps
            )
        else:
            self.optimizer = torch.optim.AdamW(
                [s.master for s in self.slots], lr=lr, betas=betas, weight_decay=weight_decay, eps=eps, foreach=False
            )

    # -- gradients ------------------------------------------------------------------------------
    def _partial_sum(self, group: dist.ProcessGroup):
        """A gradient hook for a rank whose reductions are not in its graph (a `--compile`d rank): each micro-batch's
        tp-partial gradient summed over `group`, blocking, tensor by tensor (the cost model's `tp_grad_sync`)."""

        def hook(grad: torch.Tensor) -> torch.Tensor:
            if self.reduces_in_graph:  # `ReducedGradient` sums it (once per step, or its shard under ZeRO-2)
                return grad
            total = grad.contiguous().clone()
            dist.all_reduce(total, group=group)
            return total

        return hook

    def gradient_reductions(self, last: bool) -> dict[str, GradientReduction]:
        """What the micro-batch's forward passes each parameter (plain or DTensor) that has replicas or is tp-partial
        through (`ReducedGradient`, applied by `through_reductions` - inside the rank's captured program under
        `--compile`, `runtime.rank_loss`), so its gradient reduction is a functional collective issued by the
        backward of the model's own graph (captured by Dynamo/AOT with the rest).

        ZeRO-0/1: the last micro-batch all-reduces the gradient accumulated so far (earlier micro-batches
        accumulate locally) and hands the whole sum to the parameter's `.grad`. ZeRO-2: every micro-batch
        reduce-scatters its gradient and the shard accumulates into the optimizer's shard (`master.grad`), so the
        whole gradient never outlives the backward. A tp-partial parameter (`ParamHome.partial_over`) is summed over
        tp by the same node: with the replicas' all-reduce in the last micro-batch (the earlier ones accumulate
        their partial gradients locally: both sums are linear), or, under ZeRO-2, on its reduce-scattered shard in
        every micro-batch. Parameters left out (1-process runs) are reduced by `reduce_gradients` as before;
        `reduce_gradients` skips the others."""
        self.reduces_in_graph = True
        out: dict[str, GradientReduction] = {}
        for slot in self.slots:
            if not _reducible_in_graph(slot):
                continue
            if self.zero == 2 and slot.shard_dim is not None:
                out[slot.name] = GradientReduction(slot.param, slot.master, None, _Reduction.of(slot, "scatter"))
                self.in_graph.add(slot.name)
            elif last:
                if (
                    slot.name in self.in_graph
                ):  # its gradient is already the replicas' sum: reducing again adds it twice
                    raise RuntimeError(f"{slot.name}: a second last micro-batch before reduce_gradients()")
                carried, slot.param.grad = slot.param.grad, None  # earlier micro-batches' local sum joins this one
                out[slot.name] = GradientReduction(slot.param, None, carried, _Reduction.of(slot, "all_reduce"))
                self.in_graph.add(slot.name)
        return out

    def _scatter_now(self, slot: ShardedParam) -> None:
        if slot.param.grad is None:  # reduced in the graph (`ReducedGradient` hands the shard to the master)
            return
        grad = _matching(slot.param.grad, slot.param)
        shard = _reduce_scatter(local_tensor(grad), slot.shard_dim, slot.home, slot.home.replica_group)
        slot.master.grad = shard if slot.master.grad is None else slot.master.grad + shard
        slot.param.grad = None

    def reduce_gradients(self) -> None:
        """Sum each gradient over its replica group (all-reduce; ZeRO-2 reduce-scattered in the backward)
        and hand the optimizer this replica's part."""
        self.held_gradient_bytes = 0
        reduced, self.in_graph = self.in_graph, set()
        for slot in self.slots:
            grad = slot.param.grad
            if self.zero == 2 and slot.shard_dim is not None:
                if slot.master.grad is None:  # no gradient reached this parameter
                    slot.master.grad = torch.zeros_like(slot.master)
                self.held_gradient_bytes += slot.master.grad.numel() * slot.master.grad.element_size()
                continue
            if grad is None:
                grad = torch.zeros_like(slot.param)
            self.held_gradient_bytes += local_tensor(grad).numel() * local_tensor(grad).element_size()
            grad = local_tensor(_matching(grad, slot.param))
            group = slot.home.replica_group
            if group is not None and slot.home.replicas > 1 and slot.name not in reduced:
                grad = grad.contiguous()
                dist.all_reduce(grad, group=group)
            if slot.shard_dim is not None:
                start, end = slot.bounds
                grad = grad.narrow(slot.shard_dim, start, end - start)
            slot.master.grad = grad.contiguous()
            slot.param.grad = None  # ZeRO-1/2: only the shard stays; ZeRO-0: the master aliases the parameter

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for slot in self.slots:
            if slot.shard_dim is not None:
                _all_gather_into(local_tensor(slot.param), slot.master.detach(), slot.shard_dim, slot.home)

    # -- state for checkpoints and accounting ---------------------------------------------------
    def ensure_state(self) -> None:
        """Create AdamW's state (zeros) for every parameter, as its first step would."""
        for slot in self.slots:
            if self._is_muon(slot):
                part = next(p for p in self.optimizer.parts if isinstance(p, torch.optim.Muon))
                if not part.state[slot.master]:
                    part.state[slot.master]["momentum_buffer"] = torch.zeros_like(slot.master)
                continue
            state = self._adamw_state(slot)
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(slot.master, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(slot.master, memory_format=torch.preserve_format)

    def _is_muon(self, slot: ShardedParam) -> bool:
        return hasattr(self.optimizer, "is_muon") and self.optimizer.is_muon(slot.master)

    def _adamw_state(self, slot: ShardedParam) -> dict:
        if hasattr(self.optimizer, "parts"):
            part = next(p for p in self.optimizer.parts if isinstance(p, torch.optim.AdamW))
            return part.state[slot.master]
        return self.optimizer.state[slot.master]

    def global_view(self, slot: ShardedParam, local: torch.Tensor) -> torch.Tensor | DTensor:
        """`local` (this replica's shard of an optimizer tensor of `slot`) as a DTensor of the whole parameter."""
        home = slot.home
        if home.mesh is None:
            return local
        replica = replica_placement(slot.shard_dim, home.placements, home.mesh)
        shape = home.global_shape
        stride = tuple(math.prod(shape[d + 1 :]) for d in range(len(shape)))
        return DTensor.from_local(
            local, home.mesh, [replica, *home.placements[1:]], run_check=False, shape=torch.Size(shape), stride=stride
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        self.ensure_state()
        out: dict[str, torch.Tensor] = {}
        for slot in self.slots:
            state = self.optimizer.state[slot.master]
            for key, value in state.items():  # AdamW: exp_avg, exp_avg_sq, step; Muon: momentum_buffer
                same_shape = isinstance(value, torch.Tensor) and value.shape == slot.master.shape
                out[f"{slot.name}.{key}"] = self.global_view(slot, value) if same_shape else value
        return out

    def state_bytes(self) -> int:
        total = 0
        for slot in self.slots:
            state = self.optimizer.state.get(slot.master, {})
            total += sum(t.numel() * t.element_size() for k, t in state.items() if k != "step")
        return total

    def gradient_bytes(self) -> int:
        """Gradient bytes this rank held when the backward ended (full for ZeRO-0/1, shards for ZeRO-2)."""
        return getattr(self, "held_gradient_bytes", 0)


def _reducible_in_graph(slot: ShardedParam) -> bool:
    """A parameter whose gradient needs a sum over its replicas or over the tp ranks it is partial on, or a DTensor
    parameter (its gradient may be Partial over tp - a sequence-parallel norm's - even without replicas: DTensor
    redistributes it to the parameter's placements with a functional collective inside the same node)."""
    home = slot.home
    return home.mesh is not None and (
        home.replicas > 1 or home.partial_over is not None or isinstance(slot.param, DTensor)
    )


class GradientReduction(NamedTuple):
    """One parameter read through `ReducedGradient`: the arguments of its `apply` (a tuple, so a captured program
    takes it as graph inputs plus a constant)."""

    param: torch.Tensor
    master: torch.Tensor | None  # ZeRO-2: the optimizer's shard, which receives the reduce-scattered gradient
    carried: torch.Tensor | None  # ZeRO-0/1: what earlier micro-batches accumulated locally
    reduction: _Reduction


def through_reductions(reductions: dict[str, GradientReduction]) -> dict[str, torch.Tensor]:
    """Each parameter of `reductions` passed through its `ReducedGradient` node, by name (for `functional_call`)."""
    return {name: ReducedGradient.apply(*entry) for name, entry in reductions.items()}


@dataclass(frozen=True)
class _Reduction:
    """What `ReducedGradient`'s backward issues for one parameter (plain data: Dynamo treats it as a constant)."""

    kind: str  # "all_reduce" (ZeRO-0/1) or "scatter" (ZeRO-2: reduce-scatter, keep this replica's shard)
    group: str | None  # the replica group's name (functional collectives take it); None: no replicas
    parts: int
    rank: int
    shard_dim: int | None
    partial: str | None = None  # the tp group the gradient is partial over (`ParamHome.partial_over`), summed too
    placements: tuple[Placement, ...] | None = None  # a DTensor parameter's placements on its tp mesh

    @classmethod
    def of(cls, slot: ShardedParam, kind: str) -> _Reduction:
        home = slot.home
        group = home.replica_group.group_name if home.replicas > 1 else None
        partial = home.partial_over.group_name if home.partial_over is not None else None
        placements = tuple(slot.param.placements) if isinstance(slot.param, DTensor) else None
        return cls(kind, group, home.replicas, home.replica_rank, slot.shard_dim, partial, placements)


class ReducedGradient(torch.autograd.Function):
    """Identity on a parameter in the forward; its backward sums the gradient over the replica group with a
    functional collective (`torch.distributed._functional_collectives`), so the reduction is a node of the
    rank's backward graph: dumps show it, the cost model prices it, passes may move it.

    all_reduce: the gradient (plus `carried`, what earlier micro-batches accumulated) summed over the group (and
    over the tp group it is partial on) goes to the parameter. scatter: the gradient is reduce-scattered, the shard
    summed over the tp group it is partial on, and this replica's shard goes to `master` (the optimizer's shard, a
    leaf of its own); the parameter gets none."""

    @staticmethod
    def forward(ctx, param, master, carried, reduction: _Reduction):
        ctx.reduction = reduction
        # The carried sum is gradient memory (priced with the gradients), not a saved activation: kept on ctx rather
        # than through save_for_backward, which saved-tensor accounting (runtime.memory_accounting) would count.
        # Captured by Dynamo, a DTensor kept on ctx is silently dropped from the backward (a tensor input the
        # backward reads is saved by AOTAutograd anyway): there it goes through save_for_backward.
        ctx.carried, ctx.saved_carried = carried, carried is not None and torch.compiler.is_compiling()
        if ctx.saved_carried:
            ctx.save_for_backward(carried)
            ctx.carried = None
        return param.view_as(param)

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed._functional_collectives as funcol

        r: _Reduction = ctx.reduction
        carried = ctx.saved_tensors[0] if ctx.saved_carried else ctx.carried
        if carried is not None:
            grad = grad + carried
            ctx.carried = None
        spec = None
        if isinstance(grad, DTensor):  # a DTensor parameter: its tp sum (a Partial gradient) by DTensor, then local
            if tuple(grad.placements) != r.placements:
                grad = grad.redistribute(grad.device_mesh, r.placements)
            spec, grad = grad, grad.to_local()
        if r.kind == "all_reduce":
            grad = grad.contiguous()
            for group in (r.partial, r.group):
                if group is not None:
                    grad = funcol.wait_tensor(funcol.all_reduce(grad, "sum", group))
            if spec is not None:
                grad = DTensor.from_local(
                    grad, spec.device_mesh, spec.placements, run_check=False, shape=spec.shape, stride=spec.stride()
                )
            return grad, None, None, None
        size = grad.size(r.shard_dim)
        padded = _padded(grad, r.shard_dim, r.parts)
        shard = funcol.wait_tensor(funcol.reduce_scatter_tensor(padded, "sum", 0, r.group))
        if r.partial is not None:  # the tp sum of the shard: 1/replicas of the bytes of summing the whole gradient
            shard = funcol.wait_tensor(funcol.all_reduce(shard, "sum", r.partial))
        start, end = chunk_bounds(size, r.parts, r.rank)
        return None, shard[: end - start].movedim(0, r.shard_dim).contiguous(), None, None


def _matching(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A DTensor gradient in its parameter's placements (a Partial sum under sequence parallelism is reduced)."""
    if isinstance(grad, DTensor) and tuple(grad.placements) != tuple(param.placements):
        return grad.redistribute(grad.device_mesh, param.placements)
    return grad


def _padded(tensor: torch.Tensor, dim: int, parts: int) -> torch.Tensor:
    size = tensor.size(dim)
    chunk = math.ceil(size / parts) if size else 0
    moved = tensor.movedim(dim, 0)
    if chunk * parts != size:
        pad = moved.new_zeros((chunk * parts - size, *moved.shape[1:]))
        moved = torch.cat([moved, pad])
    return moved.contiguous()


def _reduce_scatter(grad: torch.Tensor, dim: int, home: ParamHome, group: dist.ProcessGroup) -> torch.Tensor:
    parts = home.replicas
    full = _padded(grad, dim, parts)
    out = full.new_empty((full.size(0) // parts, *full.shape[1:]))
    dist.reduce_scatter_tensor(out, full, group=group)
    start, end = chunk_bounds(grad.size(dim), parts, home.replica_rank)
    return out[: end - start].movedim(0, dim)


def _all_gather_into(target: torch.Tensor, shard: torch.Tensor, dim: int, home: ParamHome) -> None:
    parts = home.replicas
    size = target.size(dim)
    chunk = math.ceil(size / parts) if size else 0
    moved = shard.movedim(dim, 0)
    if moved.size(0) < chunk:
        moved = torch.cat([moved, moved.new_zeros((chunk - moved.size(0), *moved.shape[1:]))])
    gathered = moved.new_empty((chunk * parts, *moved.shape[1:]))
    dist.all_gather_into_tensor(gathered, moved.contiguous(), group=home.replica_group)
    with torch.no_grad():
        target.copy_(gathered[:size].movedim(0, dim))


# ---------------------------------------------------------------------------------------------
# ZeRO-3 inside the captured graph (the SimpleFSDP idea: Zhang et al. 2024, "SimpleFSDP: Simpler
# Fully Sharded Data Parallel with torch.compile")
#
# FSDP2 gathers parameters in hooks, outside any graph, so no graph pass can move its collectives.
# Here each parameter is stored as this rank's 1/N flat shard and the module reads it through a
# parametrization that all-gathers it with the functional collective whose autograd is a
# reduce-scatter: the captured joint graph holds one all-gather per parameter in the forward (its
# input a graph input, so it can be prefetched) and one reduce-scatter per gradient in the backward.


class GatheredParameter(nn.Module):
    """Parametrization: the whole parameter, all-gathered from this rank's flat shard (padding cut off)."""

    def __init__(self, shape: tuple[int, ...], group: dist.ProcessGroup):
        super().__init__()
        self.shape, self.numel, self.group = tuple(shape), math.prod(shape), group

    def forward(self, shard: torch.Tensor) -> torch.Tensor:
        import torch.distributed._functional_collectives as funcol

        full = funcol.all_gather_single_autograd(shard, 0, self.group)
        return full[: self.numel].view(self.shape)


def shard_parameters_in_graph(model: nn.Module, group: dist.ProcessGroup) -> dict[str, tuple[int, ...]]:
    """Replace every parameter of `model` by this rank's flat shard (zero-padded to a multiple of the group
    size), read through `GatheredParameter`. Gradients land on the shards, summed over the group (the loss
    is normalized by the global batch), so a plain optimizer on `model.parameters()` is ZeRO-3.
    Returns each sharded parameter's whole shape; a parameter shared by several modules (tied weights)
    keeps one shard that every module gathers."""
    from torch.nn.utils import parametrize

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    shards: dict[int, nn.Parameter] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for module_name, module in list(model.named_modules()):
        for attr, param in list(module.named_parameters(recurse=False)):
            shard = shards.get(id(param))
            if shard is None:
                flat = param.detach().flatten()
                padded = torch.cat([flat, flat.new_zeros(-flat.numel() % world)])
                shard = nn.Parameter(padded.chunk(world)[rank].clone(), requires_grad=param.requires_grad)
                shards[id(param)] = shard
            parametrize.register_parametrization(module, attr, GatheredParameter(param.shape, group), unsafe=True)
            module.parametrizations[attr].original = shard
            shapes[f"{module_name}.{attr}" if module_name else attr] = tuple(param.shape)
    return shapes

"""Apply a resolved plan to a freshly built model: meshes, tp, ep, data parallelism and its optimizer.

The result, `AppliedPlan`, is what the trainer drives: the model to call, the optimizer (whose
`reduce_gradients` sums gradients over each parameter's replica group), and views of the state for
checkpoints (global DTensors, so a checkpoint loads under any plan) and for memory accounting.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from trex.cost_model.parallel import ParallelConfig
from trex.runtime.data_parallel import (
    DataParallelAdamW,
    GradientReduction,
    ParamHome,
    chunk_bounds,
    local_tensor,
)
from trex.runtime.mesh import PlanMeshes, build_meshes

BETAS = (0.9, 0.95)


@dataclass(frozen=True)
class GlobalLayout:
    """How one FSDP-managed local tensor sits in its whole parameter: a 2-D mesh and a placement per dim."""

    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    shape: tuple[int, ...]


class FullyShardedAdamW:
    """ZeRO-3 through FSDP2: `fully_shard` reduce-scatters gradients itself (summed: the loss is already
    normalized by the global batch); AdamW steps the sharded DTensor parameters.

    Parameters FSDP shards that are already a plain shard of something larger (routed experts split over
    ep, head-parallel attention weights split over tp) have a `GlobalLayout`: FSDP splits another dim
    where the tensor has one (experts: dim 1 over edp, dim 0 being split over ep), so the whole
    parameter is one 2-D DTensor; `global_view` gives it, for checkpoints and gathered gradients.
    """

    def __init__(
        self, model: nn.Module, *, lr: float, weight_decay: float, layouts: dict[str, GlobalLayout] | None = None
    ):
        self.named = list(model.named_parameters())
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self.named], lr=lr, betas=BETAS, weight_decay=weight_decay, foreach=False
        )
        self.held_gradient_bytes = 0
        self.layouts = layouts or {}

    def global_view(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` (a parameter of `name`, its gradient or an optimizer moment) as a DTensor of the whole
        parameter; FSDP's own DTensor for the others."""
        layout = self.layouts.get(name)
        if layout is None or not isinstance(tensor, DTensor):
            return tensor
        return DTensor.from_local(
            tensor.to_local(),
            layout.mesh,
            list(layout.placements),
            run_check=False,
            shape=torch.Size(layout.shape),
            stride=_contiguous_stride(layout.shape),
        )

    tp_partial: set[str] = set()
    tp_group: dist.ProcessGroup | None = None

    def reduce_gradients(self) -> None:
        for name, p in self.named:
            if name in self.tp_partial and p.grad is not None:
                dist.all_reduce(local_tensor(p.grad), group=self.tp_group)
            if p.grad is None and p.requires_grad:
                # A parameter no gradient reached (DeepSeek-V4's lightning indexer only chooses entries) steps with a
                # zero gradient, as under every other plan (`DataParallelAdamW`): AdamW's weight decay still applies,
                # so the weights stay those of the 1-rank run, and its states exist as the cost model prices them.
                p.grad = torch.zeros_like(p)
        self.held_gradient_bytes = sum(
            local_tensor(p.grad).numel() * p.grad.element_size() for _, p in self.named if p.grad is not None
        )

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def ensure_state(self) -> None:
        for _, p in self.named:
            state = self.optimizer.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)

    def state_dict(self) -> dict[str, torch.Tensor]:
        self.ensure_state()
        out = {}
        for name, p in self.named:
            state = self.optimizer.state[p]
            out.update(
                {
                    f"{name}.exp_avg": self.global_view(name, state["exp_avg"]),
                    f"{name}.exp_avg_sq": self.global_view(name, state["exp_avg_sq"]),
                    f"{name}.step": state["step"],
                }
            )
        return out

    def state_bytes(self) -> int:
        return sum(
            local_tensor(t).numel() * t.element_size()
            for s in self.optimizer.state.values()
            for k, t in s.items()
            if k != "step"
        )

    def gradient_bytes(self) -> int:
        return self.held_gradient_bytes

    def full_gradients(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, p in self.named:
            if p.grad is None:  # no gradient reached it (the 1-rank run reports zeros for those)
                layout = self.layouts.get(name)
                out[name] = torch.zeros(layout.shape if layout else p.shape, dtype=p.dtype)
            else:
                grad = self.global_view(name, p.grad)
                out[name] = grad.full_tensor() if isinstance(grad, DTensor) else grad.clone()
        return out


@dataclass(frozen=True)
class VocabShard:
    """This tp rank's part of the vocabulary: the first column of its logits, and the tp group's name."""

    start: int
    group: str


@dataclass
class AppliedPlan:
    model: nn.Module
    plan: ParallelConfig
    optimizer: DataParallelAdamW | FullyShardedAdamW
    meshes: PlanMeshes | None
    homes: dict[str, ParamHome]
    notes: list[str] = field(default_factory=list)

    @property
    def replicas(self) -> int:
        return self.plan.data_parallel if self.meshes is not None else 1

    @property
    def replica_index(self) -> int:
        return self.meshes.world.get_local_rank("dp") if self.meshes is not None else 0

    @property
    def replica_group(self) -> dist.ProcessGroup | None:
        return self.meshes.dp_group if self.meshes is not None and self.plan.data_parallel > 1 else None

    def loss_context(self) -> AbstractContextManager:
        if self.plan.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return nullcontext()

    def gradient_reductions(self, last: bool) -> dict[str, GradientReduction]:
        """Parameters whose gradient reduction the micro-batch's backward issues itself (ZeRO-0/1/2; see
        `DataParallelAdamW.gradient_reductions`), by name: what `runtime.rank_loss.RankLoss` passes through
        `ReducedGradient` inside the rank's (captured) program. {} under FSDP2, which reduces in its own hooks."""
        if isinstance(self.optimizer, DataParallelAdamW):
            return self.optimizer.gradient_reductions(last)
        return {}

    def vocab_shard(self) -> VocabShard | None:
        """Under tp, where this rank's columns of the vocabulary-parallel head's logits begin and the tp group's name
        (the loss's collectives run on it); None without tp (the head's logits are whole)."""
        if self.plan.tp == 1 or self.meshes is None:
            return None
        tp = self.meshes.world["tp"]
        vocab = self.model.config.vocab_size
        start, _ = chunk_bounds(vocab, tp.size(), tp.get_local_rank())  # DTensor's Shard(-1) split of the head
        return VocabShard(start, tp.get_group().group_name)

    def before_micro_batch(self, last: bool) -> None:
        """FSDP2 reduce-scatters after every micro-batch's backward (sums into the sharded gradient)."""

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's reduced gradient, whole, keyed by its name in the unsharded model (a collective)."""
        if isinstance(self.optimizer, FullyShardedAdamW):
            return self.optimizer.full_gradients()
        out = {}
        for slot in self.optimizer.slots:
            view = self.optimizer.global_view(slot, slot.master.grad)
            out[slot.name] = view.full_tensor() if isinstance(view, DTensor) else view.clone()
        return out

    def model_state(self) -> dict[str, torch.Tensor]:
        """Parameters as global tensors/DTensors keyed by name (for DCP; loads write into the model)."""
        out = {}
        for name, param in self.model.named_parameters():
            home = self.homes.get(name)
            if isinstance(self.optimizer, FullyShardedAdamW):
                out[name] = self.optimizer.global_view(name, param) if isinstance(param, DTensor) else param.data
                continue
            if home is None or home.mesh is None:
                out[name] = param.data if not isinstance(param, DTensor) else param
                continue
            shape = home.global_shape
            out[name] = DTensor.from_local(
                local_tensor(param).data,
                home.mesh,
                list(home.placements),
                run_check=False,
                shape=torch.Size(shape),
                stride=_contiguous_stride(shape),
            )
        return out

    def memory_bytes(self) -> dict[str, int]:
        params = sum(local_tensor(p).numel() * p.element_size() for p in self.model.parameters())
        return {
            "parameters": params,
            "gradients": self.optimizer.gradient_bytes(),
            "optimizer_states": self.optimizer.state_bytes(),
        }


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, out = 1, []
    for size in reversed(shape):
        out.append(stride)
        stride *= size
    return tuple(reversed(out))


def parallelize(
    model: nn.Module,
    plan: ParallelConfig,
    device: torch.device,
    *,
    lr: float,
    weight_decay: float,
    optimizer: str = "adamw",
    fsdp_roots: list[nn.Module] | None = None,
    fsdp_layers: bool = True,
) -> AppliedPlan:
    """`fsdp_roots` (zero=3 only): the modules that run forward and are wrapped last by `fully_shard`, instead of
    `model` itself - a pipeline rank's chunk modules, which hold its embedding / head and share its layers.
    `fsdp_layers=False` (zero=3, ep=1): the roots are the only FSDP units, no decoder layer is its own - for
    the pipeline schedules that split the backward (`runtime.pipeline.limits`)."""
    model.to(device)
    if optimizer == "muon":
        from trex.runtime.muon import check_muon_plan

        check_muon_plan(plan.tp, plan.zero, plan.data_parallel)
    world = dist.get_world_size() if dist.is_initialized() else 1
    notes: list[str] = []
    if world == 1:
        homes = {name: ParamHome(None, (Replicate(),), tuple(p.shape)) for name, p in model.named_parameters()}
        stepper = DataParallelAdamW(
            [(n, p, homes[n]) for n, p in model.named_parameters()],
            0,
            lr=lr,
            betas=BETAS,
            weight_decay=weight_decay,
            optimizer=optimizer,
        )
        return AppliedPlan(model, plan, stepper, None, homes, notes)
    meshes = build_meshes(plan, device.type)
    global_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    tp_shards: dict[str, int] = {}  # plain parameters split over tp (head-parallel attention): name -> dim
    if plan.tp > 1:
        from trex.runtime import tensor_parallel_heads

        if getattr(model.config, "model_type", None) in tensor_parallel_heads.FAMILIES:
            tp_shards = tensor_parallel_heads.apply_head_parallel(model, meshes.world["tp"])
        else:
            from trex.runtime.tensor_parallel import apply_tensor_parallel

            tp_shards = apply_tensor_parallel(model, meshes.world["tp"])
    expert_names: set[str] = set()
    if plan.ep > 1:
        from trex.runtime.expert_parallel import shard_experts

        expert_names = set(shard_experts(model, meshes.ep_group))
    if plan.zero == 3:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        dp_mesh = meshes.world["dp"]
        # Under tp, parameters that are not DTensors (router, q/k norms) see only this rank's tokens or
        # heads: their gradients are summed over tp as well (FSDP reduces over dp only). Routed experts
        # under ep already hold every token of their ep group: they are summed over edp only.
        # Routed experts at ep=1 under tp see this rank's tokens: FSDP shards them over every rank of the stage
        # (dp x tp, their expert-data-parallel group, as ZeRO-0/1/2 and the cost model have them), so its
        # reduce-scatter sums them over tp as well.
        everyone_experts = _routed_expert_names(model) if plan.tp > 1 and plan.ep == 1 else set()
        tp_partial = [
            name
            for name, p in model.named_parameters()
            if plan.tp > 1
            and not isinstance(p, DTensor)
            and name not in expert_names
            and name not in tp_shards
            and name not in everyone_experts
        ]
        layouts: dict[str, GlobalLayout] = {}
        fsdp_dim: dict[int, int] = {}  # id(param) -> the dim FSDP splits over its data-parallel group
        for name, p in model.named_parameters():
            if name in expert_names:  # dim 0 (experts) is split over ep: FSDP splits dim 1 over edp
                fsdp_dim[id(p)] = 1
                layouts[name] = GlobalLayout(meshes.experts, (Shard(1), Shard(0)), global_shapes[name])
            elif name in tp_shards:  # a head/column shard over tp: FSDP splits another dim over dp
                tp_dim = tp_shards[name]
                free = next((d for d in range(p.dim()) if d != tp_dim), None)
                if free is None:  # 1-D (V4's sinks): FSDP splits the tp shard itself, a strided shard
                    fsdp_dim[id(p)] = 0
                    dp_placement = _StridedShard(0, split_factor=plan.tp)
                else:
                    fsdp_dim[id(p)] = free
                    dp_placement = Shard(free)
                layouts[name] = GlobalLayout(meshes.world, (dp_placement, Shard(tp_dim)), global_shapes[name])

        def placement(param: nn.Parameter) -> Shard:
            return Shard(fsdp_dim.get(id(param), 0))

        if expert_names or everyone_experts:
            from trex.integrations.transformers_moe import experts_modules

            experts_mesh = meshes.experts["edp"] if expert_names else meshes.everyone
            for _, module in experts_modules(model):
                fully_shard(module, mesh=experts_mesh, shard_placement_fn=placement)
        for layer in _decoder_layers(model) if fsdp_layers else []:
            fully_shard(layer, mesh=dp_mesh, shard_placement_fn=placement)
        roots = fsdp_roots or [model]
        for root in roots:
            fully_shard(root, mesh=dp_mesh, shard_placement_fn=placement)
        for module in [m for root in roots for m in root.modules()]:
            if isinstance(module, FSDPModule):
                # Plain SUM reduce-scatter, divided by 1 (gloo has no PREMUL_SUM/AVG): the loss is already
                # normalized by the global batch, so replicas' gradients add up.
                module.set_force_sum_reduction_for_comms(True)
                module.set_gradient_divide_factor(1.0)
        optimizer = FullyShardedAdamW(model, lr=lr, weight_decay=weight_decay, layouts=layouts)
        optimizer.tp_partial = set(tp_partial)
        optimizer.tp_group = meshes.world.get_group("tp") if plan.tp > 1 else None
        return AppliedPlan(model, plan, optimizer, meshes, {}, notes)
    homes = {}
    routed_experts = _routed_expert_names(model) if plan.tp > 1 else set()
    tp_group = meshes.world.get_group("tp") if plan.tp > 1 else None
    for name, param in model.named_parameters():
        if name in expert_names:
            homes[name] = ParamHome(meshes.experts, (Replicate(), Shard(0)), global_shapes[name])
        elif isinstance(param, DTensor):
            homes[name] = ParamHome(meshes.world, (Replicate(), param.placements[0]), global_shapes[name])
        elif name in tp_shards:  # this rank's heads / MLP columns: the whole shard's gradient, summed over dp
            homes[name] = ParamHome(meshes.world, (Replicate(), Shard(tp_shards[name])), global_shapes[name])
        elif plan.tp > 1 and name in routed_experts:
            # Routed experts at ep=1 see this rank's tokens: their expert-data-parallel group is every rank
            # (dp x tp, Megatron's folding with etp=1), which their gradients are summed and ZeRO-sharded over.
            homes[name] = ParamHome(meshes.everyone, (Replicate(),), global_shapes[name])
        elif plan.tp > 1:
            # Replicated on the tp ranks but computed on this rank's tokens or heads only (norms, router, q/k
            # norms, MLA down-projections): the gradient is summed over tp (`partial_over`: by the backward's
            # `ReducedGradient` node with the dp sum, or a hook each micro-batch on a compiled rank), and the
            # parameter is an ordinary dense one, summed and ZeRO-sharded over dp (Megatron's layout, the one the
            # cost model prices).
            homes[name] = ParamHome(
                meshes.world, (Replicate(), Replicate()), global_shapes[name], partial_over=tp_group
            )
        else:
            homes[name] = ParamHome(meshes.world, (Replicate(), Replicate()), global_shapes[name])
    stepper = DataParallelAdamW(
        [(n, p, homes[n]) for n, p in model.named_parameters()],
        plan.zero,
        lr=lr,
        betas=BETAS,
        weight_decay=weight_decay,
        optimizer=optimizer,
    )
    return AppliedPlan(model, plan, stepper, meshes, homes, notes)


def _routed_expert_names(model: nn.Module) -> set[str]:
    from trex.integrations.transformers_moe import experts_modules

    prefixes = [name + "." for name, _ in experts_modules(model)]
    return {name for name, _ in model.named_parameters() if any(name.startswith(p) for p in prefixes)}


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    inner = getattr(model, "model", model)
    return list(getattr(inner, "layers", []))

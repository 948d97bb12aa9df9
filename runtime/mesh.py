"""The device meshes a plan runs on, built with torch.distributed's `DeviceMesh`.

Dense parameters use the world mesh ("dp", "tp"), tp fastest (Megatron's tp-cp-dp order with
cp = pp = 1). Routed experts use the expert mesh ("edp", "ep") folded over the same ranks with ep
fastest (etp = 1): ranks r and r+1 share an expert-parallel group, and the expert-data-parallel
group (the one expert gradients are summed over) strides by ep. With pipeline parallelism (pp > 1)
every mesh is built over the whole world with pp outermost (Megatron's tp-cp-dp-pp order) and sliced
to this rank's stage; `pipeline` then holds the "pp" mesh (the ranks of one replica, one per stage).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trex.cost_model.parallel import ParallelConfig


@dataclass
class PlanMeshes:
    world: DeviceMesh  # ("dp", "tp")
    experts: DeviceMesh  # ("edp", "ep")
    everyone: DeviceMesh  # ("dp_tp",): all ranks of a stage, for parameters replicated across dp and tp
    pipeline: DeviceMesh | None = None  # ("pp",) with pp > 1: this replica's rank of every stage

    @property
    def dp_group(self) -> dist.ProcessGroup:
        return self.world.get_group("dp")

    @property
    def ep_group(self) -> dist.ProcessGroup:
        return self.experts.get_group("ep")


def build_meshes(plan: ParallelConfig, device_type: str) -> PlanMeshes:
    if plan.pp > 1:
        return _pipeline_meshes(plan, device_type)
    world = init_device_mesh(device_type, (plan.data_parallel, plan.tp), mesh_dim_names=("dp", "tp"))
    ranks = torch.arange(plan.devices)
    experts = DeviceMesh(device_type, ranks.view(plan.edp, plan.ep), mesh_dim_names=("edp", "ep"))
    everyone = DeviceMesh(device_type, ranks, mesh_dim_names=("dp_tp",))
    return PlanMeshes(world, experts, everyone)


def _pipeline_meshes(plan: ParallelConfig, device_type: str) -> PlanMeshes:
    """The meshes of one stage, sliced from world meshes with pp outermost (every rank builds all of them)."""
    pp, dp, tp = plan.pp, plan.data_parallel, plan.tp
    grid = init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    ranks = torch.arange(plan.devices)
    experts = DeviceMesh(device_type, ranks.view(pp, plan.edp, plan.ep), mesh_dim_names=("pp", "edp", "ep"))
    everyone = DeviceMesh(device_type, ranks.view(pp, dp * tp), mesh_dim_names=("pp", "dp_tp"))
    return PlanMeshes(grid["dp", "tp"], experts["edp", "ep"], everyone["dp_tp"], grid["pp"])

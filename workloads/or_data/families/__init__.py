"""The problem families, one module each, registered here in one explicit table.

Every family implements `trex.workloads.or_data.families.base.Family`: a randomized generator and
four independent writers (linear model, pyscipopt program, mathematical model, statement).
"""

from __future__ import annotations

from trex.workloads.or_data.families.allocation import ResourceAllocation
from trex.workloads.or_data.families.assignment import Assignment
from trex.workloads.or_data.families.backlog import BacklogPlanning
from trex.workloads.or_data.families.base import Family, Generated, WhatIf
from trex.workloads.or_data.families.blending import Blending
from trex.workloads.or_data.families.covering import SetCovering
from trex.workloads.or_data.families.facility import FacilityLocation
from trex.workloads.or_data.families.knapsack import Knapsack
from trex.workloads.or_data.families.lot_sizing import LotSizing
from trex.workloads.or_data.families.network import NetworkFlow
from trex.workloads.or_data.families.network_design import NetworkDesign
from trex.workloads.or_data.families.packing import BinPacking
from trex.workloads.or_data.families.piecewise import PiecewiseCosts
from trex.workloads.or_data.families.production import ProductionPlanning
from trex.workloads.or_data.families.routing import VehicleRouting
from trex.workloads.or_data.families.scheduling import MachineScheduling
from trex.workloads.or_data.families.staffing import ShiftScheduling
from trex.workloads.or_data.families.time_indexed import TimeIndexedScheduling
from trex.workloads.or_data.families.transportation import Transportation
from trex.workloads.or_data.prose import register_names

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        ProductionPlanning(),
        Blending(),
        Assignment(),
        Knapsack(),
        FacilityLocation(),
        SetCovering(),
        ShiftScheduling(),
        MachineScheduling(),
        NetworkFlow(),
        LotSizing(),
        BinPacking(),
        ResourceAllocation(),
        Transportation(),
        BacklogPlanning(),
        PiecewiseCosts(),
        NetworkDesign(),
        TimeIndexedScheduling(),
        VehicleRouting(),
    )
}


def _proper_names() -> set[str]:
    """Capitalized strings in the families' scenario pools (sites, places, people, companies)."""
    import dataclasses
    import sys

    names: set[str] = set()
    for family in FAMILIES.values():
        module = sys.modules[type(family).__module__]
        for scenario in getattr(module, "SCENARIOS", ()):
            if not dataclasses.is_dataclass(scenario):
                continue
            for value in (getattr(scenario, field.name) for field in dataclasses.fields(scenario)):
                if isinstance(value, tuple):
                    names.update(item for item in value if isinstance(item, str) and item[:1].isupper())
    return names


register_names(_proper_names())

__all__ = ["FAMILIES", "Family", "Generated", "WhatIf"]

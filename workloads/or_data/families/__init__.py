"""The problem families, one module each, registered here in one explicit table.

Every family implements `trex.workloads.or_data.families.base.Family`: a randomized generator and
four independent writers (linear model, pyscipopt program, mathematical model, statement).
"""

from __future__ import annotations

from trex.workloads.or_data.families.base import Family, Generated, WhatIf
from trex.workloads.or_data.families.allocation import ResourceAllocation
from trex.workloads.or_data.families.assignment import Assignment
from trex.workloads.or_data.families.blending import Blending
from trex.workloads.or_data.families.covering import SetCovering
from trex.workloads.or_data.families.facility import FacilityLocation
from trex.workloads.or_data.families.knapsack import Knapsack
from trex.workloads.or_data.families.lot_sizing import LotSizing
from trex.workloads.or_data.families.network import NetworkFlow
from trex.workloads.or_data.families.packing import BinPacking
from trex.workloads.or_data.families.production import ProductionPlanning
from trex.workloads.or_data.families.scheduling import MachineScheduling
from trex.workloads.or_data.families.staffing import ShiftScheduling
from trex.workloads.or_data.families.transportation import Transportation

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
    )
}

__all__ = ["FAMILIES", "Family", "Generated", "WhatIf"]

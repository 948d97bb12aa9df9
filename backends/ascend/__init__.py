"""The Ascend backend: torch_npu fused operators, checked against torch_npu's shipped schemas, with
CPU emulations so lowered graphs run (and are tested) without an NPU. See backends/ascend/README.md.
"""

from trex.backends.ascend.backend import AscendBackend, AscendLoweredModule
from trex.backends.ascend.schemas import AscendSchemaError, check_call

__all__ = ["AscendBackend", "AscendLoweredModule", "AscendSchemaError", "check_call"]

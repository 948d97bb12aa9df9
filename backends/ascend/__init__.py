"""The Ascend backend: torch_npu fused operators, checked against torch_npu's shipped schemas, with
CPU emulations so lowered graphs run (and are tested) without an NPU. See backends/ascend/README.md.

Names are imported on first use, so `python -m trex.backends.ascend.extract_schemas` can regenerate
the schema file the emulations are defined from.
"""

from typing import Any

__all__ = ["AscendBackend", "AscendLoweredModule", "AscendSchemaError", "check_call"]


def __getattr__(name: str) -> Any:
    if name in ("AscendBackend", "AscendLoweredModule"):
        from trex.backends.ascend import backend

        return getattr(backend, name)
    if name in ("AscendSchemaError", "check_call"):
        from trex.backends.ascend import schemas

        return getattr(schemas, name)
    raise AttributeError(f"module 'trex.backends.ascend' has no attribute {name!r}")

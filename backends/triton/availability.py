"""When trex's Triton kernels can run: Triton imports and the tensor is on a GPU Triton compiles
for, or `TRITON_INTERPRET=1` asks for Triton's interpreter (how the kernels are tested on CPU).

Every op of the library checks this per call and otherwise runs its reference implementation, so a
graph rewritten to these ops runs (slowly, but with the same meaning) anywhere.
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def triton_import_error() -> str | None:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure means "no Triton here"
        return f"triton does not import: {error}"
    return None


def interpreting() -> bool:
    """TRITON_INTERPRET=1, and Triton's language was imported under it (Triton reads the variable
    when it is first imported: set it later and its library functions are compiled-only)."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1" or triton_import_error() is not None:
        return False
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.standard.sigmoid, InterpretedFunction)


def kernels_run_on(tensor: torch.Tensor) -> bool:
    """True when the Triton kernels (not the references) compute for a tensor on this device."""
    if triton_import_error() is not None:
        return False
    if interpreting():
        return tensor.device.type == "cpu" and tensor.dtype != torch.bfloat16  # numpy has no bfloat16
    return tensor.device.type in ("cuda", "xpu")

"""The `npu_emul` torch.library namespace the CPU emulations of torch_npu's operators are defined in.

Each op is defined with torch_npu's own schema line (`data/torch_npu_schemas.txt`, unchanged); the
emulation modules (`emulation`, `emulation_attention`, `emulation_gating`) register their
implementations, fakes and autograd here.
"""

from __future__ import annotations

import torch

from trex.backends.ascend.schemas import read_data_file

NAMESPACE = "npu_emul"

_library = torch.library.Library(NAMESPACE, "FRAGMENT")
_schemas = read_data_file()[1]
_defined: set[str] = set()


def _define(name: str) -> str:
    """Define npu_emul::name with torch_npu's schema; returns the qualified name."""
    schema = _schemas[name]
    if name not in _defined:
        _library.define(schema)
        _defined.add(name)
    return f"{NAMESPACE}::{name}"


def _implement(name: str):
    qualified = _define(name)

    def wrap(function):
        torch.library.impl(qualified, "default", lib=_library)(function)
        return function

    return wrap


def _fake(name: str):
    return torch.library.register_fake(f"{NAMESPACE}::{name}", lib=_library)

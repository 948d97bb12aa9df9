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


def _autograd(name: str, setup_context):
    """Decorates the backward formula of npu_emul::name (`torch.library.register_autograd`): the emulations
    write each as a call of torch_npu's backward operator on what `setup_context` saved."""

    def wrap(backward):
        torch.library.register_autograd(f"{NAMESPACE}::{name}", backward, setup_context=setup_context, lib=_library)
        return backward

    return wrap


def _autograd_kernel(name: str):
    """Decorates the Autograd-key kernel of npu_emul::name, for schemas `register_autograd` refuses (those
    with keyword-only Tensor arguments): the kernel applies a `torch.autograd.Function` whose forward
    calls the op through `_below_autograd`."""

    def wrap(kernel):
        _library.impl(name, kernel, "Autograd")
        return kernel

    return wrap


def _below_autograd(name: str, *args, **kwargs):
    """npu_emul::name called under the Autograd key (from an autograd.Function's forward)."""
    with torch._C._AutoDispatchBelowAutograd():
        return getattr(torch.ops.npu_emul, name)(*args, **kwargs)

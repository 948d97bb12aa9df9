"""`assert_pass_preserves_semantics`: the check every trex pass is held to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

from trex.graph_copy import copy_graph_module
from trex.pass_manager import Pass, PassContext, PassManager, PassRecord

# Tolerances by dtype, as torch.testing.assert_close uses them.
TOLERANCES = {
    torch.float32: (1.3e-6, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float16: (1e-3, 1e-5),
}


def assert_outputs_close(
    actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None, context: str = ""
) -> None:
    actual_leaves, actual_spec = tree_flatten(actual)
    expected_leaves, expected_spec = tree_flatten(expected)
    if actual_spec != expected_spec:
        raise AssertionError(f"{context}output structure changed: {expected_spec} -> {actual_spec}")
    for index, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"{context}output {index} was a tensor, now {type(a).__name__}")
            default_rtol, default_atol = TOLERANCES.get(e.dtype, (0.0, 0.0))
            torch.testing.assert_close(
                a,
                e,
                rtol=default_rtol if rtol is None else rtol,
                atol=default_atol if atol is None else atol,
                equal_nan=True,
                msg=lambda m, i=index: f"{context}output {i}: {m}",
            )
        elif a != e:
            raise AssertionError(f"{context}output {index}: {e!r} -> {a!r}")


def assert_pass_preserves_semantics(
    pass_: Pass,
    gm: fx.GraphModule,
    inputs: Sequence[Any],
    *,
    ctx: PassContext | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> PassRecord:
    """Run `pass_` on `gm` (in place) through the pass manager, and assert the outputs on `inputs`
    are unchanged within dtype tolerance. Returns the pass's record (decisions, node delta).

    The pass manager's own checks apply too: the graph lints, FakeTensor shapes re-propagate, and
    the output shapes and dtypes are unchanged.
    """
    reference = copy_graph_module(gm)
    reference.recompile()
    expected = reference(*inputs)
    report = PassManager([pass_]).run(gm, ctx or PassContext())
    actual = gm(*inputs)
    assert_outputs_close(actual, expected, rtol=rtol, atol=atol, context=f"pass {pass_.name}: ")
    return report.records[0]

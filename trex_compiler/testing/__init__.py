"""Property-testing kit for passes: hypothesis strategies and the semantics-preservation check.

from hypothesis import given
from trex.testing import graphs, assert_pass_preserves_semantics

@given(graphs())
def test_my_pass_keeps_meaning(case):
    assert_pass_preserves_semantics(MyPass(), case.gm, case.inputs)
"""

from trex.testing.semantics import TOLERANCES, assert_outputs_close, assert_pass_preserves_semantics
from trex.testing.strategies import GraphCase, Program, TinyMoeCase, graphs, moe_configs, programs, trace_program

__all__ = [
    "TOLERANCES",
    "GraphCase",
    "Program",
    "TinyMoeCase",
    "assert_outputs_close",
    "assert_pass_preserves_semantics",
    "graphs",
    "moe_configs",
    "programs",
    "trace_program",
]

"""trex.collector: while trex compiles, the garbage collector skips the objects alive before the compile and
runs fewer full collections; afterwards the process's collector is as it was, and garbage made during the
compile is still collected."""

from __future__ import annotations

import gc
import weakref

import torch

import trex
from trex.collector import freeze_survivors, skip_existing_objects


class _Cycle:
    def __init__(self):
        self.me = self


def test_objects_alive_before_are_skipped_and_everything_is_handed_back():
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    assert frozen == 0
    old = [_Cycle() for _ in range(10)]
    with skip_existing_objects():
        assert gc.get_freeze_count() >= len(old)  # the old objects sit in the permanent generation
        assert gc.get_threshold()[2] >= thresholds[2]
        with skip_existing_objects():  # nested (the backward lowered inside the forward's compile): no change
            assert gc.get_freeze_count() >= len(old)
        assert gc.get_freeze_count() >= len(old)
        garbage = _Cycle()
        ref = weakref.ref(garbage)
        del garbage
        gc.collect()
        assert ref() is None  # a cycle made during the compile is collected as before
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds


def test_a_process_that_froze_objects_itself_keeps_its_freeze():
    """Not touched: no freeze (it would add the 100 fresh objects below to the permanent generation) and no
    unfreeze (it would empty it). The count is compared within bounds, not for equality: a frozen object that
    dies meanwhile (another thread's garbage) leaves the permanent generation, as in one CI run (-2)."""
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with skip_existing_objects():
            fresh = [_Cycle() for _ in range(100)]  # noqa: F841
            freeze_survivors()
            assert count // 2 < gc.get_freeze_count() < count + 100
        assert count // 2 < gc.get_freeze_count() < count + 100
    finally:
        gc.unfreeze()


def test_freezing_survivors_outside_a_compile_does_nothing():
    freeze_survivors()
    assert gc.get_freeze_count() == 0


def test_a_compile_and_its_lazy_backward_leave_the_collector_as_they_found_it():
    thresholds = gc.get_threshold()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    compiled = trex.compile(model, backend=["eager"])
    compiled(torch.randn(2, 4)).sum().backward()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds and gc.isenabled()

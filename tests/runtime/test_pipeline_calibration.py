"""The calibration's split of a pipeline step's non-compute time: gaps between a rank's actions whose inputs
were there (the runtime's per-action work), delays after a neighbour's action (transfer + that work), and
the step's head and tail - from action timestamps, without any process group."""

from __future__ import annotations

import pytest

from trex.runtime.pipeline.calibration import NullChunk, gaps
from trex.runtime.pipeline.timing import Interval


def test_gaps_separate_local_overhead_remote_delay_head_and_tail():
    # two ranks, one chunk each, GPipe with 2 micro-batches; rank 1 also computes the loss after each forward
    rank0 = [
        Interval("F", 0, 0, 1.0, 2.0),
        Interval("F", 0, 1, 2.1, 3.1),  # local gap 0.1
        Interval("B", 0, 0, 6.5, 7.5),  # waits for B(1, 0) ending at 6.0: remote delay 0.5
        Interval("B", 0, 1, 8.5, 9.5),  # B(1, 1) ends at 8.2: remote delay 0.3
    ]
    rank1 = [
        Interval("F", 1, 0, 2.4, 3.4),  # F(0, 0) ended at 2.0: remote delay 0.4
        Interval("L", 1, -1, 3.45, 3.5),  # merged into the forward
        Interval("F", 1, 1, 3.7, 4.2),  # F(0, 1) ended at 3.1, before the previous action: local gap 0.2
        Interval("L", 1, -1, 4.2, 4.3),
        Interval("B", 1, 0, 4.5, 6.0),  # local gap 0.2
        Interval("B", 1, 1, 6.2, 8.2),  # local gap 0.2
    ]
    records = [(0, [(10.0, rank0, 0.5)]), (1, [(8.0, rank1, 0.6)])]
    found = gaps(records, stages=2)
    assert sorted(found["local"]) == pytest.approx([0.1, 0.2, 0.2, 0.2])
    assert sorted(found["remote"]) == pytest.approx([0.3, 0.4, 0.5])
    assert found["head"] == pytest.approx([0.5])  # rank 0's first action waits for nothing
    assert sorted(found["tail"]) == pytest.approx([0.4, 1.0])  # 0.6 + 8.0 - 8.2 and 0.5 + 10.0 - 9.5


def test_null_chunks_keep_the_activation_shapes():
    import torch

    ids = torch.randint(0, 32, (1, 8))
    first, middle, last = (
        NullChunk(True, False, 16, 32),
        NullChunk(False, False, 16, 32),
        NullChunk(False, True, 16, 32),
    )
    hidden = first(ids)
    assert hidden.shape == (1, 8, 16) and hidden.requires_grad
    assert middle(hidden).shape == (1, 8, 16)
    assert last(middle(hidden)).shape == (1, 8, 32)

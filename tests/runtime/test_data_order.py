"""The global batch of a step depends on the seed and the step only; replicas split it without overlap."""

from __future__ import annotations

import json

import pytest
import torch

from trex.errors import TrexError
from trex.runtime.data import TokenSource, micro_batches, replica_rows


def test_synthetic_batches_depend_on_seed_and_step_only():
    a = TokenSource("synthetic", vocab_size=50, seq=8, gbs=4, seed=3)
    b = TokenSource("synthetic", vocab_size=50, seq=8, gbs=4, seed=3)
    assert torch.equal(a.global_batch(5), b.global_batch(5))
    assert not torch.equal(a.global_batch(5), a.global_batch(6))
    assert a.global_batch(0).shape == (4, 9)


def test_replicas_partition_the_global_batch():
    tokens = TokenSource("synthetic", vocab_size=50, seq=8, gbs=8, seed=0).global_batch(0)
    parts = [replica_rows(tokens, r, 4) for r in range(4)]
    assert torch.equal(torch.cat(parts), tokens)
    batches = micro_batches(parts[1], 1)
    assert len(batches) == 2 and torch.equal(batches[0].targets[0], parts[1][0, 1:])


def test_jsonl_windows_cover_every_window_once_per_epoch(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"input_ids": list(range(i * 10, i * 10 + 10))}) for i in range(4)) + "\n")
    source = TokenSource(str(path), vocab_size=100, seq=4, gbs=2, seed=1)  # 40 tokens -> 8 windows of 5
    epoch = torch.cat([source.global_batch(s) for s in range(4)])
    assert sorted(epoch[:, 0].tolist()) == [0, 5, 10, 15, 20, 25, 30, 35]
    second = torch.cat([source.global_batch(s) for s in range(4, 8)])
    assert sorted(second[:, 0].tolist()) == sorted(epoch[:, 0].tolist())  # the next epoch visits them all again


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not valid JSON"),
        ('{"text": "hi"}', 'needs "input_ids"'),
        ('{"input_ids": [1, 999]}', "outside the model's vocabulary"),
    ],
)
def test_bad_jsonl_is_refused_with_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(TrexError, match=message) as error:
        TokenSource(str(path), vocab_size=100, seq=4, gbs=2, seed=0)
    assert "bad.jsonl:1" in str(error.value)

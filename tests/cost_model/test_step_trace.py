"""Chrome traces of an estimated step open in Perfetto: structure checked event by event."""

import json

import pytest

from trex.cost_model.catalog import get_cluster
from trex.cost_model.model_spec import get_model_spec
from trex.cost_model.parallel import ParallelConfig
from trex.cost_model.step import estimate_step
from trex.cost_model.trace import trace_events, validate_trace, write_trace


@pytest.fixture(scope="module")
def estimate():
    return estimate_step(
        get_model_spec("gpt-175b"), get_cluster("a100", 64), ParallelConfig(tp=8, pp=8, vpp=3, seq=2048, gbs=64)
    )


def test_trace_is_valid_trace_event_json(estimate, tmp_path):
    path = write_trace(estimate, tmp_path / "step.json")
    data = json.loads(path.read_text())
    assert validate_trace(data) == []
    assert data["displayTimeUnit"] == "ms"
    names = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(names) == 8  # one process per pipeline stage


def test_every_chunk_and_microbatch_appears_once_forward_and_once_backward(estimate):
    slices = [e for e in trace_events(estimate)["traceEvents"] if e["ph"] == "X" and e["tid"] == 1]
    assert len(slices) == 2 * 24 * 64
    assert len({e["name"] for e in slices}) == len(slices)


def test_timeline_ends_at_the_estimated_step_time(estimate):
    events = [e for e in trace_events(estimate)["traceEvents"] if e["ph"] == "X"]
    end = max(e["ts"] + e["dur"] for e in events) / 1e6
    assert end == pytest.approx(estimate.step_time_s, rel=0.05)


def test_a_broken_trace_is_reported():
    problems = validate_trace(
        {
            "traceEvents": [
                {"ph": "X", "name": "x", "pid": 0, "tid": 1, "ts": 0, "dur": -1},
                {"ph": "Q", "name": 3, "pid": "a"},
            ]
        }
    )
    assert any("dur must be a non-negative number" in p for p in problems)
    assert any("unknown phase 'Q'" in p for p in problems) and any("pid must be an integer" in p for p in problems)
    assert validate_trace({}) == ["top-level 'traceEvents' list is missing"]

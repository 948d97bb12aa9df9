"""Pipeline schedules: the closed form against the event simulation, bubbles, in-flight counts."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trex.cost_model.pipeline import (
    closed_form_makespan,
    default_layers_per_chunk,
    device_chunks,
    in_flight,
    makespan,
    simulate,
)


@pytest.mark.parametrize("pp, vpp, m", [(4, 1, 8), (4, 2, 8), (8, 4, 64), (8, 3, 24), (2, 1, 1), (1, 1, 5)])
def test_uniform_stages_match_narayanans_bubble(pp, vpp, m):
    chunks = pp * vpp
    forward, backward = [1.0] * chunks, [2.0] * chunks
    per_device = [sum(forward[c] + backward[c] for c in device_chunks(d, pp, vpp)) for d in range(pp)]
    simulated = makespan(simulate(forward, backward, pp, vpp, m))
    assert simulated == pytest.approx(closed_form_makespan(per_device, m, vpp))
    ideal = m * per_device[0]
    assert (simulated - ideal) / ideal == pytest.approx((pp - 1) / (vpp * m))  # bubble fraction (p-1)/(v m)


@given(
    pp=st.integers(2, 6),
    vpp=st.integers(1, 3),
    groups=st.integers(1, 4),
    times=st.lists(st.floats(min_value=0.1, max_value=3.0), min_size=36, max_size=36),
)
def test_no_schedule_beats_the_slowest_device_and_the_closed_form_stays_close(pp, vpp, groups, times):
    m = pp * groups
    chunks = pp * vpp
    forward, backward = times[:chunks], [2 * t for t in times[chunks : 2 * chunks]]
    per_device = [sum(forward[c] + backward[c] for c in device_chunks(d, pp, vpp)) for d in range(pp)]
    simulated = makespan(simulate(forward, backward, pp, vpp, m))
    assert simulated >= m * max(per_device) - 1e-9
    assert closed_form_makespan(per_device, m, vpp) == pytest.approx(simulated, rel=0.35)


def test_every_task_runs_once_and_devices_never_overlap():
    tasks = simulate([1.0] * 8, [2.0] * 8, 4, 2, 8)
    assert len(tasks) == 2 * 8 * 8
    for device in range(4):
        mine = sorted((t.start, t.end) for t in tasks if t.device == device)
        assert all(a_end <= b_start + 1e-12 for (_, a_end), (b_start, _) in zip(mine, mine[1:]))


def test_first_stage_holds_korthikantis_in_flight_count():
    # interleaved: p*v + p - 1 chunk-activations on the first device; 1F1B: p micro-batches
    assert sum(in_flight(0, 8, 4, 128)) == 8 * 4 + 8 - 1
    assert in_flight(0, 8, 1, 128) == [8] and in_flight(7, 8, 1, 128) == [1]


def test_default_split_gives_the_ends_fewer_layers():
    assert default_layers_per_chunk(94, 32) == (2,) + (3,) * 30 + (2,)
    assert default_layers_per_chunk(94, 96)[0] == 0 and sum(default_layers_per_chunk(94, 96)) == 94

"""Schedulers: one interface, each policy's defining behaviour, healthy instances only."""

from __future__ import annotations

from collections import Counter

import pytest
from serving_helpers import instance

from trex.errors import UnknownNameError
from trex.workloads.serving.capacity import SLO
from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.schedulers import (
    SCHEDULERS,
    InstanceLoad,
    RequestInfo,
    make_scheduler,
    rate_at_round_robin_utilisation,
)

REQUEST = RequestInfo(200, 200)


def loads(*speeds: float) -> list[InstanceLoad]:
    return [InstanceLoad(instance(f"i{n}", speed)) for n, speed in enumerate(speeds)]


def test_cli_names_are_the_issue_s():
    assert set(SCHEDULERS) == {"round_robin", "random", "jsq", "token_jsq", "po2", "weighted_rr", "trex"}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_skips_unhealthy_instances(name):
    scheduler, state = make_scheduler(name, seed=1), loads(1, 1, 1)
    state[0].healthy = state[2].healthy = False
    assert {scheduler.choose(REQUEST, state) for _ in range(10)} == {1}
    state[1].healthy = False
    with pytest.raises(ServingError, match="no healthy instance"):
        scheduler.choose(REQUEST, state)


def test_round_robin_cycles():
    scheduler, state = make_scheduler("round_robin"), loads(1, 1, 1)
    assert [scheduler.choose(REQUEST, state) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_jsq_counts_requests_and_token_jsq_counts_tokens():
    state = loads(1, 1)
    state[0].waiting, state[0].waiting_prompt_tokens = 1, 5000
    state[1].waiting, state[1].waiting_prompt_tokens = 2, 100
    assert make_scheduler("jsq").choose(REQUEST, state) == 0
    assert make_scheduler("token_jsq").choose(REQUEST, state) == 1


def test_power_of_two_picks_the_less_loaded_of_its_two():
    state = loads(1, 1)
    state[0].running = 10
    assert {make_scheduler("po2", seed=s).choose(REQUEST, state) for s in range(5)} == {1}


def test_weighted_round_robin_follows_capacity():
    scheduler, state = make_scheduler("weighted_rr"), loads(1, 3)
    picks = Counter(scheduler.choose(REQUEST, state) for _ in range(400))
    assert picks[1] / picks[0] == pytest.approx(3.0, rel=0.15)


def test_trex_prefers_the_faster_instance_until_its_queue_costs_more():
    scheduler, state = make_scheduler("trex"), loads(1, 4)
    assert scheduler.choose(REQUEST, state) == 1
    state[1].waiting, state[1].waiting_prompt_tokens, state[1].waiting_pairs = 40, 40 * 4000, 40 * 4000**2
    assert scheduler.choose(REQUEST, state) == 0


def test_trex_avoids_an_instance_whose_kv_cache_is_full():
    state = [InstanceLoad(instance("small-kv", 2.0, kv_tokens=20_000)), InstanceLoad(instance("big-kv", 1.0))]
    scheduler = make_scheduler("trex")
    state[1].running, state[1].running_context_tokens = 20, 20 * 300
    state[0].running, state[0].running_context_tokens = 12, 12 * 300
    assert scheduler.choose(REQUEST, state) == 0  # faster, and its cache holds ~66 sequences of 300 tokens
    state[0].running_context_tokens = 12 * 4000
    assert scheduler.slo_batch(state[0].spec, 4000) == 5  # 5 sequences of 4000 tokens fill its cache
    assert scheduler.predicted_ttft_s(REQUEST, state[0], 5, 4000) > 3.0  # 8 requests ahead of a free slot
    assert scheduler.choose(REQUEST, state) == 1


def test_trex_keeps_instances_within_the_tpot_slo():
    loose, tight = make_scheduler("trex", slo=SLO(3.0, 0.5)), make_scheduler("trex", slo=SLO(3.0, 0.03))
    spec = instance("a", 1.0)
    assert tight.slo_batch(spec, 300) < loose.slo_batch(spec, 300)
    assert tight.slo_batch(spec, 300) >= 1


def test_unknown_scheduler_lists_the_valid_ones():
    with pytest.raises(UnknownNameError, match="valid schedulers:.*round_robin.*did you mean 'jsq'"):
        make_scheduler("jsqq")


def test_the_rate_at_a_round_robin_utilisation_loads_the_slowest_instance_at_that_fraction():
    capacities = [12.0, 6.0, 3.0]
    rate = rate_at_round_robin_utilisation(capacities, 0.4)
    assert rate / len(capacities) / min(capacities) == pytest.approx(0.4)  # round robin: 1/N of the rate each
    assert rate_at_round_robin_utilisation(capacities, 0.8) == pytest.approx(2 * rate)
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ServingError, match=r"utilisation under round robin must lie in \(0, 1\)"):
            rate_at_round_robin_utilisation(capacities, bad)
    with pytest.raises(ServingError, match="positive capacity"):
        rate_at_round_robin_utilisation([3.0, 0.0], 0.5)

"""Scoring rules as specified in ../shared/reference/or_benchmarks.md, and the unbiased pass@k."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from trex.workloads.or_eval import (
    NoSolution,
    Objective,
    Prediction,
    Quantities,
    Rule,
    is_correct,
    pass_at_k,
    values_match,
)

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize(
    "predicted, truth, rule, expected",
    [
        (1160.0, 1160.0, Rule.STRICT, True),
        (1160.0 + 1e-4, 1160.0, Rule.STRICT, True),  # 1e-4 / 1161 < 1e-6
        (1160.01, 1160.0, Rule.STRICT, False),
        (1e-7, 0.0, Rule.STRICT, True),  # |gt| + 1 keeps zero ground truths workable
        (22.000001, 22.0, Rule.MAMO, True),
        (22.01, 22.0, Rule.MAMO, False),
        (0.00009, 0.0, Rule.MAMO, True),
        (104.0, 100.0, Rule.LENIENT, True),
        (106.0, 100.0, Rule.LENIENT, False),
        (21.99999999999664, 22.0, Rule.LENIENT, True),
        (0.4, 0.0, Rule.LENIENT, True),  # rounds to 0
        (0.6, 0.0, Rule.LENIENT, False),  # rounds to 1, and |1| > 0.05
        (2.5, 2.0, Rule.LENIENT, True),  # Python rounds half to even, as ORLM's code does
        (3.5, 3.0, Rule.LENIENT, False),
    ],
)
def test_rule_examples(predicted, truth, rule, expected):
    assert values_match(predicted, truth, rule) is expected


@given(truth=finite, rule=st.sampled_from(Rule))
def test_every_rule_accepts_the_exact_value(truth, rule):
    assert values_match(truth, truth, rule)


@given(predicted=finite, truth=finite)
def test_strict_implies_mamo_away_from_zero(predicted, truth):
    assume(abs(truth) >= 1)
    if values_match(predicted, truth, Rule.STRICT):
        assert values_match(predicted, truth, Rule.MAMO)


@given(predicted=finite, truth=finite)
def test_mamo_implies_lenient_for_integer_scale_values(predicted, truth):
    assume(abs(truth) >= 100)
    if values_match(predicted, truth, Rule.MAMO):
        assert values_match(predicted, truth, Rule.LENIENT)


@given(predicted=finite, truth=finite, rule=st.sampled_from([Rule.STRICT, Rule.MAMO]))
def test_strict_and_mamo_are_symmetric_in_sign(predicted, truth, rule):
    assert values_match(predicted, truth, rule) == values_match(-predicted, -truth, rule)


@given(truth=finite, rule=st.sampled_from(Rule))
def test_non_finite_predictions_never_match(truth, rule):
    for bad in (math.nan, math.inf, -math.inf):
        assert not values_match(bad, truth, rule)


@pytest.mark.parametrize("rule", list(Rule))
def test_no_best_solution_matches_only_a_no_solution_prediction(rule):
    assert is_correct(Prediction(no_solution=True), NoSolution(), rule)
    assert not is_correct(Prediction(objective=0.0), NoSolution(), rule)
    assert not is_correct(Prediction(), NoSolution(), rule)
    assert not is_correct(Prediction(no_solution=True), Objective(0.0), rule)


def test_named_quantities_must_all_be_present_and_match():
    answer = Quantities((("Total profit", 655.0), ("The number of bottles", 136.0)))
    printed = {"total profit": 655.0, "The number of bottles:": 136.0}
    assert is_correct(Prediction(quantities=printed), answer, Rule.STRICT)
    assert not is_correct(Prediction(quantities={"Total profit": 655.0}), answer, Rule.STRICT)
    assert not is_correct(Prediction(quantities={**printed, "total profit": 600.0}), answer, Rule.STRICT)


@pytest.mark.parametrize(
    "n, c, k, expected",
    [(1, 1, 1, 1.0), (1, 0, 1, 0.0), (8, 2, 1, 0.25), (4, 1, 2, 0.5), (5, 0, 3, 0.0), (5, 3, 3, 1.0)],
)
def test_pass_at_k_examples(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@given(n=st.integers(1, 60), data=st.data())
def test_pass_at_k_equals_one_minus_the_hypergeometric_miss_probability(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@given(n=st.integers(1, 60), data=st.data())
def test_pass_at_k_grows_with_k_and_with_correct_samples(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    if k < n:
        assert pass_at_k(n, c, k) <= pass_at_k(n, c, k + 1) + 1e-12
    if c < n:
        assert pass_at_k(n, c, k) <= pass_at_k(n, c + 1, k) + 1e-12


def test_pass_at_1_is_the_fraction_correct():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)


def test_pass_at_k_refuses_k_beyond_the_samples():
    with pytest.raises(ValueError, match="at least 4 samples"):
        pass_at_k(3, 1, 4)

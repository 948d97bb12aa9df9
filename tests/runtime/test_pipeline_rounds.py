"""A bubble row measured in paired rounds (`runtime.pipeline.rounds`): the measured bubble's bootstrap interval
over the steps, the prediction's range over the rounds' calibrations, and the row's ratio as the median of the
rounds' pairs. No timing: scripted step bubbles."""

from __future__ import annotations

import statistics

import pytest

from trex.runtime.pipeline.rounds import bootstrap_mean_interval, summarize_rounds


def test_the_bootstrap_interval_holds_the_mean_and_narrows_with_more_steps():
    steps = [0.10, 0.14, 0.18, 0.12, 0.16, 0.20, 0.11, 0.15, 0.19, 0.13, 0.17]
    low, high = bootstrap_mean_interval([steps])
    assert low < statistics.fmean(steps) < high
    wide = high - low
    low4, high4 = bootstrap_mean_interval([steps * 4])  # the same spread over 4x the steps: ~half as wide
    assert 0.35 * wide < high4 - low4 < 0.65 * wide
    assert bootstrap_mean_interval([[0.2] * 5, [0.2] * 5]) == (pytest.approx(0.2), pytest.approx(0.2))


def test_the_bootstrap_keeps_each_rounds_level():
    """Steps are resampled within their round: two rounds steady at different levels give no spread (resampling
    the steps of both together would mix the levels and give one)."""
    low, high = bootstrap_mean_interval([[0.1] * 6, [0.3] * 6])
    assert low == pytest.approx(0.2) and high == pytest.approx(0.2)


def test_bad_bootstrap_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="at least one round"):
        bootstrap_mean_interval([[], []])
    with pytest.raises(ValueError, match="confidence must lie between 0 and 1, got 1.5"):
        bootstrap_mean_interval([[0.1, 0.2]], confidence=1.5)


def test_a_rows_ratio_is_the_median_of_its_rounds_pairs_with_their_range():
    rounds = [(0.15, 0.125, [0.14, 0.16]), (0.16, 0.16, [0.15, 0.17]), (0.12, 0.15, [0.12, 0.12])]
    row = summarize_rounds(rounds)
    assert row.ratios == pytest.approx((1.2, 1.0, 0.8))
    assert row.ratio == pytest.approx(1.0)
    assert row.ratio_range == pytest.approx((0.8, 1.2))
    assert row.predicted == pytest.approx(0.15) and row.predicted_range == pytest.approx((0.125, 0.16))
    assert row.measured == pytest.approx(statistics.fmean([0.14, 0.16, 0.15, 0.17, 0.12, 0.12]))
    assert row.within and row.every_round_within and row.verdict() == "in"


def test_the_verdict_says_whether_the_rounds_agree():
    above = summarize_rounds([(0.3, 0.2, [0.3]), (0.26, 0.2, [0.26]), (0.28, 0.2, [0.28])])
    assert not above.within and above.verdict() == "out (above)"
    mixed = summarize_rounds([(0.13, 0.1, [0.13]), (0.11, 0.1, [0.11]), (0.115, 0.1, [0.115])])
    assert mixed.within and not mixed.every_round_within
    assert mixed.verdict() == "in (2 of 3 rounds in)"
    below = summarize_rounds([(0.07, 0.1, [0.07]), (0.075, 0.1, [0.075])])
    assert below.verdict() == "out (below)"


def test_a_round_without_a_positive_prediction_has_no_ratio():
    row = summarize_rounds([(0.2, 0.0, [0.2]), (0.2, 0.2, [0.2])])
    assert row.ratios == pytest.approx((1.0,))
    with pytest.raises(ValueError, match="no round has a positive predicted bubble"):
        summarize_rounds([(0.2, 0.0, [0.2])])
    with pytest.raises(ValueError, match="at least one round"):
        summarize_rounds([])

"""One bubble row measured in paired rounds: the interval of its measured bubble and of its prediction.

Why. A row of the bubble bench (one schedule, pp, micro-batch count) used to be one training run of ~11 measured
steps and one calibration after it. One step's bubble moves by 0.02-0.05 (absolute) with the host, so the mean of
11 steps carries a standard error of ~0.01, ~7% of a 0.15 bubble; and the prediction moved as much between two
idle runs of the same command (bench/RESULTS.md 14.14: interleaved m=8 predicted 0.143 then 0.173), because the
calibration's task times and message costs are themselves measurements of a host whose state drifts. A single
ratio near 1.2 was therefore in or out of the 20% band by chance, and two idle runs missed different rows.

So a row runs in R rounds. Each round is a job of its own: a training run and the calibration that prices it,
taken back to back on the same ranks (paired in time), the calibration after the steps in even rounds and before
them in odd ones (`TrainJob.calibrate_first`), so a drift between the two sides does not always fall the same way
(the principle issue 15's paired runs use). The row's ratio is the median over rounds of each round's
measured / predicted, with its min-max; the measured bubble's interval is a bootstrap over the steps (resampled
within each round, so a round's level stays its own); the prediction's interval is its min-max over the rounds'
calibrations (how much it moves when the calibration is re-taken).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

BAND = (0.8, 1.2)  # the acceptance: measured within 20% (relative) of the predicted bubble


def bootstrap_mean_interval(
    rounds: list[list[float]], confidence: float = 0.9, samples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """The `confidence` interval (percentile bootstrap) of the mean over every round's steps, the steps resampled
    with replacement within each round (each round keeps its size, so its weight in the mean). `rounds`: per round,
    each measured step's bubble."""
    rounds = [list(r) for r in rounds if r]
    if not rounds:
        raise ValueError("bootstrap_mean_interval needs at least one round with a measured step")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1, got {confidence}")
    rng = random.Random(seed)
    total = sum(len(r) for r in rounds)
    means = sorted(
        sum(sum(rng.choices(r, k=len(r))) for r in rounds) / total for _ in range(samples)
    )  # fmt: skip
    tail = (1 - confidence) / 2
    return means[int(tail * (samples - 1))], means[int((1 - tail) * (samples - 1))]


@dataclass(frozen=True)
class RoundedRow:
    """One row's rounds summed up (see the module docstring)."""

    measured: float  # the mean over every round's measured steps
    measured_interval: tuple[float, float]  # its bootstrap interval
    predicted: float  # the median over the rounds' predictions
    predicted_range: tuple[float, float]  # min-max over the rounds' predictions (re-taken calibrations)
    ratio: float  # the median over the rounds of measured / predicted (each round's pair)
    ratio_range: tuple[float, float]  # their min-max
    ratios: tuple[float, ...]  # every round's ratio, in round order

    @property
    def within(self) -> bool:
        """The row's ratio (the median over rounds) lies in the band."""
        return BAND[0] <= self.ratio <= BAND[1]

    @property
    def every_round_within(self) -> bool:
        """Each round's ratio lies in the band (the row is in on its own, not by the median)."""
        return all(BAND[0] <= r <= BAND[1] for r in self.ratios)

    def verdict(self) -> str:
        """`in` / `out` where every round agrees, else the median's side marked as not repeated."""
        inside = [BAND[0] <= r <= BAND[1] for r in self.ratios]
        if all(inside):
            return "in"
        if not any(inside) and len({r > BAND[1] for r in self.ratios}) == 1:
            return "out (" + ("above" if self.ratios[0] > BAND[1] else "below") + ")"
        return ("in" if self.within else "out") + f" ({sum(inside)} of {len(inside)} rounds in)"


def summarize_rounds(rounds: list[tuple[float, float, list[float]]], confidence: float = 0.9) -> RoundedRow:
    """`rounds`: per round (measured bubble, predicted bubble, the measured bubble of each step). A round whose
    prediction is not positive has no ratio (left out of the ratio's median, kept in the measured mean)."""
    if not rounds:
        raise ValueError("summarize_rounds needs at least one round")
    steps = [list(per_step) if per_step else [measured] for measured, _, per_step in rounds]
    total = sum(len(s) for s in steps)
    predicted = [p for _, p, _ in rounds]
    ratios = tuple(m / p for m, p, _ in rounds if p > 0)
    if not ratios:
        raise ValueError(f"no round has a positive predicted bubble (predicted: {predicted})")
    return RoundedRow(
        measured=sum(sum(s) for s in steps) / total,
        measured_interval=bootstrap_mean_interval(steps, confidence),
        predicted=statistics.median(predicted),
        predicted_range=(min(predicted), max(predicted)),
        ratio=statistics.median(ratios),
        ratio_range=(min(ratios), max(ratios)),
        ratios=ratios,
    )

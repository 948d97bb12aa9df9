"""Comparison rules and pass@k. The rule changes published numbers a lot, so reports always name it.

| rule | accepts a predicted objective p for ground truth g when | used by |
| --- | --- | --- |
| strict | abs(p - g) / (abs(g) + 1) < 1e-6 | SIRL, SDRL (the default here) |
| mamo | abs(p - g) / abs(g) <= 1e-4 (abs(p) <= 1e-4 when g == 0) | MAMO |
| lenient | round both to integers, then abs(p - g) / abs(g) <= 5% (abs(p) <= 0.05 when g == 0) | ORLM's and OptMATH's released code |

A "No Best Solution" ground truth (infeasible or unbounded) is matched only by a prediction
that reports no solution, under every rule. Named quantities (OptiBench) are correct when every
quantity is present and matches under the rule.
"""

from __future__ import annotations

import math
import re
from enum import Enum

from trex.workloads.or_eval.answers import Answer, NoSolution, Objective, Prediction, Quantities


class Rule(str, Enum):
    STRICT = "strict"
    MAMO = "mamo"
    LENIENT = "lenient"

    def __str__(self) -> str:
        return self.value

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Rule.STRICT: "|pred-gt|/(|gt|+1) < 1e-6",
    Rule.MAMO: "|pred-gt|/|gt| <= 1e-4 (|pred| <= 1e-4 when gt = 0)",
    Rule.LENIENT: "round both to integers; |pred-gt|/|gt| <= 0.05 (|pred| <= 0.05 when gt = 0) [ORLM]",
}


def values_match(predicted: float, truth: float, rule: Rule) -> bool:
    """Whether a predicted objective value counts as the ground truth under `rule`."""
    if not (math.isfinite(predicted) and math.isfinite(truth)):
        return False
    if rule is Rule.STRICT:
        return abs(predicted - truth) / (abs(truth) + 1) < 1e-6
    if rule is Rule.MAMO:
        if truth == 0:
            return abs(predicted) <= 1e-4
        return abs(predicted - truth) / abs(truth) <= 1e-4
    # ORLM eval/execute.py: Python's round() (half to even) on both, then a 5% relative tolerance
    p, g = round(predicted), round(truth)
    if g == 0:
        return abs(p) <= 0.05
    return abs((p - g) / g) <= 0.05


def quantity_key(name: str) -> str:
    """Names compare case-insensitively, ignoring spacing and a trailing colon or "is"."""
    key = re.sub(r"\s+", " ", name.strip().lower()).rstrip(":").strip()
    return key[:-3].rstrip() if key.endswith(" is") else key


def is_correct(prediction: Prediction, answer: Answer, rule: Rule) -> bool:
    if isinstance(answer, NoSolution):
        return prediction.no_solution and prediction.objective is None
    if isinstance(answer, Objective):
        return prediction.objective is not None and values_match(prediction.objective, answer.value, rule)
    if isinstance(answer, Quantities):
        predicted = {quantity_key(name): value for name, value in prediction.quantities.items()}
        return all(
            (key := quantity_key(name)) in predicted and values_match(predicted[key], value, rule)
            for name, value in answer.values
        )
    raise TypeError(f"not an answer: {answer!r}")


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k from n samples of which `correct` are correct (Chen et al. 2021, eq. 1):
    1 - C(n - c, k) / C(n, k), computed as a product to stay exact for large n."""
    if not 0 <= correct <= n:
        raise ValueError(f"correct={correct} must lie in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs at least {k} samples per item, got n={n}")
    if n - correct < k:
        return 1.0
    fail_all = 1.0
    for i in range(n - correct + 1, n + 1):
        fail_all *= 1.0 - k / i
    return 1.0 - fail_all

"""Requests to serve: synthetic ShareGPT-like lengths with Poisson arrivals, or a trace file.

* `sharegpt_like(n, rate, seed)` - prompt and output lengths drawn log-normal, shaped like the
  ShareGPT conversations serving papers benchmark with (a long right tail; prompt median ~180 and
  mean ~300 tokens, output median ~150 and mean ~225). This is an approximation generated with a
  seed, NOT the dataset: no data set is downloaded.
* `load_trace(path)` - JSONL (`{"arrival_s", "prompt_tokens", "output_tokens"}` per line; `timestamp`,
  `input_tokens` accepted too) or the Azure LLM inference trace CSV that Splitwise (ISCA'24)
  released (`TIMESTAMP,ContextTokens,GeneratedTokens`).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from trex.workloads.serving.errors import ServingError

PROMPT_MEDIAN, PROMPT_SIGMA = 180.0, 1.0
OUTPUT_MEDIAN, OUTPUT_SIGMA = 150.0, 0.9


@dataclass(frozen=True)
class Request:
    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class WorkloadStats:
    """What the planner needs to know about a workload."""

    requests: int
    mean_prompt: float
    mean_output: float
    mean_prompt_sq: float  # E[prompt^2]: prefill attention is quadratic
    p99_prompt: int
    max_context: int
    rate: float  # requests per second over the trace (0: unknown)
    # Mean tokens a sequence in the decode batch holds, averaged over time: long outputs stay in the
    # batch longer, so this is sum(O * (P + O/2)) / sum(O), above the per-request P + O/2.
    mean_context_in_flight: float = 0.0

    @property
    def context_in_flight(self) -> float:
        return self.mean_context_in_flight or self.mean_prompt + self.mean_output / 2

    def describe(self) -> str:
        rate = f", {self.rate:.2f} req/s" if self.rate else ""
        return (
            f"{self.requests} requests: prompt mean {self.mean_prompt:.0f} (P99 {self.p99_prompt}), output mean "
            f"{self.mean_output:.0f}, longest context {self.max_context}{rate}"
        )


def workload_stats(requests: list[Request]) -> WorkloadStats:
    if not requests:
        raise ServingError("the workload has no requests")
    prompts = np.array([r.prompt_tokens for r in requests], dtype=float)
    outputs = np.array([r.output_tokens for r in requests], dtype=float)
    span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    rate = (len(requests) - 1) / span if span > 0 else 0.0
    in_flight = float((outputs * (prompts + outputs / 2)).sum() / outputs.sum())
    return WorkloadStats(
        len(requests),
        float(prompts.mean()),
        float(outputs.mean()),
        float((prompts**2).mean()),
        int(np.percentile(prompts, 99)),
        int(max(r.total_tokens for r in requests)),
        rate,
        in_flight,
    )


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    if rate <= 0 or not math.isfinite(rate):
        raise ServingError(f"the arrival rate must be a positive number of requests per second (got {rate})")
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def sharegpt_like(
    n: int,
    rate: float,
    seed: int = 0,
    *,
    max_prompt: int = 4096,
    max_output: int = 2048,
    prompt_median: float = PROMPT_MEDIAN,
    output_median: float = OUTPUT_MEDIAN,
) -> list[Request]:
    """`n` requests with ShareGPT-like log-normal lengths arriving as a Poisson process of `rate` req/s."""
    if n < 1:
        raise ServingError(f"--requests must be at least 1 (got {n})")
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(n, rate, rng)
    prompts = np.clip(rng.lognormal(math.log(prompt_median), PROMPT_SIGMA, n), 4, max_prompt).astype(int)
    outputs = np.clip(rng.lognormal(math.log(output_median), OUTPUT_SIGMA, n), 4, max_output).astype(int)
    return [Request(i, float(arrivals[i]), int(prompts[i]), int(outputs[i])) for i in range(n)]


def with_poisson_arrivals(requests: list[Request], rate: float, seed: int = 0) -> list[Request]:
    """The same lengths re-timed as a Poisson process of `rate` req/s (to sweep load over one trace)."""
    arrivals = poisson_arrivals(len(requests), rate, np.random.default_rng(seed))
    return [Request(i, float(arrivals[i]), r.prompt_tokens, r.output_tokens) for i, r in enumerate(requests)]


def _positive_int(value, where: str, field: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ServingError(f"{where}: {field} must be a whole number of tokens (got {value!r})") from None
    if number < 1:
        raise ServingError(f"{where}: {field} must be at least 1 (got {number})")
    return number


def _azure_time(text: str, where: str) -> float:
    stamp = text.strip()
    if "." in stamp:  # the Azure traces carry 7 fractional digits; datetime takes 6
        head, frac = stamp.split(".", 1)
        stamp = f"{head}.{frac[:6]}"
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise ServingError(f"{where}: TIMESTAMP {text!r} is neither a date-time nor seconds") from None


def load_trace(path: str | Path) -> list[Request]:
    """Requests from a JSONL trace or an Azure/Splitwise CSV trace; arrivals start at 0."""
    path = Path(path)
    if not path.exists():
        raise ServingError(
            f"workload trace {path} does not exist; give a JSONL file (arrival_s, prompt_tokens, output_tokens "
            "per line) or an Azure LLM inference trace CSV"
        )
    rows: list[tuple[float, int, int]] = []
    if path.suffix == ".csv":
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            needed = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
            if not needed <= set(reader.fieldnames or ()):
                raise ServingError(
                    f"{path}: an Azure trace CSV needs columns {', '.join(sorted(needed))} (got {reader.fieldnames})"
                )
            for line, row in enumerate(reader, start=2):
                where = f"{path}:{line}"
                rows.append(
                    (
                        _azure_time(row["TIMESTAMP"], where),
                        _positive_int(row["ContextTokens"], where, "ContextTokens"),
                        _positive_int(row["GeneratedTokens"], where, "GeneratedTokens"),
                    )
                )
    else:
        for line, text in enumerate(path.read_text().splitlines(), start=1):
            if not text.strip():
                continue
            where = f"{path}:{line}"
            try:
                row = json.loads(text)
            except json.JSONDecodeError as error:
                raise ServingError(f"{where}: not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise ServingError(f"{where}: each line must be a JSON object")
            arrival = row.get("arrival_s", row.get("timestamp"))
            if not isinstance(arrival, (int, float)) or isinstance(arrival, bool) or arrival < 0:
                raise ServingError(f"{where}: needs arrival_s (seconds >= 0) (got {arrival!r})")
            prompt = row.get("prompt_tokens", row.get("input_tokens"))
            rows.append(
                (
                    float(arrival),
                    _positive_int(prompt, where, "prompt_tokens"),
                    _positive_int(row.get("output_tokens"), where, "output_tokens"),
                )
            )
    if not rows:
        raise ServingError(f"{path}: the trace holds no requests")
    rows.sort(key=lambda r: r[0])
    start = rows[0][0]
    return [Request(i, t - start, p, o) for i, (t, p, o) in enumerate(rows)]


def save_trace(requests: list[Request], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps(
                {"arrival_s": round(r.arrival_s, 6), "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens}
            )
            + "\n"
            for r in requests
        )
    )
    return path

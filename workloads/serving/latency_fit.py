"""Step latency as a least-squares fit to sampled steps: what the planner, simulator and scheduler use.

Following the seed paper (arXiv 2504.15303: latency parameters fitted by least squares over
sampled batches from light profiling), each instance gets two linear models:

    prefill step = a0 + a_tok * prompt tokens + a_pair * sum(prompt_len^2)    (compute-bound; attention is quadratic)
    decode step  = b0 + b_seq * sequences     + b_ctx  * context tokens       (bandwidth-bound: weights + KV cache)
                      + b_multi * [sequences >= 2]

Each term is a cost the hardware pays: a0/b0 the per-step fixed cost (kernel launches, the host's
dispatch of every module), a_tok/b_seq the per-row GEMM work, a_pair attention over the prompt,
b_ctx reading (and writing) each cached token, and b_multi the step from matrix-vector to
matrix-matrix kernels: a decode step of one sequence multiplies each weight by a vector (GEMV:
stream the weight once), two or more sequences run GEMM kernels that pack weight panels first - a
fixed extra per step, measured on CPUs; the cost model's GPU steps have none and the fit finds ~0.
b_multi is fitted only when the samples include both one and several sequences.

Samples come either from the cost model (`sample_instance`: the analytic `InstanceModel` priced at
a grid of batches) or from measuring a real instance (`trex serve profile`). The fit is non-negative
least squares (a negative per-token cost is never physical), solved by an active-set loop over
`numpy.linalg.lstsq` on scaled columns; `holdout_error` checks the fit on batch sizes it did not see.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.instance_model import EngineLimits


@dataclass(frozen=True)
class StepSample:
    """One timed step. Prefill: `tokens` prompt tokens over `seqs` prompts with `pairs` = sum(len^2).
    Decode: `seqs` sequences holding `context` tokens in all."""

    kind: Literal["prefill", "decode", "repack"]
    seqs: int
    tokens: int
    pairs: int
    context: int
    seconds: float

    def features(self) -> list[float]:
        if self.kind == "prefill":
            return [1.0, float(self.tokens), float(self.pairs)]
        if self.kind == "repack":
            return [1.0, float(self.context)]
        return [1.0, float(self.seqs), float(self.context), float(self.seqs >= 2)]


@dataclass(frozen=True)
class LatencyModel:
    """Fitted step latencies of one instance (seconds)."""

    prefill: tuple[float, float, float]  # a0, per prompt token, per squared prompt token
    decode: tuple[float, float, float]  # b0, per sequence, per context token
    source: str = ""
    decode_multi: float = 0.0  # extra per decode step of two or more sequences (GEMM instead of GEMV kernels)
    # re-packing the batch's KV cache when sequences joined or left since the last decode step: r0 + r_ctx *
    # context tokens re-packed. The local CPU worker's left-padded batch cache copies itself then; a paged KV
    # cache (vLLM, SGLang) does not, and the cost model's instances have (0, 0)
    repack: tuple[float, float] = (0.0, 0.0)

    def prefill_s(self, tokens: int, pairs: int) -> float:
        a0, a1, a2 = self.prefill
        return a0 + a1 * tokens + a2 * pairs

    def prefill_lengths_s(self, lengths: list[int]) -> float:
        return self.prefill_s(sum(lengths), sum(n * n for n in lengths)) if lengths else 0.0

    def decode_s(self, seqs: int, context: int) -> float:
        if seqs <= 0:
            return 0.0
        b0, b1, b2 = self.decode
        return b0 + b1 * seqs + b2 * context + (self.decode_multi if seqs >= 2 else 0.0)

    def repack_s(self, context: int) -> float:
        r0, r1 = self.repack
        return r0 + r1 * context if context > 0 else 0.0

    def predict(self, sample: StepSample) -> float:
        if sample.kind == "prefill":
            return self.prefill_s(sample.tokens, sample.pairs)
        if sample.kind == "repack":
            return self.repack_s(sample.context)
        return self.decode_s(sample.seqs, sample.context)

    def with_token_overhead(self, seconds: float, what: str = "per-token overhead") -> LatencyModel:
        """The model with `seconds` more per token emitted: work the instance's host does for every token
        outside the timed step (an HTTP worker streaming it), charged to the step that produced it -
        a prefill step emits one token, a decode step one per sequence."""
        if seconds < 0 or not np.isfinite(seconds):
            raise ServingError(f"a per-token overhead must be finite and non-negative (got {seconds})")
        a0, a1, a2 = self.prefill
        b0, b1, b2 = self.decode
        source = f"{self.source} + {what} {seconds * 1e3:.2f} ms/token"
        return LatencyModel((a0 + seconds, a1, a2), (b0, b1 + seconds, b2), source, self.decode_multi, self.repack)

    def scaled(self, factor: float, why: str = "scaled") -> LatencyModel:
        """Every cost times `factor`: the same instance on a host that runs its steps `factor` times its profile's
        CPU (what a live bench measures in service, `step_timeline.estimate_step_cpu`), so a scheduler that reads
        this model ranks the instances by what their steps cost now."""
        if not 0 < factor < float("inf"):
            raise ServingError(f"a latency scale factor must be a positive finite number (got {factor})")
        return LatencyModel(
            tuple(x * factor for x in self.prefill),  # type: ignore[arg-type]
            tuple(x * factor for x in self.decode),  # type: ignore[arg-type]
            f"{self.source} x {factor:.3f} ({why})",
            self.decode_multi * factor,
            tuple(x * factor for x in self.repack),  # type: ignore[arg-type]
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict, source: str = "<dict>") -> LatencyModel:
        try:
            prefill = tuple(float(x) for x in data["prefill"])
            decode = tuple(float(x) for x in data["decode"])
        except (KeyError, TypeError, ValueError):
            raise ServingError(
                f"{source}: a latency model needs `prefill` and `decode`, three numbers each "
                "(written by `trex serve profile`)"
            ) from None
        if len(prefill) != 3 or len(decode) != 3 or any(x < 0 or not np.isfinite(x) for x in (*prefill, *decode)):
            raise ServingError(
                f"{source}: prefill and decode must hold three finite non-negative numbers each "
                f"(got {prefill}, {decode})"
            )
        multi = data.get("decode_multi", 0.0)
        if isinstance(multi, bool) or not isinstance(multi, (int, float)) or multi < 0 or not np.isfinite(multi):
            raise ServingError(f"{source}: `decode_multi` must be a finite non-negative number (got {multi!r})")
        try:
            repack = tuple(float(x) for x in data.get("repack", (0.0, 0.0)))
        except (TypeError, ValueError):
            repack = ()
        if len(repack) != 2 or any(x < 0 or not np.isfinite(x) for x in repack):
            raise ServingError(
                f"{source}: `repack` must be two finite non-negative numbers (got {data.get('repack')!r})"
            )
        return LatencyModel(
            prefill,  # type: ignore[arg-type]
            decode,  # type: ignore[arg-type]
            str(data.get("source", source)),
            float(multi),
            repack,  # type: ignore[arg-type]
        )


def non_negative_lstsq(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """min ||F x - y|| with x >= 0: solve on the free columns, drop the most negative, repeat.
    Columns are scaled to unit norm first so tokens (thousands) and pairs (millions) weigh alike."""
    scale = np.linalg.norm(features, axis=0)
    scale[scale == 0] = 1.0
    scaled = features / scale
    free = list(range(features.shape[1]))
    solution = np.zeros(features.shape[1])
    while free:
        coef, *_ = np.linalg.lstsq(scaled[:, free], target, rcond=None)
        if (coef >= 0).all():
            solution[:] = 0.0
            solution[free] = coef
            break
        free.pop(int(np.argmin(coef)))
    return solution / scale


def fit_latency(samples: list[StepSample], source: str = "") -> LatencyModel:
    """Least-squares prefill and decode models; needs at least 3 distinct samples of each kind."""
    models = {}
    for kind in ("prefill", "decode"):
        chosen = [s for s in samples if s.kind == kind]
        distinct = {tuple(s.features()) for s in chosen}
        if len(distinct) < 3:
            raise ServingError(
                f"fitting the {kind} latency needs at least 3 distinct {kind} samples (got {len(distinct)}); "
                "profile more batch sizes or prompt lengths"
            )
        features = np.array([s.features() for s in chosen])
        if kind == "decode" and len({s.seqs >= 2 for s in chosen}) < 2:
            features[:, 3] = 0.0  # all one kind of step: the GEMV/GEMM step is not identifiable, leave it out
        # relative least squares: each sample weighs by 1/seconds, so small steps count as much as large
        weights = 1.0 / np.array([max(s.seconds, 1e-9) for s in chosen])
        coef = non_negative_lstsq(features * weights[:, None], np.ones(len(chosen)))
        models[kind] = tuple(float(c) for c in coef)
    decode = models["decode"]
    repack: tuple[float, float] = (0.0, 0.0)
    repacks = [s for s in samples if s.kind == "repack"]
    if len({s.context for s in repacks}) >= 2:  # measured by `trex serve profile`: fit r0 + r_ctx * context
        weights = 1.0 / np.array([max(s.seconds, 1e-9) for s in repacks])
        features = np.array([s.features() for s in repacks])
        coef = non_negative_lstsq(features * weights[:, None], np.ones(len(repacks)))
        repack = (float(coef[0]), float(coef[1]))
    return LatencyModel(models["prefill"], decode[:3], source, decode[3], repack)  # type: ignore[arg-type]


@dataclass(frozen=True)
class FitCheck:
    """How a fit does on samples it did not see: relative errors |predicted - measured| / measured."""

    max_error: float
    mean_error: float
    samples: int
    worst: StepSample | None

    def describe(self) -> str:
        return f"held-out error: mean {self.mean_error:.1%}, max {self.max_error:.1%} over {self.samples} steps"


def holdout_error(model: LatencyModel, samples: list[StepSample]) -> FitCheck:
    if not samples:
        raise ServingError("no held-out samples to check the fit on")
    errors = [abs(model.predict(s) - s.seconds) / s.seconds for s in samples]
    worst = samples[int(np.argmax(errors))]
    return FitCheck(float(max(errors)), float(np.mean(errors)), len(samples), worst)


def sample_instance(
    instance,
    prompt_lengths: tuple[int, ...] = (128, 512, 1024, 2048, 4096),
    prefill_batches: tuple[int, ...] = (1, 2, 4),
    decode_batches: tuple[int, ...] = (1, 8, 32, 64, 128, 256),
    contexts: tuple[int, ...] = (256, 1024, 4096),
) -> list[StepSample]:
    """Steps of an analytic `InstanceModel` at a grid of batches (the light profiling the paper does on hardware)."""
    limits = instance.limits
    samples = []
    for length in prompt_lengths:
        for batch in prefill_batches:
            if length * batch > limits.max_batched_tokens:
                continue
            lengths = [length] * batch
            samples.append(
                StepSample(
                    "prefill", batch, length * batch, length * length * batch, 0, instance.prefill_step_s(lengths)
                )
            )
    for batch in decode_batches:
        if batch > limits.max_num_seqs:
            continue
        for context in contexts:
            if context > limits.max_context:
                continue
            samples.append(
                StepSample("decode", batch, batch, 0, batch * context, instance.decode_step_s(batch, batch * context))
            )
    return samples


def save_samples(samples: list[StepSample], model: LatencyModel, path: str | Path, extra: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"latency_model": model.to_dict(), "samples": [asdict(s) for s in samples], **(extra or {})}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def load_latency_model(path: str | Path) -> LatencyModel:
    path = Path(path)
    if not path.exists():
        raise ServingError(f"latency profile {path} does not exist; write one with `trex serve profile --out {path}`")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ServingError(f"{path}: not valid JSON (line {error.lineno}: {error.msg})") from None
    return LatencyModel.from_dict(data.get("latency_model", data), str(path))


def load_engine_limits(path: str | Path) -> EngineLimits | None:
    """The engine limits a profile file records (`trex serve profile` writes the worker's), or None."""
    path = Path(path)
    try:
        limits = json.loads(path.read_text()).get("limits")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    if limits is None:
        return None
    try:
        result = EngineLimits(**limits)
    except TypeError as error:
        raise ServingError(f"{path}: `limits` has an unknown or missing field ({error})") from None
    if result.max_num_seqs < 1 or result.max_prefill_seqs < 0:
        raise ServingError(f"{path}: `limits` needs max_num_seqs >= 1 and max_prefill_seqs >= 0 (got {limits})")
    return result

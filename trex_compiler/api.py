"""`trex.compile`: the front door."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import trex.ops  # noqa: F401 - the trex operators must exist before anything is captured
from trex.capture import CapturedGraph, GraphBreak
from trex.driver import CompileOptions, TrexCompiler
from trex.dynamo_state import AutomaticDynamicMemory, own_automatic_dynamic_memory
from trex.errors import CaptureError, TrexError
from trex.pass_manager import Pass
from trex.plan import Plan, load_plan
from trex.targets import check_executable

FALLBACKS = (None, "eager")


class TrexFallbackWarning(UserWarning):
    """The model was not captured whole and runs region by region (`fallback="eager"`)."""


class CompileSession:
    """What trex did to one compiled model: the graphs, their reports, timings and dumps."""

    def __init__(
        self,
        compiler: TrexCompiler,
        previous_experts_implementation: str | None,
        experts_coverage: dict[str, str | None],
    ):
        self.compiler = compiler
        self.previous_experts_implementation = previous_experts_implementation
        self.experts_coverage = experts_coverage  # experts module -> None (fused trex op) or why not
        self.first_call_seconds: float | None = None
        self.plan: Plan | None = None  # the parallel plan compiled for (`compile(..., plan=)`)
        self.applied: Any = None  # degrees > 1: the plan applied on this rank (`trex.runtime.compile_plan`)

    @property
    def graphs(self) -> list[CapturedGraph]:
        return self.compiler.graphs

    @property
    def graph_breaks(self) -> list[GraphBreak]:
        return [g.graph_break for g in self.graphs if g.graph_break is not None]

    @property
    def dump_dir(self) -> Path | None:
        return self.compiler.options.dump_dir

    @property
    def options(self) -> CompileOptions:
        return self.compiler.options

    def summary(self) -> str:
        lines = [
            f"trex: {len(self.graphs)} graph(s), {len(self.graph_breaks)} graph break(s); target {self.options.target.name}; backends {', '.join(b.name for b in self.options.backends)}"
        ]
        for graph in self.graphs:
            lines.append(f"  {graph.summary()}")
            lines += [f"    {which}: {lowering.brief()}" for which, lowering in graph.lowerings.items()]
        from trex.backends.reports import backend_summary_lines

        lines += [f"  {line}" for line in backend_summary_lines(self.options.backends, self._lowerings())]
        if self.first_call_seconds is not None:
            lines.append(f"  first call (capture + compile + run): {self.first_call_seconds:.2f} s")
        if self.dump_dir is not None:
            lines.append(f"  dumps: {self.dump_dir}")
        return "\n".join(lines)

    def _lowerings(self) -> list:
        return [lowering for g in self.graphs for lowering in g.lowerings.values()]

    def lowered_ops(self) -> dict[str, list[str]]:
        """Backend name -> the names of the ops it emitted (e.g. {"ascend": ["npu_rms_norm", ...]})."""
        from trex.backends.reports import emitted_ops

        return emitted_ops(self._lowerings())


class CompiledModule(torch.nn.Module):
    """The compiled model: call it like the original; it shares the original's parameters.

    Parameters and buffers appear under `_orig_mod.` (as with `torch.compile`); attributes the
    original has (`config`, `generate`, ...) are reachable directly. `.trex` is the `CompileSession`.
    """

    def __init__(self, model: torch.nn.Module, compiled: Any, session: CompileSession, fallback: str | None):
        super().__init__()
        self._orig_mod = model
        self.__dict__["_compiled"] = compiled  # not a submodule: parameters appear once, under _orig_mod
        self.trex = session
        self._fallback = fallback
        self._warned = False
        # Dynamo's automatic-dynamic memory of this model alone (`trex.dynamo_state`: models whose forward is the
        # same code must not make each other's sizes dynamic)
        self.__dict__["_dynamo_memory"] = AutomaticDynamicMemory()

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        first = self.trex.first_call_seconds is None
        start = time.perf_counter()
        try:
            with own_automatic_dynamic_memory(self._dynamo_memory):
                output = self._compiled(*args, **kwargs)
        except TrexError:
            raise
        except Exception as error:
            inner = _trex_error_inside(error)
            if inner is not None:  # Dynamo wraps what a backend raises; show trex's own message
                raise inner.with_traceback(None) from error
            if self._fallback is None and _is_graph_break(error):
                raise CaptureError(_describe_graph_breaks(self._orig_mod, args, kwargs, error)) from error
            raise
        if first:
            self.trex.first_call_seconds = time.perf_counter() - start
        if self._fallback == "eager" and self.trex.graph_breaks and not self._warned:
            self._warned = True
            warnings.warn(_fallback_message(self.trex), TrexFallbackWarning, stacklevel=2)
        return output


def _trex_error_inside(error: BaseException) -> TrexError | None:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, TrexError):
            return error
        seen.add(id(error))
        error = getattr(error, "inner_exception", None) or error.__cause__
    return None


def _is_graph_break(error: Exception) -> bool:
    from torch._dynamo import exc

    return isinstance(error, (exc.Unsupported, exc.UserError)) or "graph break" in str(error).lower()


def _describe_graph_breaks(model: torch.nn.Module, args: tuple, kwargs: dict, error: Exception) -> str:
    """List every graph break (file:line, source, reason) by re-running the model under explain."""
    breaks: list[GraphBreak] = []
    try:
        explanation = torch._dynamo.explain(model)(*args, **kwargs)
        breaks = [GraphBreak.from_reason(r) for r in explanation.break_reasons]
    except Exception as explain_error:  # noqa: BLE001 - fall back to the one break we know
        breaks = [GraphBreak(f"{error} (explain failed: {explain_error})", [])]
    if not breaks:
        breaks = [GraphBreak(str(error), [])]
    listed = "\n".join(f"  {i}. {b.describe()}" for i, b in enumerate(breaks, 1))
    return (
        f"trex could not capture {type(model).__name__} as one graph: {len(breaks)} graph break(s)\n{listed}\n"
        "Fix the lines above (data-dependent Python control flow, .item()/.tolist(), unsupported calls), "
        "or pass fallback='eager' to run the model region by region, each region compiled by trex."
    )


def _fallback_message(session: CompileSession) -> str:
    breaks = session.graph_breaks
    listed = "\n".join(f"  {i}. {b.describe()}" for i, b in enumerate(breaks, 1))
    return f"trex: the model was not captured whole; fallback='eager' runs it as {len(session.graphs)} regions compiled by trex with eager Python between them ({len(breaks)} graph break(s)):\n{listed}"


def _device_types(model: torch.nn.Module) -> set[str]:
    return {t.device.type for t in (*model.parameters(), *model.buffers())}


def compile(
    model: torch.nn.Module,
    *,
    target: str = "cpu",
    backend: str | Any | Sequence[str | Any] | None = None,
    passes: str | Sequence[str | Pass] | None = None,
    dump_dir: str | Path | None = None,
    fallback: str | None = None,
    plan: Plan | str | Path | None = None,
    progress: Any = None,
    memory_budget: float | int | str | None = None,
) -> CompiledModule:
    """Compile `model` for training (forward, `loss.backward()`, optimizer step) and inference.

    Capture is Dynamo + AOTAutograd: one joint forward+backward aten graph per Dynamo graph,
    FakeTensor metadata on every node. transformers MoE models are switched to the "trex" experts
    implementation (same math, one `trex.moe_experts` op per layer; the previous implementation's
    name is kept in `.trex.previous_experts_implementation`).

    target:   hardware the program is planned for (`trex.targets.TARGETS`); executing needs it here.
    backend:  a backend name or instance, or a priority list; the eager backend takes the rest. Default:
              `TREX_BACKENDS` ("inductor,eager"), else ["inductor", "eager"] where Inductor works.
    passes:   the pipeline ("a,b" or a list of names / pass objects); default trex.passes.DEFAULT_PIPELINE.
              `TREX_PASSES=-name` disables a pass, `TREX_FUEL=N` bounds the number of rewrites.
    dump_dir: write every graph after every pass, decisions, partitions and lowering here
              (or set `TREX_DUMP=dir`). Files trex did not write are never removed.
    fallback: None (default) raises `CaptureError` listing every graph break; "eager" runs the model
              region by region, each region compiled by trex, and warns once with the breaks.
    plan:     a `trex.plan.Plan` or a plan file (`trex plan --out`); it is checked against the model
              (layer count, experts and heads divisible by its degrees) and kept as `.trex.plan`. A plan
              for N > 1 processes runs inside an initialised process group of N ranks (torchrun): it is
              applied to the model before capture and its optimizer and loss conventions are kept as
              `.trex.applied` (`trex.runtime.compile_plan`). Its recompute policy
              becomes a memory budget when `memory_budget` is not given (`trex.passes.recompute`).
    memory_budget: saved-activation budget for the backward: a fraction of the save-everything bytes
              (0.4) or an amount ("3GiB"); the `recompute` pass picks what to recompute within it.
    progress: a callable given one line per compile stage (trace, passes, lowering) as it finishes,
              e.g. `progress=print`; the CLI prints them to stderr.
    """
    if not isinstance(model, torch.nn.Module):
        raise TrexError(f"trex.compile takes a torch.nn.Module, got {type(model).__name__}")
    if fallback not in FALLBACKS:
        raise TrexError(f"unknown fallback {fallback!r}; valid: None (raise on graph breaks) or 'eager'")
    accepted = plan_for_module(plan, model) if plan is not None else None
    if memory_budget is None and accepted is not None:
        from trex.passes.recompute.policy import budget_for_plan

        memory_budget = budget_for_plan(accepted, model)
    if memory_budget is not None:
        from trex.passes.recompute import pipeline_with_budget

        passes = pipeline_with_budget(passes, memory_budget)
    options = CompileOptions.build(target=target, backend=backend, passes=passes, dump_dir=dump_dir, progress=progress)
    check_executable(options.target, _device_types(model))

    from trex.integrations.transformers_moe import experts_coverage, use_trex_experts

    applied = None
    if accepted is not None and accepted.world_size > 1:
        from trex.runtime.compile_plan import apply_in_process_group

        applied = apply_in_process_group(model, accepted)
    previous = use_trex_experts(model)
    if applied is not None and accepted.parallel.ep > 1:  # this rank's experts go through the EP op
        from trex.runtime.expert_parallel import route_through_ep

        route_through_ep(model)
    compiler = TrexCompiler(options)
    session = CompileSession(compiler, previous, experts_coverage(model))
    session.plan = accepted
    session.applied = applied
    compiled = torch.compile(model, backend=compiler, fullgraph=fallback is None)
    return CompiledModule(model, compiled, session, fallback)


def plan_for_module(plan: Plan | str | Path, model: torch.nn.Module) -> Plan:
    """Check a plan against a model about to be compiled; return it when this process can run it.

    The model's structure comes from its transformers config (or, without one, its decoder stack).
    A plan for more than one process is applied by `compile` inside an initialised process group
    (`trex.runtime.compile_plan` refuses it, naming torchrun, when there is none).
    """
    plan = load_plan(plan)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "model_type", None):
        from trex.cost_model.model_spec import spec_from_config

        problems = plan.check(spec=spec_from_config(config, plan.model.name))
    else:
        from trex.meta_capture import decoder_layers

        try:
            layers = len(decoder_layers(model)[1])
        except TrexError:
            layers = None
        problems = plan.check(num_layers=layers)
    if problems:
        raise TrexError(
            f"plan for {plan.model.name} does not match this {type(model).__name__}: " + "; ".join(problems)
        )
    return plan

"""Solver recorders: report each solve a sandboxed program performs, with status and objective.

A program's objective can be read from what it prints, but prints are free-form. The recorders
read it from the solver instead: when a program imports one of the supported solver APIs, the
module is patched right after it loads so that every solve emits

    {"event": "solve", "api": "coptpy", "status": "optimal", "raw_status": "1", "objective": 29.0}

on the events channel. The evaluator uses the last solve when the program prints no explicit
objective line. Recording never changes what the program computes, and a recorder that fails
emits `recorder_error` instead of breaking the program.

| API | how a solve is seen |
| --- | --- |
| pyscipopt | `Model` replaced by a subclass whose `optimize` records |
| gurobipy | `Model` replaced by a subclass whose `optimize` records |
| coptpy | `Envr` replaced by a subclass that registers each model; recorded at exit (COPT's `Model` cannot be subclassed or patched) |
| pulp | `LpProblem.solve` wrapped |
| highspy | `Highs.run` and `Highs.solve` wrapped |
| pyomo | solvers returned by `SolverFactory` get a recording `solve` |

Runs inside the sandbox (copied next to the bootstrap): standard library only.
"""

from __future__ import annotations

import atexit
import importlib.abc
import sys
from collections.abc import Callable
from typing import Any

Emit = Callable[[dict], None]

# At most this many solve events are written as they happen; after that only the last one is
# written, at exit, so a program solving in a tight loop cannot flood the events file.
MAX_STREAMED_SOLVES = 100

_STATUS_NAMES = {
    "optimal": "optimal",
    "infeasible": "infeasible",
    "unbounded": "unbounded",
    "inforunbd": "infeasible_or_unbounded",
    "infeasibleorunbounded": "infeasible_or_unbounded",
    "unboundedorinfeasible": "infeasible_or_unbounded",
    "inf_or_unbd": "infeasible_or_unbounded",
    "inf_or_unb": "infeasible_or_unbounded",
}
_GUROBI_STATUS = {2: "optimal", 3: "infeasible", 4: "infeasible_or_unbounded", 5: "unbounded"}
_COPT_STATUS = {1: "optimal", 2: "infeasible", 3: "unbounded", 4: "infeasible_or_unbounded"}
_PULP_STATUS = {1: "optimal", -1: "infeasible", -2: "unbounded"}


def normalize_status(raw: object) -> str:
    """Map a solver's status word (any case, `k` prefix of HiGHS) to optimal / infeasible / ..."""
    word = str(raw).rsplit(".", 1)[-1].lower().replace(" ", "")
    if word.startswith("k") and word[1:] in _STATUS_NAMES:
        word = word[1:]
    return _STATUS_NAMES.get(word, word)


class SolveLog:
    """Writes solve events, streaming the first `MAX_STREAMED_SOLVES` and keeping the last."""

    def __init__(self, emit: Emit):
        self._emit = emit
        self._count = 0
        self._pending: dict | None = None
        atexit.register(self.flush)

    def record(self, api: str, status: str, raw_status: object, objective: object) -> None:
        value = None
        if status == "optimal" and objective is not None:
            try:
                value = float(objective)
            except (TypeError, ValueError):
                value = None
        event = {"event": "solve", "api": api, "status": status, "raw_status": str(raw_status), "objective": value}
        self._count += 1
        if self._count <= MAX_STREAMED_SOLVES:
            self._emit(event)
        else:
            self._pending = {**event, "solves_so_far": self._count}

    def error(self, api: str, error: BaseException) -> None:
        self._emit({"event": "recorder_error", "api": api, "detail": f"{type(error).__name__}: {error}"})

    def flush(self) -> None:
        if self._pending is not None:
            self._emit(self._pending)
            self._pending = None


def _guarded(log: SolveLog, api: str, read: Callable[[], None]) -> None:
    try:
        read()
    except Exception as error:  # noqa: BLE001 - recording must never break the program
        log.error(api, error)


def _patch_pyscipopt(module: Any, log: SolveLog) -> None:
    base = module.Model

    def read(model: Any) -> None:
        raw = model.getStatus()
        status = normalize_status(raw)
        log.record("pyscipopt", status, raw, model.getObjVal() if status == "optimal" else None)

    module.Model = _recording_subclass(base, ("optimize", "optimizeNogil", "solveConcurrent"), read, log, "pyscipopt")


def _patch_gurobipy(module: Any, log: SolveLog) -> None:
    base = module.Model

    def read(model: Any) -> None:
        raw = model.Status
        status = _GUROBI_STATUS.get(raw, f"status {raw}")
        log.record("gurobipy", status, raw, model.ObjVal if status == "optimal" else None)

    module.Model = _recording_subclass(base, ("optimize",), read, log, "gurobipy")


def _recording_subclass(base: type, methods: tuple[str, ...], read: Callable, log: SolveLog, api: str) -> type:
    namespace: dict[str, Any] = {"__doc__": base.__doc__, "__module__": base.__module__}
    for name in methods:
        if hasattr(base, name):
            namespace[name] = _recording_method(getattr(base, name), read, log, api)
    cls = type(base.__name__, (base,), namespace)
    cls.__qualname__ = base.__qualname__
    return cls


def _recording_method(method: Callable, read: Callable, log: SolveLog, api: str) -> Callable:
    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        _guarded(log, api, lambda: read(self))
        return result

    recording.__name__ = getattr(method, "__name__", "solve")
    recording.__doc__ = getattr(method, "__doc__", None)
    return recording


def _patch_coptpy(module: Any, log: SolveLog) -> None:
    base = module.Envr
    models: list[Any] = []

    class Envr(base):  # type: ignore[misc, valid-type]
        __doc__ = base.__doc__

        def createModel(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - COPT's name
            model = base.createModel(self, *args, **kwargs)
            models.append(model)
            return model

    Envr.__module__, Envr.__qualname__ = base.__module__, base.__qualname__

    def read_all() -> None:
        for model in models:

            def read(model: Any = model) -> None:
                raw = model.status
                if raw == 0:  # COPT.UNSTARTED: never solved
                    return
                status = _COPT_STATUS.get(raw, f"status {raw}")
                log.record("coptpy", status, raw, model.objval if status == "optimal" else None)

            _guarded(log, "coptpy", read)
        log.flush()

    module.Envr = Envr
    atexit.register(read_all)  # registered after SolveLog.flush, so it runs first


def _patch_pulp(module: Any, log: SolveLog) -> None:
    problem = module.LpProblem
    original = problem.solve

    def read(prob: Any) -> None:
        raw = prob.status
        status = _PULP_STATUS.get(raw, module.LpStatus.get(raw, f"status {raw}").lower())
        objective = module.value(prob.objective) if prob.objective is not None else 0.0
        log.record("pulp", status, raw, objective if status == "optimal" else None)

    problem.solve = _recording_method(original, read, log, "pulp")


def _patch_highspy(module: Any, log: SolveLog) -> None:
    highs = module.Highs

    def read(solver: Any) -> None:
        raw = solver.getModelStatus()
        status = normalize_status(raw)
        log.record("highspy", status, raw, solver.getInfo().objective_function_value if status == "optimal" else None)

    highs.solve = _recording_method(highs.solve, read, log, "highspy")
    run = highs.run  # inherited from the C++ base class; solve() calls the base directly
    highs.run = _recording_method(run, read, log, "highspy")


def _patch_pyomo(module: Any, log: SolveLog) -> None:
    factory = module.SolverFactoryClass
    original_call = factory.__call__

    def read(model: Any, results: Any) -> None:
        import pyomo.environ as pyo

        raw = results.solver.termination_condition
        status = normalize_status(raw)
        objective = None
        if status == "optimal":
            for component in model.component_data_objects(pyo.Objective, active=True):
                objective = pyo.value(component)
                break
        log.record("pyomo", status, raw, objective)

    def wrap(solver: Any) -> Any:
        solve = getattr(solver, "solve", None)
        if solve is None:
            return solver

        def recording_solve(model: Any, *args: Any, **kwargs: Any) -> Any:
            results = solve(model, *args, **kwargs)
            _guarded(log, "pyomo", lambda: read(model, results))
            return results

        try:
            solver.solve = recording_solve
        except AttributeError:
            pass
        return solver

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrap(original_call(self, *args, **kwargs))

    factory.__call__ = call


PATCHES: dict[str, Callable[[Any, SolveLog], None]] = {
    "pyscipopt": _patch_pyscipopt,
    "gurobipy": _patch_gurobipy,
    "coptpy": _patch_coptpy,
    "pulp": _patch_pulp,
    "highspy": _patch_highspy,
    "pyomo.opt.base.solvers": _patch_pyomo,
}


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then applies the patch to the freshly executed module."""

    def __init__(self, loader: Any, patch: Callable[[Any], None]):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds the solver modules through the other finders and wraps their loaders."""

    def __init__(self, patches: dict[str, Callable[[Any], None]]):
        self._patches = patches

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        patch = self._patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def install(emit: Emit) -> SolveLog:
    """Record solves of every supported solver API this interpreter imports from now on."""
    log = SolveLog(emit)

    def bind(api: str, patch: Callable[[Any, SolveLog], None]) -> Callable[[Any], None]:
        return lambda module: _guarded(log, api, lambda: patch(module, log))

    patches = {name: bind(name, patch) for name, patch in PATCHES.items()}
    for name, patch in patches.items():
        if name in sys.modules:  # already imported (not the case in a fresh sandbox)
            patch(sys.modules[name])
    sys.meta_path.insert(0, _PostImportFinder(patches))
    return log

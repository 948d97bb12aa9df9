"""The flat linear model every generated problem is expanded into: variables, rows, objective.

A family writes its problem twice, independently: once here (`LinearModel`, built in plain Python
from the instance data) and once as a pyscipopt program (`trex.workloads.or_data.program`). The
solver solves this one in-process; the program runs in the sandbox; the two must agree. The LP
file (`lp_format`) is written from this model and read back by two solvers.

Names are LP identifiers (letters, digits, underscores): they appear verbatim in the LP file and
in the program's `addVar(name=...)`, so a row of the LP file can be traced to its constraint
family by prefix (`capacity_wood` belongs to `capacity`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

SENSES = ("<=", ">=", "==")
KINDS = ("continuous", "integer", "binary")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Variable:
    """A decision variable; `upper=None` means unbounded above (lower bounds are finite)."""

    name: str
    kind: str = "continuous"
    lower: float = 0.0
    upper: float | None = None

    @property
    def integral(self) -> bool:
        return self.kind != "continuous"


@dataclass(frozen=True)
class Row:
    """One linear constraint `sum(coef * var) sense rhs`."""

    name: str
    terms: tuple[tuple[str, float], ...]
    sense: str
    rhs: float

    def activity(self, values: Mapping[str, float]) -> float:
        return math.fsum(coef * values[name] for name, coef in self.terms)


@dataclass(frozen=True)
class LinearModel:
    """A mixed-integer linear program. Invariant: names are unique LP identifiers, every term
    names a declared variable, and no coefficient is zero (see `ModelBuilder`)."""

    name: str
    sense: str  # "minimize" | "maximize"
    objective: tuple[tuple[str, float], ...]
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...]

    @property
    def is_mip(self) -> bool:
        return any(variable.integral for variable in self.variables)

    def variable(self, name: str) -> Variable:
        return self._by_name()[name]

    def _by_name(self) -> dict[str, Variable]:
        cache = self.__dict__.get("_variables_by_name")
        if cache is None:
            cache = {variable.name: variable for variable in self.variables}
            object.__setattr__(self, "_variables_by_name", cache)
        return cache

    def objective_value(self, values: Mapping[str, float]) -> float:
        return math.fsum(coef * values[name] for name, coef in self.objective)

    def rows_by_family(self) -> dict[str, int]:
        """How many rows each constraint family has (the name up to the first underscore-key)."""
        return _count_prefixes(row.name for row in self.rows)

    def variables_by_family(self) -> dict[str, int]:
        return _count_prefixes(variable.name for variable in self.variables)


def family_of(name: str) -> str:
    """`capacity__wood` -> `capacity`: families and keys are joined by a double underscore."""
    return name.split("__", 1)[0]


def _count_prefixes(names: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[family_of(name)] = counts.get(family_of(name), 0) + 1
    return counts


def lp_name(*parts: object) -> str:
    """An LP identifier from a family symbol and keys: `lp_name("ship", "Plant A", 3)` ->
    `ship__plant_a__3`. Keys become lowercase words joined by single underscores."""
    head, *keys = (str(part) for part in parts)
    cleaned = [re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_") or "k" for key in keys]
    name = "__".join([head, *cleaned])
    if not _NAME.match(name):
        name = "v_" + name
    return name


@dataclass
class ModelBuilder:
    """Collects variables and rows, merging repeated terms and dropping zero coefficients."""

    name: str
    sense: str = "minimize"
    variables: dict[str, Variable] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    objective: dict[str, float] = field(default_factory=dict)

    def var(self, name: str, kind: str = "continuous", lower: float = 0.0, upper: float | None = None) -> str:
        if name in self.variables:
            raise ValueError(f"variable {name!r} declared twice in model {self.name!r}")
        if kind not in KINDS:
            raise ValueError(f"variable kind {kind!r}; valid: {', '.join(KINDS)}")
        if kind == "binary":
            lower, upper = 0.0, 1.0
        if not _NAME.match(name):
            raise ValueError(f"variable name {name!r} is not an LP identifier")
        self.variables[name] = Variable(name, kind, float(lower), None if upper is None else float(upper))
        return name

    def row(self, name: str, terms: Mapping[str, float] | Iterable[tuple[str, float]], sense: str, rhs: float) -> None:
        if sense not in SENSES:
            raise ValueError(f"row sense {sense!r}; valid: {', '.join(SENSES)}")
        if not _NAME.match(name):
            raise ValueError(f"row name {name!r} is not an LP identifier")
        merged = _merge(terms)
        for variable in merged:
            if variable not in self.variables:
                raise ValueError(f"row {name!r} uses undeclared variable {variable!r}")
        self.rows.append(Row(name, tuple(merged.items()), sense, _decimal(float(rhs))))

    def minimize(self, terms: Mapping[str, float] | Iterable[tuple[str, float]]) -> None:
        self.sense, self.objective = "minimize", _merge(terms)

    def maximize(self, terms: Mapping[str, float] | Iterable[tuple[str, float]]) -> None:
        self.sense, self.objective = "maximize", _merge(terms)

    def build(self) -> LinearModel:
        names = [row.name for row in self.rows]
        if len(set(names)) != len(names):
            duplicated = sorted({name for name in names if names.count(name) > 1})
            raise ValueError(f"model {self.name!r} has duplicate row names: {duplicated[:5]}")
        return LinearModel(
            name=self.name,
            sense=self.sense,
            objective=tuple(self.objective.items()),
            variables=tuple(self.variables.values()),
            rows=tuple(self.rows),
        )


def _merge(terms: Mapping[str, float] | Iterable[tuple[str, float]]) -> dict[str, float]:
    items = terms.items() if isinstance(terms, Mapping) else terms
    merged: dict[str, float] = {}
    for name, coef in items:
        merged[name] = merged.get(name, 0.0) + float(coef)
    # 12 significant digits: a coefficient computed from data (0.866 - 0.2) is written as the decimal it
    # stands for (0.666), not as its binary neighbour (0.6659999999999999), in the LP file and the answer
    return {name: _decimal(coef) for name, coef in merged.items() if _decimal(coef) != 0.0}


def _decimal(value: float) -> float:
    return float(f"{value:.12g}")

"""The mathematical model of a problem: sets, parameters (with their values), decision
variables, objective and constraints, in markdown with LaTeX; and its structural check.

Every variable and constraint declaration names the LP family it expands to (`lp_family`) and
the index sets it ranges over; `check_structure` expands those quantifiers over the sets' elements
and compares the counts with the rows and columns of the `LinearModel` the LP file was written
from. A model whose text says "for every plant" while the LP file has a row per city fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trex.workloads.or_data.linear_model import LinearModel
from trex.workloads.or_data.phrasing import number, table
from trex.workloads.or_data.prose import agree

Scalar = int | float
Values = Scalar | Mapping[str, Scalar | str] | Mapping[tuple[str, str], Scalar]


@dataclass(frozen=True)
class SetDef:
    symbol: str  # LaTeX, e.g. "S"
    index: str  # the index letter used for it, e.g. "s"
    description: str
    elements: tuple[str, ...]
    display: str = ""  # shown instead of the element list (e.g. "all pairs of S × D")
    # what one numbered element is called in prose ("disk" -> "disk 2", "hour" -> "hour 13"); a bare
    # number ("Capacity for 2") reads as a value, not as the element it stands for
    member: str = ""


@dataclass(frozen=True)
class ParamDef:
    symbol: str  # LaTeX with its indices, e.g. "c_{sd}"
    description: str
    values: Values
    over: tuple[str, ...] = ()  # set symbols; two sets render as a table (rows, columns)


@dataclass(frozen=True)
class VarDef:
    symbol: str  # LaTeX with indices, e.g. "x_{sd}"
    description: str
    domain: str  # LaTeX, e.g. r"\ge 0" or r"\in \{0, 1\}"
    lp_family: str
    over: tuple[str, ...] = ()
    count: int | None = None  # when not every combination of `over` exists
    # Typed phrases for prose (`tasks.understanding`), free of index letters and LaTeX:
    noun: str = ""  # the quantity as a plural noun phrase: "devices of each product made per week"
    indicator: str = ""  # a yes/no decision: "whether each driver takes each route"
    whole: str = ""  # why the values must be whole numbers, from the problem: "a chair is made whole or not at all"


@dataclass(frozen=True)
class ConstraintDef:
    label: str
    description: str
    latex: str
    lp_family: str
    over: tuple[str, ...] = ()  # set symbols quantified over ("for all s in S")
    count: int | None = None  # rows, when a condition restricts the quantifier
    condition: str = ""  # LaTeX condition shown after the quantifier
    why: str = ""  # why the problem needs it, in words from the story (not a restatement of the formula)
    technique: str = ""  # how a modelling device works where one is used (big-M, linking, linearisation)
    # why the rows never limit the optimum, for rows the model is correct without (symmetry breaking:
    # "they only put the interchangeable trucks in order"); such rows are not read as limits of the plan
    redundant: str = ""


@dataclass(frozen=True)
class MathModel:
    title: str
    sense: str  # "minimize" | "maximize"
    objective: str  # LaTeX expression
    objective_description: str
    sets: tuple[SetDef, ...]
    params: tuple[ParamDef, ...]
    variables: tuple[VarDef, ...]
    constraints: tuple[ConstraintDef, ...]
    notes: tuple[str, ...] = field(default=())

    def set(self, symbol: str) -> SetDef:
        for set_def in self.sets:
            if set_def.symbol == symbol:
                return set_def
        raise KeyError(f"model {self.title!r} declares no set {symbol!r}")

    def _quantifier(self, over: Sequence[str], condition: str) -> str:
        if not over:
            return f" \\quad \\forall {condition}" if condition else ""
        parts = ", ".join(f"{self.set(symbol).index} \\in {symbol}" for symbol in over)
        return f" \\quad \\forall {parts}" + (f",\\ {condition}" if condition else "")

    def expected_count(self, over: Sequence[str], count: int | None) -> int:
        if count is not None:
            return count
        total = 1
        for symbol in over:
            total *= len(self.set(symbol).elements)
        return total

    def to_markdown(self, *, with_data: bool = True) -> str:
        """The model as markdown: sets, parameters (with values when `with_data`), variables,
        objective, constraints."""
        lines = [f"### {self.title}", "", "**Sets**", ""]
        for set_def in self.sets:
            elements = set_def.display or "{" + ", ".join(set_def.elements) + "}"
            lines.append(f"- ${set_def.symbol}$: {agree(set_def.description)} = {elements}")
        lines += ["", "**Parameters**", ""]
        tables: list[str] = []
        for param in self.params:
            inline = self._inline_values(param) if with_data else ""
            description = agree(param.description)
            if inline == " (table below)" and description.endswith(")"):  # one parenthesis, not two in a row
                description, inline = description[:-1] + "; table below)", ""
                tables.append(self._table(param))
            elif inline == " (table below)":
                tables.append(self._table(param))
            lines.append(f"- ${param.symbol}$: {description}{inline}")
        if tables:
            lines += ["", *("\n\n".join(tables).split("\n"))]
        lines += ["", "**Decision variables**", ""]
        for var in self.variables:
            quantifier = self._quantifier(var.over, "")
            lines.append(f"- ${var.symbol} {var.domain}{quantifier}$: {agree(var.description)}")
        verb = "\\min" if self.sense == "minimize" else "\\max"
        lines += [
            "",
            f"**Objective** ({self.objective_description})",
            "",
            f"$$ {verb} \\; {self.objective} $$",
            "",
        ]
        # a heading over nothing reads as text cut off (the Seventh review's #40): a model without rows says so
        lines += ["**Constraints**", ""] if self.constraints else ["No constraints: each variable has only its bounds."]
        for number_, constraint in enumerate(self.constraints, start=1):
            quantifier = self._quantifier(constraint.over, constraint.condition)
            label, description = constraint.label, agree(constraint.description)
            # a label with its own parenthesis takes the description inside it: "Order (first before
            # second; if ...)", not "Order (first before second) (if ...)"
            head = f"{label[:-1]}; {description})" if label.endswith(")") else f"{label} ({description})"
            lines.append(f"{number_}. {head}: $${constraint.latex}{quantifier}$$")
        for note in self.notes:
            lines += ["", note]
        return "\n".join(lines).strip() + "\n"

    def _inline_values(self, param: ParamDef) -> str:
        values = param.values
        if isinstance(values, (int, float)):
            return f" = {number(values)}"
        assert isinstance(values, Mapping)
        if not values:  # defined for some elements only, and for none of these: say so, no empty list
            return ": none in these data"
        if len(param.over) == 1 or not all(isinstance(key, tuple) for key in values):
            # one index (declared or not, as a parameter defined for some elements only): inline, since
            # only a two-index parameter gets a table below the list
            return ": " + ", ".join(f"{key} {_text(value)}" for key, value in values.items())
        if _sparse(param) or len(param.over) != 2:
            return ": " + ", ".join(f"({', '.join(key)}) {_text(value)}" for key, value in values.items())
        return " (table below)"

    def _table(self, param: ParamDef) -> str:
        rows_set, columns_set = (self.set(symbol) for symbol in param.over)
        values = param.values
        assert isinstance(values, Mapping)
        body = [
            [row, *(values.get((row, column), "–") for column in columns_set.elements)] for row in rows_set.elements
        ]
        # a square parameter over one set (distances) has the same index twice: "i \\ i" says nothing
        corner = "from \\ to" if rows_set.index == columns_set.index else f"{rows_set.index} \\ {columns_set.index}"
        return f"${param.symbol}$:\n\n" + table([corner, *columns_set.elements], body)


def _text(value: object) -> str:
    return number(value) if isinstance(value, (int, float)) else str(value)


def _sparse(param: ParamDef) -> bool:
    """A two-index parameter defined on few pairs reads better as a list than as a table."""
    return isinstance(param.values, Mapping) and len(param.over) == 2 and len(param.values) <= 4


@dataclass(frozen=True)
class StructureCheck:
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_structure(math: MathModel, model: LinearModel) -> StructureCheck:
    """Compare the declared variable and constraint families, expanded over their sets, with
    the columns and rows of `model` (see the module docstring)."""
    problems: list[str] = []
    columns = model.variables_by_family()
    rows = model.rows_by_family()
    declared_columns = {var.lp_family: math.expected_count(var.over, var.count) for var in math.variables}
    declared_rows: dict[str, int] = {}
    for constraint in math.constraints:
        declared_rows[constraint.lp_family] = declared_rows.get(constraint.lp_family, 0) + math.expected_count(
            constraint.over, constraint.count
        )
    for kind, declared, actual in (("variable", declared_columns, columns), ("constraint", declared_rows, rows)):
        for family in sorted(set(declared) | set(actual)):
            if declared.get(family, 0) != actual.get(family, 0):
                problems.append(
                    f"{kind} family {family!r}: the mathematical model declares {declared.get(family, 0)}, "
                    f"the LP model has {actual.get(family, 0)}"
                )
    return StructureCheck(tuple(problems))

"""The same program in another solver library: PuLP, Pyomo or coptpy instead of pyscipopt.

Every family writes its program in the one pyscipopt layout of `program` (data block, `model =
Model(...)`, variables from `model.addVar` in comprehensions, constraints from `model.addCons`,
`model.setObjective`, the common ending). `translate` rewrites that layout, call by call, into
the idiom of another library, so the data does not teach one API:

| library | model | variables | constraints | objective | solve |
| --- | --- | --- | --- | --- | --- |
| pulp | `pulp.LpProblem(name, sense)` | `pulp.LpVariable(name, lowBound, upBound, cat)` | `model += expr, name` | `model.setObjective(expr)` | `model.solve(pulp.HiGHS(msg=False))` |
| pyomo | `pyo.ConcreteModel(name)` | one indexed `pyo.Var(index, domain, bounds=rule)` per family | one `pyo.ConstraintList` per family | `pyo.Objective(expr, sense)` | `SolverFactory("appsi_highs")` |
| coptpy | `cp.Envr().createModel(name)` | `model.addVar(lb, ub, vtype=COPT.X, name)` | `model.addConstr(expr, name)` | `model.setObjective(expr, COPT.X)` | `model.solve()` |

The rewrite works on the syntax tree (positions of the calls), never on guessed text, and raises
`TranslationError` for a construct it does not know; the caller keeps the pyscipopt program
then. A translated program is what the sandbox runs during verification (`verify_problem`), so
each library's program is checked against the solver like the original. Libraries whose solver
reports "infeasible or unbounded" without telling which (HiGHS through Pyomo, COPT for MIPs) are
not used for instances built to be unbounded (`usable_for`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

LIBRARIES = ("pyscipopt", "pulp", "pyomo", "coptpy")

# How prompts name the library, short and with its solver.
DISPLAY = {
    "pyscipopt": ("pyscipopt", "SCIP through pyscipopt"),
    "pulp": ("PuLP", "PuLP with the HiGHS solver"),
    "pyomo": ("Pyomo", "Pyomo with the HiGHS solver"),
    "coptpy": ("coptpy", "COPT through coptpy"),
}


class TranslationError(ValueError):
    """The program uses a construct the translation does not cover."""


# How often each library is drawn for a sample whose prompt asks for code (`ASKS_FOR_CODE`): the
# prompt then names the library. Other tasks use pyscipopt, the system prompt's default; repair
# always does (the bug injector works on its layout).
SHARES = {"pyscipopt": 0.4, "pulp": 0.2, "pyomo": 0.2, "coptpy": 0.2}
ASKS_FOR_CODE = ("code", "translate", "model")  # model: a code -> model prompt shows the program


def choose_library(variant: str, rng) -> str:
    """The library a sample's program is written in, drawn from `SHARES` with `rng`."""
    if variant not in ASKS_FOR_CODE:
        return "pyscipopt"
    draw, total = rng.random(), 0.0
    for library, share in SHARES.items():
        total += share
        if draw < total:
            return library
    return "pyscipopt"


def usable_for(library: str, status: str) -> bool:
    """Whether `library`'s program can report `status` unambiguously."""
    return library == "pyscipopt" or status != "unbounded"


@dataclass(frozen=True)
class _Edit:
    start: int  # character offsets into the program text
    end: int
    text: str


def translate(program: str, library: str) -> str:
    """`program` (the pyscipopt layout of `program.assemble`, default style) in `library`."""
    if library == "pyscipopt":
        return program
    if library not in LIBRARIES:
        raise ValueError(f"unknown solver library {library!r}; known: {', '.join(LIBRARIES)}")
    head, marker, ending = program.partition("model.hideOutput()\nmodel.optimize()\n")
    if not marker:
        raise TranslationError("the program does not end with the common ending")
    sense_match = re.search(r'sense="(minimize|maximize)"', head)
    if sense_match is None:
        raise TranslationError("no objective sense found")
    sense = sense_match.group(1)
    body = _Body(head, library, sense).rewrite()
    return body + _ENDINGS[library](ending)


class _Body:
    """The part of the program before the ending, rewritten call by call."""

    def __init__(self, text: str, library: str, sense: str):
        self.text, self.library, self.sense = text, library, sense
        self.tree = ast.parse(text)
        starts = [0]
        for line in text.split("\n"):
            starts.append(starts[-1] + len(line) + 1)
        self.line_starts = starts
        self.edits: list[_Edit] = []
        self.constraint_lists: dict[str, int] = {}  # Pyomo: family -> offset of the statement to declare it before
        self.taken: set[str] = set()

    def offset(self, node: ast.AST, end: bool = False) -> int:
        if end:
            return self.line_starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        return self.line_starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]

    def source(self, node: ast.AST) -> str:
        return self.text[self.offset(node) : self.offset(node, end=True)]

    def rewrite(self) -> str:
        for statement in self.tree.body:
            self._statement(statement)
        for name, where in self.constraint_lists.items():
            attribute = self._attribute(name)
            self.edits.append(_Edit(where, where, f"model.{attribute} = pyo.ConstraintList()\n"))
        text = self.text
        for edit in sorted(self.edits, key=lambda edit: (edit.start, edit.end), reverse=True):
            text = text[: edit.start] + edit.text + text[edit.end :]
        text = text.replace("from pyscipopt import Model, quicksum\n", _HEADERS[self.library], 1)
        if self.library == "pyomo":
            text = re.sub(r"\badd_row\(model\.(\w+),", lambda m: f"add_row(model.{self._attribute(m.group(1))},", text)
        return _rename_calls(text, {"quicksum": _QUICKSUM[self.library]})

    def _attribute(self, name: str) -> str:
        """A Pyomo component name that does not shadow a block attribute (`model.load` is a method)."""
        return f"{name}_rows" if name in _PYOMO_RESERVED else name

    def _statement(self, statement: ast.stmt) -> None:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if not (isinstance(owner, ast.Name) and owner.id == "model"):
                    continue
                method = node.func.attr
                if method == "addCons":
                    self._constraint(node, statement)
                elif method == "setObjective":
                    self._objective(node)
                elif method == "addVar":
                    if self.library == "pyomo":
                        continue  # whole statements, below
                    self._variable(node)
                else:
                    raise TranslationError(f"model.{method} is not translated")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Model":
                self._model(node)
        if self.library == "pyomo" and any(
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "addVar"
            for node in ast.walk(statement)
        ):
            self._pyomo_variables(statement)

    def _model(self, call: ast.Call) -> None:
        name = self.source(call.args[0])
        text = {
            "pulp": f"pulp.LpProblem({name}, pulp.Lp{self.sense.capitalize()})",
            "pyomo": f"pyo.ConcreteModel({name})\n\n\n{_PYOMO_ADD_ROW}",
            "coptpy": f"cp.Envr().createModel({name})",
        }[self.library]
        end = self.offset(call, end=True)
        if self.library == "coptpy":
            text += "\nmodel.setParam(COPT.Param.Logging, 0)"
        self.edits.append(_Edit(self.offset(call), end, text))

    def _keywords(self, call: ast.Call) -> dict[str, str]:
        return {keyword.arg: self.source(keyword.value) for keyword in call.keywords if keyword.arg}

    def _variable(self, call: ast.Call) -> None:
        keywords = self._keywords(call)
        vtype = keywords.get("vtype", '"C"').strip("\"'")
        lower, upper, name = keywords.get("lb", "0"), keywords.get("ub"), keywords.get("name")
        if name is None:
            raise TranslationError("a variable without a name")
        if upper == "None":
            upper = None
        if self.library == "pulp":
            category = {"B": "pulp.LpBinary", "I": "pulp.LpInteger", "C": "pulp.LpContinuous"}[vtype]
            if vtype == "B":
                text = f"pulp.LpVariable({name}, cat={category})"
            else:
                bounds = f"lowBound={lower}" + (f", upBound={upper}" if upper is not None else "")
                text = f"pulp.LpVariable({name}, {bounds}, cat={category})"
        else:  # coptpy: an upper bound that may be None becomes COPT.INFINITY
            kind = {"B": "COPT.BINARY", "I": "COPT.INTEGER", "C": "COPT.CONTINUOUS"}[vtype]
            if upper is not None:
                get = re.fullmatch(r"(\w+)\.get\(([^,()]+)\)", upper)
                if get:
                    upper = f"{get.group(1)}.get({get.group(2)}, COPT.INFINITY)"
                elif re.fullmatch(r"\w+", upper) and not upper.isdigit():
                    upper = f"COPT.INFINITY if {upper} is None else {upper}"
            bounds = f"lb={lower}" + (f", ub={upper}" if upper is not None else "") if vtype != "B" else ""
            text = f"model.addVar({bounds + ', ' if bounds else ''}vtype={kind}, name={name})"
        self.edits.append(_Edit(self.offset(call), self.offset(call, end=True), text))

    def _constraint(self, call: ast.Call, statement: ast.stmt) -> None:
        if len(call.args) != 1:
            raise TranslationError("addCons with other than one positional argument")
        expression = self.source(call.args[0])
        name = self._keywords(call).get("name")
        if name is None:
            raise TranslationError("a constraint without a name")
        start, end = self.offset(call), self.offset(call, end=True)
        if self.library == "pulp":
            text = f"model += {expression}, {name}" if "\n" not in expression else f"model += ({expression}, {name})"
        elif self.library == "coptpy":
            text = f"model.addConstr({expression}, name={name})"
        else:
            family = _name_prefix(call.keywords, name)
            self.constraint_lists.setdefault(family, self._statement_start(statement))
            text = f"add_row(model.{family}, {expression})"
        self.edits.append(_Edit(start, end, text))

    def _statement_start(self, statement: ast.stmt) -> int:
        """Where to declare a Pyomo constraint list: just before the statement (below its comment)."""
        return self.line_starts[statement.lineno - 1]

    def _objective(self, call: ast.Call) -> None:
        expression = self.source(call.args[0])
        text = {
            "pulp": f"model.setObjective({expression})",
            "pyomo": f"model.obj = pyo.Objective(expr={expression}, sense=pyo.{self.sense})",
            "coptpy": f"model.setObjective({expression}, sense=COPT.{self.sense.upper()})",
        }[self.library]
        self.edits.append(_Edit(self.offset(call), self.offset(call, end=True), text))

    def _pyomo_variables(self, statement: ast.stmt) -> None:
        """`x = {key: model.addVar(...) for ...}` -> an indexed `pyo.Var` and `x = model.x`."""
        if not (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            raise TranslationError("variables outside a plain assignment")
        target = statement.targets[0].id
        value = statement.value
        attribute = self._attribute(target)
        if isinstance(value, ast.Call):  # one variable
            domain, bounds = self._pyomo_domain(value, None)
            declaration = f"model.{attribute} = pyo.Var(domain={domain}{', bounds=' + bounds if bounds else ''})"
            alias = f"{target} = model.{attribute}"
        elif isinstance(value, (ast.DictComp, ast.ListComp)):
            call = value.value if isinstance(value, ast.DictComp) else value.elt
            if not isinstance(call, ast.Call):
                raise TranslationError("a comprehension that does not create variables directly")
            key = value.key if isinstance(value, ast.DictComp) else _only_target(value)
            loops = self.text[self.offset(call, end=True) : self.offset(value, end=True) - 1].strip()
            names = _names(key)
            domain, bounds = self._pyomo_domain(call, names)
            simple = re.fullmatch(rf"for {re.escape(self.source(key))} in ([\w.]+)", loops)
            index = simple.group(1) if simple else f"[{self.source(key)} {loops}]"
            declaration = (
                f"model.{attribute} = pyo.Var({index}, domain={domain}{', bounds=' + bounds if bounds else ''})"
            )
            if isinstance(value, ast.DictComp):
                alias = f"{target} = model.{attribute}"
            else:
                alias = f"{target} = [model.{attribute}[{self.source(key)}] {loops}]"
        else:
            raise TranslationError("variables created outside a comprehension")
        self.edits.append(_Edit(self.offset(statement), self.offset(statement, end=True), f"{declaration}\n{alias}"))

    def _pyomo_domain(self, call: ast.Call, names: list[str] | None) -> tuple[str, str]:
        keywords = self._keywords(call)
        vtype = keywords.get("vtype", '"C"').strip("\"'")
        if vtype == "B":
            return "pyo.Binary", ""
        domain = "pyo.Integers" if vtype == "I" else "pyo.Reals"
        lower, upper = keywords.get("lb", "0"), keywords.get("ub", "None")
        if lower == "0" and upper == "None":
            return ("pyo.NonNegativeIntegers" if vtype == "I" else "pyo.NonNegativeReals"), ""
        pair = f"({lower}, {upper})"
        if names is None:
            return domain, pair
        return domain, f"lambda m, {', '.join(names)}: {pair}"


def _only_target(comprehension: ast.ListComp) -> ast.expr:
    if len(comprehension.generators) != 1:
        raise TranslationError("a list of variables over more than one loop")
    return comprehension.generators[0].target


def _names(key: ast.expr) -> list[str]:
    if isinstance(key, ast.Name):
        return [key.id]
    if isinstance(key, ast.Tuple) and all(isinstance(item, ast.Name) for item in key.elts):
        return [item.id for item in key.elts]  # type: ignore[union-attr]
    raise TranslationError("a variable key that is not a name or a tuple of names")


def _name_prefix(keywords: list[ast.keyword], source: str) -> str:
    """The constraint family of `name=f"capacity[{d}]"`: `capacity`."""
    value = next(keyword.value for keyword in keywords if keyword.arg == "name")
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        text = value.value
    elif isinstance(value, ast.JoinedStr) and value.values and isinstance(value.values[0], ast.Constant):
        text = str(value.values[0].value)
    else:
        raise TranslationError(f"a constraint name without a literal prefix: {source}")
    family = text.split("[", 1)[0]
    if not family.isidentifier():
        raise TranslationError(f"a constraint family that is not a Python name: {family!r}")
    return family


def _rename_calls(text: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        text = re.sub(r"(?<![\w.])" + re.escape(old) + r"\(", new + "(", text)
    return text


_PYOMO_RESERVED = frozenset({"load", "name", "solutions", "component", "model", "parent", "block", "clear", "obj"})

_HEADERS = {
    "pulp": "import pulp\n",
    "pyomo": "import pyomo.environ as pyo\n",
    "coptpy": "import coptpy as cp\nfrom coptpy import COPT\n",
}
_QUICKSUM = {"pulp": "pulp.lpSum", "pyomo": "pyo.quicksum", "coptpy": "cp.quicksum"}

_PYOMO_ADD_ROW = '''def add_row(rows, row):
    """Add a row to a constraint list; a row that is plain True (an empty sum compared with 0) holds anyway."""
    if row is not True:
        rows.add(row)
'''
_STATUS_LINE = "status = model.getStatus()\n"
_OPTIMAL_IF = 'if status == "optimal":\n'


def _ending(solve: str, status: str, objective: str, value: str, on_optimal: str = ""):
    def rewrite(ending: str) -> str:
        if _STATUS_LINE not in ending or _OPTIMAL_IF not in ending:
            raise TranslationError("the ending has no optimal branch")
        text = ending.replace(_STATUS_LINE, status, 1).replace(_OPTIMAL_IF, _OPTIMAL_IF + on_optimal, 1)
        text = text.replace("model.getObjVal()", objective)
        text = re.sub(r"model\.getVal\(([\w\[\], ]+)\)", lambda m: value.format(m.group(1)), text)
        if re.search(r"model\.(getVal|getObjVal|getStatus|optimize|hideOutput)\(", text):
            raise TranslationError("the ending uses pyscipopt calls that are not translated")
        return solve + text

    return rewrite


_ENDINGS = {
    "pulp": _ending(
        "model.solve(pulp.HiGHS(msg=False))\n",
        "status = pulp.LpStatus[model.status].lower()\n",
        "pulp.value(model.objective)",
        "{}.value()",
    ),
    "pyomo": _ending(
        'result = pyo.SolverFactory("appsi_highs").solve(model, load_solutions=False)\n',
        "status = str(result.solver.termination_condition)\n",
        "pyo.value(model.obj)",
        "pyo.value({})",
        "    model.solutions.load_from(result)\n",
    ),
    "coptpy": _ending(
        "model.solve()\n",
        'status = {COPT.OPTIMAL: "optimal", COPT.INFEASIBLE: "infeasible", COPT.UNBOUNDED: "unbounded"}.get(\n'
        '    model.status, f"status {model.status}"\n)\n',
        "model.objval",
        "{}.x",
    ),
}

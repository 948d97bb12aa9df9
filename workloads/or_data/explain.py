"""Explanations an answer gives in words, computed from the model: which requirements clash in
an infeasible problem (an IIS, `iis.deletion_filter`) and which rows of an LP hold the optimum in
place (binding rows and their dual values, for what-if answers).

Row and variable names are LP identifiers (`capacity__chips`); they are turned back into the
model's words through its `MathModel`: the constraint's label and the set elements the keys
stand for ("Capacity for chips: at most 122").
"""

from __future__ import annotations

import random
import re

from trex.workloads.or_data.iis import IIS, Element, deletion_filter
from trex.workloads.or_data.math_model import MathModel
from trex.workloads.or_data.phrasing import capitalize, join, number
from trex.workloads.or_data.wording import DELETION_MANY, DELETION_ONE, MINIMAL_MANY, MINIMAL_ONE, realize

_SENSE_WORDS = {"<=": "at most", ">=": "at least", "==": "exactly"}


def key_names(math: MathModel) -> dict[str, str]:
    """LP key -> the set element it stands for (`pale_ale` -> `pale ale`); computed once per model."""
    names = math.__dict__.get("_key_names")
    if names is None:
        names = {}
        for set_def in math.sets:
            for element in set_def.elements:
                names.setdefault(re.sub(r"[^a-z0-9]+", "_", str(element).lower()).strip("_") or "k", str(element))
        object.__setattr__(math, "_key_names", names)
    return names


def element_words(name: str, math: MathModel) -> tuple[str, str]:
    """(what, for whom) of an LP row or variable name: ("Capacity", "chips")."""
    family, *keys = name.split("__")
    names = key_names(math)
    whom = ", ".join(names.get(key, key.replace("_", " ")) for key in keys)
    for constraint in math.constraints:
        if constraint.lp_family == family:
            return constraint.label, whom
    for variable in math.variables:
        if variable.lp_family == family:
            return (variable.noun or variable.indicator or family), whom
    return family.replace("_", " "), whom


def variable_phrase(name: str, math: MathModel) -> str:
    """A variable as a noun phrase: "the variable for Thu-Mon (drivers to put on each shift)", "the
    yes/no variable for Stadium" (an indicator's question does not fit where a noun is needed)."""
    what, whom = element_words(name, math)
    is_question = what.startswith(("whether", "which", "for each"))
    kind = "yes/no variable" if is_question else "variable"
    target = f" for {whom}" if whom else ""
    return f"the {kind}{target}" + ("" if is_question else f" ({what.removeprefix('the ')})")


def describe_element(element: Element, math: MathModel, model=None) -> str:
    what, whom = element_words(element.name, math)
    target = f" for {whom}" if whom else ""
    if element.kind == "row":
        description = next((c.description for c in math.constraints if c.lp_family == element.name.split("__")[0]), "")
        about = f" ({description})" if description else ""
        row = next((r for r in model.rows if r.name == element.name), None) if model is not None else None
        mixed = row is not None and len({coef > 0 for _, coef in row.terms}) > 1
        if mixed and element.value == 0:
            return (
                f"{capitalize(what)}{target}{about}"  # "x - Q y <= 0" reads better as its meaning than as "at most 0"
            )
        return f"{capitalize(what)}{target}{about}: {_SENSE_WORDS[element.sense]} {number(round(element.value, 6))}"
    side = "lower bound" if element.kind == "lower" else "upper bound"
    noun = what if what.startswith(("the ", "whether")) else f"the {what}"
    return f"The {side} on {noun}{target}: {_SENSE_WORDS[element.sense]} {number(round(element.value, 6))}"


def iis_explanation(model, math: MathModel, rng: random.Random | None = None) -> str:
    """The clashing requirements of an infeasible model, in words; "" when no IIS is found.
    `rng` picks the wording (`wording`)."""
    rng = rng or random.Random(0)
    found: IIS | None = deletion_filter(model)
    if found is None or not found.elements:
        return ""
    lines = "\n".join(f"- {describe_element(element, math, model)}" for element in found.elements)
    single = len(found.elements) == 1
    if not found.irreducible:
        minimal = "The search could not confirm within its node limit that the set is minimal."
    else:
        minimal = realize(MINIMAL_ONE if single else MINIMAL_MANY, rng)
    how = realize(
        DELETION_ONE if single else DELETION_MANY, rng, tests=str(found.tests), count=str(len(found.elements))
    )
    return f"{how}\n\n{lines}\n\n{minimal}"


def binding_rows(model, values: dict[str, float], tolerance: float = 1e-6) -> list[str]:
    """Rows satisfied with equality at `values` (inequalities only): where the plan is limited."""
    tight = []
    for row in model.rows:
        if row.sense == "==":
            continue
        if abs(row.activity(values) - row.rhs) <= tolerance * (1 + abs(row.rhs)):
            tight.append(row.name)
    return tight


def limits_in_words(model, math: MathModel, values: dict[str, float], limit: int = 4) -> str:
    """ "Capacity for chips and Capacity for assembly are used up" for the binding rows."""
    rows = binding_rows(model, values)
    if not rows:
        return ""
    phrases = []
    for name in rows[:limit]:
        what, whom = element_words(name, math)
        phrases.append(f"{what.lower()} for {whom}" if whom else what.lower())
    more = f" (and {len(rows) - limit} more)" if len(rows) > limit else ""
    return join(phrases) + more


def limits_analysis(model, math: MathModel, values: dict[str, float], rng: random.Random, duals=None) -> str:
    """What holds an optimal plan in place, read from the plan itself: for each constraint family
    how many of its inequality rows are binding (no slack left) and which, the rows with the most
    slack, and what that means for changing a limit (the dual value per unit for an LP, given in
    `duals` as row -> multiplier in the minimization sense; for a MIP the caveat that whole-number
    decisions move in steps). Rows in which every variable is zero are tight only trivially (a
    linking row of an unused option) and are not counted. "" when the model has no inequality row."""
    families: dict[str, list[tuple[str, float]]] = {}
    equations: dict[str, int] = {}
    for row in model.rows:
        if row.sense == "==":
            family = row.name.split("__")[0]
            equations[family] = equations.get(family, 0) + 1
            continue
        if all(abs(values.get(name, 0.0)) <= 1e-9 for name, _ in row.terms) and abs(row.rhs) <= 1e-9:
            continue
        activity = row.activity(values)
        slack = row.rhs - activity if row.sense == "<=" else activity - row.rhs
        families.setdefault(row.name.split("__")[0], []).append((row.name, max(slack, 0.0)))
    if not families:
        return ""
    lines = []
    binding_all: list[str] = []
    for rows in families.values():
        label, _ = element_words(rows[0][0], math)
        tight = [name for name, slack in rows if slack <= 1e-6 * (1 + abs(_rhs(model, name)))]
        binding_all += tight
        loose = sorted(((slack, name) for name, slack in rows if name not in tight), reverse=True)
        whom = [_grouped(element_words(name, math)[1]) for name in tight]
        named = [w for w in whom if w][:4]
        if len(rows) == 1:
            state = (
                realize("[binding, with no slack left|binding (it holds with equality)]", rng)
                if tight
                else (f"{number(round(loose[0][0], 6))} of slack left")
            )
            lines.append(f"- {capitalize(label)}" + (f" for {whom[0]}" if whom and whom[0] else "") + f": {state}.")
            continue
        text = f"- {capitalize(label)}: {len(tight)} of {len(rows)} rows binding"
        if named:
            text += f" ({join(named)}{', ...' if len(tight) > len(named) else ''})"
        if loose:
            slack, name = loose[0]
            who = _grouped(element_words(name, math)[1])
            text += realize(
                "[; the most slack is|; the loosest row is] {who} with {slack} to spare",
                rng,
                who=who or "one row",
                slack=number(round(slack, 6)),
            )
        lines.append(text + ".")
    intro = realize(
        "[Reading the plan against the constraints|Checking each constraint at the optimum|Where the plan meets "
        "its limits]: a row is binding when it holds with equality[, with no room to spare| (the plan meets it "
        "exactly)], and a row with slack [has room left|is not met exactly].",
        rng,
    )
    for family, count_ in equations.items():
        label, _ = element_words(next(row.name for row in model.rows if row.name.split("__")[0] == family), math)
        rows_word = "1 equation" if count_ == 1 else f"{count_} equations"
        lines.append(f"- {capitalize(label)}: {rows_word}, met exactly by every feasible plan.")
    if duals:
        priced = [(name, duals.get(name, 0.0)) for name in binding_all if abs(duals.get(name, 0.0)) > 1e-9][:3]
        if priced:
            items = []
            for name, price in priced:
                label, whom = element_words(name, math)
                items.append(f"{label.lower()}{f' for {whom}' if whom else ''} {number(round(abs(price), 6))}")
            closing = realize(
                "[As this is a linear program|Because the model is an LP], the optimum can improve only if at least "
                "one binding row is loosened, and the dual values (shadow prices) say by how much it changes per "
                "unit of extra right-hand side: {items}.",
                rng,
                items=join(items),
            )
        else:
            closing = realize(
                "[As this is a linear program|Because the model is an LP], the optimum can improve only if at least "
                "one binding row is loosened; a row with slack has a shadow price of 0, so a small change to its "
                "limit leaves the optimum where it is.",
                rng,
            )
    else:
        closing = realize(
            "[With whole-number decisions|In a mixed-integer program] the optimum moves in steps: loosening a "
            "binding row helps only when [a whole unit more fits|the extra room admits a different whole-number "
            "plan], and [a row with slack can start to bind|a limit with slack can become the binding one] once "
            "other data change.",
            rng,
        )
    return "\n".join([intro, "", *lines, "", closing])


def _grouped(whom: str) -> str:
    """A row of several keys ("camera, tent") in parentheses, so a list of them stays readable."""
    return f"({whom})" if ", " in whom else whom


def _rhs(model, name: str) -> float:
    return next(row.rhs for row in model.rows if row.name == name)

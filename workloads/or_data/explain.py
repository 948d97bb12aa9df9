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


def _key_names(math: MathModel) -> dict[str, str]:
    names: dict[str, str] = {}
    for set_def in math.sets:
        for element in set_def.elements:
            names.setdefault(re.sub(r"[^a-z0-9]+", "_", str(element).lower()).strip("_") or "k", str(element))
    return names


def element_words(name: str, math: MathModel) -> tuple[str, str]:
    """(what, for whom) of an LP row or variable name: ("Capacity", "chips")."""
    family, *keys = name.split("__")
    names = _key_names(math)
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
        minimal = "The search could not confirm within its time limit that the set is minimal."
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

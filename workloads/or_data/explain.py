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
from trex.workloads.or_data.iis_reading import cut_reading, row_capacity
from trex.workloads.or_data.loosening import count_row, loosening_sentences
from trex.workloads.or_data.math_model import MathModel
from trex.workloads.or_data.phrasing import capitalize, join, number
from trex.workloads.or_data.prose import singular_noun
from trex.workloads.or_data.row_shapes import switched_off
from trex.workloads.or_data.wording import DELETION_MANY, DELETION_ONE, MINIMAL_MANY, MINIMAL_ONE, realize

# Binding rows named in a "What limits the plan" line; more are counted ("and 3 more"), not hidden.
MAX_NAMED = 8
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


def spoken_names(math: MathModel) -> dict[str, str]:
    """`key_names` as prose says them: an element of a set with a `member` noun (numbered ones:
    disks, hours, tiers, patterns) is named with it ("disk 2", "hour 13", "pattern p1"), so a label
    never ends in a bare number ("Capacity for 2")."""
    names = math.__dict__.get("_spoken_names")
    if names is None:
        names = dict(key_names(math))
        for set_def in math.sets:
            if set_def.member:
                for element in set_def.elements:
                    key = re.sub(r"[^a-z0-9]+", "_", str(element).lower()).strip("_")
                    names[key] = f"{set_def.member} {element}"
        object.__setattr__(math, "_spoken_names", names)
    return names


def element_words(name: str, math: MathModel) -> tuple[str, str]:
    """(what, for whom) of an LP row or variable name: ("Capacity", "chips")."""
    family, *keys = name.split("__")
    names = spoken_names(math)
    whom = ", ".join(names.get(key, key.replace("_", " ")) for key in keys)
    for constraint in math.constraints:
        if constraint.lp_family == family:
            return constraint.label, whom
    for variable in math.variables:
        if variable.lp_family == family:
            return (variable.noun or variable.indicator or family), whom
    return family.replace("_", " "), whom


def ordered_pair(name: str, math: MathModel) -> str | None:
    """ "Yard 2 → Hub Central" for a row or variable indexed by an arc (an ordered pair of places:
    its set's index is a pair and its description says arcs, links, routes, lanes or ordered pairs), None otherwise.
    A lane written "Yard 2, Hub Central" or "(Yard 2 and Hub Central)" reads as two places, and two
    such pairs in one list run together ("Lindenhof and Corner Cup and Bean Street and Café Rosa")."""
    family, *keys = name.split("__")
    names = spoken_names(math)
    if len(keys) == 3 and family in _item_on_arc_families(math):
        # a commodity on an arc (`flow__lime__yard_oeste__port_antofa`): "lime on Yard Oeste → Port Antofa",
        # not "flow, lime, Yard Oeste, Port Antofa" (the tenth session's review, #7)
        first, *arc = (names.get(key, key.replace("_", " ")) for key in keys)
        return f"{first} on {' → '.join(arc)}"
    if len(keys) != 2 or family not in _directed_families(math):
        return None
    return " → ".join(names.get(key, key.replace("_", " ")) for key in keys)


def _item_on_arc_families(math: MathModel) -> frozenset[str]:
    """The LP families of `math` indexed by one set and then a directed pair set (a commodity on an
    arc, `x_{kij}` over (K, A)); computed once per model."""
    found = math.__dict__.get("_item_on_arc_families")
    if found is None:
        sets = {s.symbol: s for s in math.sets}
        directed = _directed_families(math)
        pair_sets = {
            d.over[0] for d in (*math.constraints, *math.variables) if d.lp_family in directed and len(d.over) == 1
        }
        found = frozenset(
            d.lp_family for d in math.variables if len(d.over) == 2 and d.over[0] in sets and d.over[1] in pair_sets
        )
        object.__setattr__(math, "_item_on_arc_families", found)
    return found


def _directed_families(math: MathModel) -> frozenset[str]:
    """The LP families of `math` indexed by a directed pair set (see `ordered_pair`); computed once
    per model, since every term of a written-out sum asks."""
    found = math.__dict__.get("_directed_families")
    if found is not None:
        return found
    sets = {s.symbol: s for s in math.sets}
    families = set()
    for definition in (*math.constraints, *math.variables):
        over = definition.over
        if len(over) == 1 and over[0] in sets:
            pair_set = sets[over[0]]
        else:  # a row over some pairs only, named by its condition: "(s,d) with a capacity"
            index = re.match(r"\(([a-z]),([a-z])\)", getattr(definition, "condition", "") or "")
            pair_set = next((s for s in math.sets if index and s.index == index.group(0)), None)
            if pair_set is None:
                continue
        directed = re.search(r"\barcs?\b|\blinks?\b|\broutes?\b|\blanes?\b|ordered pairs", pair_set.description)
        if re.fullmatch(r"\([a-z],[a-z]\)", pair_set.index) and directed:
            families.add(definition.lp_family)
    found = frozenset(families)
    object.__setattr__(math, "_directed_families", found)
    return found


_EACH = re.compile(r"\beach ([a-z-]+(?:'s)?(?: [a-z-]+(?:'s)?){0,2})")


def _set_nouns(math: MathModel) -> dict[str, list[str]]:
    """Set element (as a key) -> the singular nouns its sets are described by ("city", "user
    region", "slot"), longest first."""
    nouns = math.__dict__.get("_set_nouns")
    if nouns is None:
        nouns = {}
        keys = {str(element): key for key, element in key_names(math).items()}
        for set_def in math.sets:
            head = re.split(r" \(|,", set_def.description)[0].strip().lower()
            head = re.sub(r"^(?:the|all|available|candidate) ", "", head)
            words = head.split()
            if not words:
                continue
            singular = " ".join([*words[:-1], singular_noun(words[-1])])
            # "shift patterns": "each shift pattern", "each pattern", and "each shift"
            forms = sorted({singular, singular_noun(words[-1]), singular_noun(words[0])}, key=len, reverse=True)
            for element in set_def.elements:
                key = keys.get(str(element))
                if key is not None:
                    nouns.setdefault(key, []).extend(form for form in forms if form not in nouns.get(key, []))
        object.__setattr__(math, "_set_nouns", nouns)
    return nouns


def instance_phrase(text: str, name: str, math: MathModel) -> str | None:
    """A general description made specific to one LP row or column: each "each <noun>" replaced
    by the element of `name` that the noun's set holds ("servings of each ingredient to use" for
    `use__milk` -> "servings of milk to use"). None unless every "each" and every key is matched,
    so a caller never pastes a half-general phrase next to an element."""
    if _EACH.search(text) is None:
        return text  # nothing general in it
    family, *keys = name.split("__")
    spoken = spoken_names(math)
    nouns = _set_nouns(math)
    left = list(keys)
    pieces: list[str] = []
    position = 0
    while (match := _EACH.search(text, position)) is not None:  # from where the last "each" ended
        words = match.group(1).split(" ")
        found = None
        for size in range(len(words), 0, -1):  # "each price tier of": "price tier of", "price tier", "price"
            phrase = " ".join(words[:size])
            bare = phrase.removesuffix("'s")
            for key in left:
                forms = nouns.get(key, [])
                if bare in forms or bare.split(" ")[-1] in [form for form in forms if " " not in form]:
                    found = (key, size, phrase.endswith("'s"))
                    break
            if found:
                break
        if found is None:
            return None
        key, size, possessive = found
        left.remove(key)
        element = spoken.get(key, key.replace("_", " "))
        owner = (element + ("'" if element.endswith("s") else "'s")) if possessive else element
        end = match.start() + len("each ") + len(" ".join(words[:size]))
        pieces.append(text[position : match.start()] + owner)
        position = end
    if left:
        return None
    return "".join(pieces) + text[position:]


def variable_phrase(name: str, math: MathModel) -> str:
    """A variable as a singular noun phrase: "the variable for Thu-Mon", "the yes/no variable for
    Stadium". The family's general description is not pasted after it ("the variable for milk
    (servings of each ingredient to use)" reads as a template seam); `instance_phrase` gives the
    specific one where a sentence can take a plural noun."""
    what, whom = element_words(name, math)
    whom = ordered_pair(name, math) or whom  # "the variable for Yard 2 → Hub Central", not two places
    is_question = what.startswith(("whether", "which", "for each"))
    kind = "yes/no variable" if is_question else "variable"
    if not whom:
        return f"the {what.removeprefix('the ')}" if not is_question else f"the {kind}"
    return f"the {kind} for {whom}"


def describe_element(element: Element, math: MathModel, model=None) -> str:
    what, whom = element_words(element.name, math)
    whom = ordered_pair(element.name, math) or whom
    target = f" for {whom}" if whom else ""
    if element.kind == "row":
        description = next((c.description for c in math.constraints if c.lp_family == element.name.split("__")[0]), "")
        if description and whom:  # the general description made specific, or left out
            description = instance_phrase(description, element.name, math) or ""
        about = f" ({description})" if description else ""
        row = next((r for r in model.rows if r.name == element.name), None) if model is not None else None
        mixed = row is not None and len({coef > 0 for _, coef in row.terms}) > 1
        if mixed and element.value == 0:
            # "x - Q y <= 0" reads better as its meaning than as "at most 0"; what it lets through once
            # its yes/no decision is 1 is the bound a reader needs (the Seventh review's #15, #30)
            capacity = row_capacity(row, model) if element.sense == "<=" else None
            bound = f": at most {number(round(capacity, 6))} once built or opened" if capacity else ""
            return f"{capitalize(what)}{target}{about}{bound}"
        return f"{capitalize(what)}{target}{about}: {_SENSE_WORDS[element.sense]} {number(round(element.value, 6))}"
    side = "lower bound" if element.kind == "lower" else "upper bound"
    specific = instance_phrase(what.removeprefix("the "), element.name, math) if whom else None
    if specific is not None:
        noun, target = f"the {specific}", ""  # "the units to make on regular time in February"
    else:
        noun = variable_phrase(element.name, math)
        target = ""
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

    def words(name: str) -> str:
        what, whom = element_words(name, math)
        return what.lower() + (f" for {ordered_pair(name, math) or whom}" if whom else "")

    reading = cut_reading(found, model, words)
    if not found.irreducible:
        minimal = "The search could not confirm within its node limit that the set is minimal."
    else:
        minimal = realize(MINIMAL_ONE if single else MINIMAL_MANY, rng)
    how = realize(
        DELETION_ONE if single else DELETION_MANY, rng, tests=str(found.tests), count=str(len(found.elements))
    )
    return f"{how}\n\n{lines}\n\n{minimal}" + (f"\n\n{reading}" if reading else "")


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


def limits_analysis(
    model, math: MathModel, values: dict[str, float], rng: random.Random, duals=None, least: str = ""
) -> str:
    """What holds an optimal plan in place, read from the plan itself: for each constraint family
    how many of its inequality rows are binding (no slack left) and which, the rows with the most
    slack, and what that means for changing a limit (the dual value per unit for an LP, given in
    `duals` as row -> multiplier in the minimization sense; for a MIP the caveat that whole-number
    decisions move in steps). Rows in which every variable is zero are tight only trivially (a
    linking row of an unused option) and are not counted, nor are big-M rows switched off by a decision at
    0 (`row_shapes.switched_off`), whose room is the big-M's. Rows the model is correct without
    (`ConstraintDef.redundant`: symmetry breaking) are not read as limits: "Symmetry: 3 of 4 rows
    binding" said nothing about why the count of trucks is least (the Seventh review's #24); they
    get one line saying why. `least` is the family's own reason the optimum cannot be better
    (`Family.least_reason`: a weight bound on the trucks), said before the measured sentences.
    "" when the model has no inequality row."""
    redundant = {c.lp_family: (c.label, c.redundant) for c in math.constraints if c.redundant}
    families: dict[str, list[tuple[str, float]]] = {}
    equations: dict[str, int] = {}
    unused: dict[str, int] = {}  # rows of options the plan leaves at zero, per family: said, not hidden
    off: dict[str, int] = {}  # big-M rows a decision at 0 switches off, per family: said, not hidden
    ordering: dict[str, int] = {}  # rows of a redundant family: counted, said, never read as limits
    for row in model.rows:
        if row.name.split("__")[0] in redundant:
            ordering[row.name.split("__")[0]] = ordering.get(row.name.split("__")[0], 0) + 1
            continue
        if row.sense == "==":
            family = row.name.split("__")[0]
            equations[family] = equations.get(family, 0) + 1
            continue
        if all(abs(values.get(name, 0.0)) <= 1e-9 for name, _ in row.terms) and abs(row.rhs) <= 1e-9:
            unused[row.name.split("__")[0]] = unused.get(row.name.split("__")[0], 0) + 1
            continue
        if switched_off(row, model, values):  # its room, or its zero room, is the big-M's (the Seventh's #48)
            off[row.name.split("__")[0]] = off.get(row.name.split("__")[0], 0) + 1
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
        whom = [ordered_pair(name, math) or _grouped(element_words(name, math)[1]) for name in tight]
        # a pair is written "auto parts and coffee beans": no parenthesis inside the list's own
        # every binding row is named (up to MAX_NAMED; beyond that the rest are counted, never hidden behind "...")
        named = [w[1:-1].replace(", ", " and ") if w.startswith("(") and w.endswith(")") else w for w in whom if w]
        hidden = max(0, len(named) - MAX_NAMED)
        named = named[:MAX_NAMED]
        skipped = unused.get(rows[0][0].split("__")[0], 0)
        switched = off.get(rows[0][0].split("__")[0], 0)
        left_out = (
            [f"{skipped} {'row' if skipped == 1 else 'rows'} of options the plan does not use, where every term is 0"]
            if skipped
            else []
        )
        if switched:
            left_out.append(
                f"{switched} big-M {'row' if switched == 1 else 'rows'} of options the plan does not use, "
                f"switched off by {'its' if switched == 1 else 'their'} yes/no decision at 0"
            )
        note = f", not counting {join(left_out)}" if left_out else ""
        if len(rows) == 1:
            state = (
                realize("[binding, with no slack left|binding (it holds with equality)]", rng)
                if tight
                else (f"{number(round(loose[0][0], 6))} of slack left")
            )
            lines.append(
                f"- {capitalize(label)}" + (f" for {whom[0]}" if whom and whom[0] else "") + f": {state}{note}."
            )
            continue
        text = f"- {capitalize(label)}: {len(tight)} of {len(rows)} rows binding"
        if named:
            # pairs written "a and b" are separated by semicolons, so two of them do not run together
            # ("pistons and gearbox housings and gearbox housings and axles", the Seventh review's #48)
            paired = any(" and " in name for name in named)
            if paired:
                shown = "; ".join(named) + (f"; and {hidden} more" if hidden else "")
            else:
                shown = join(named) if not hidden else ", ".join(named) + f" and {hidden} more"
            text += f" ({shown})"
        text += note
        if loose:
            slack, name = loose[0]
            who = ordered_pair(name, math) or _grouped(element_words(name, math)[1])
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
        "exactly)], and a row with slack [has room left|leaves part of its limit unused]: it could be tightened a "
        "little without moving the optimum.",
        rng,
    )
    for family, count_ in equations.items():
        label, _ = element_words(next(row.name for row in model.rows if row.name.split("__")[0] == family), math)
        rows_word = "1 equation" if count_ == 1 else f"{count_} equations"
        lines.append(f"- {capitalize(label)}: {rows_word}, met exactly by every feasible plan.")
    for family, count_ in ordering.items():
        label, why = redundant[family]
        rows_word = "its row" if count_ == 1 else f"its {count_} rows"
        lines.append(
            f"- {capitalize(label)}: {rows_word} never limit the optimum ({why}), so whether they bind says "
            "nothing about the plan."
            if count_ > 1
            else f"- {capitalize(label)}: {rows_word} never limits the optimum ({why}), so whether it binds says "
            "nothing about the plan."
        )
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
        # a MIP has no dual values: what one more unit of a binding limit does is measured by re-solving
        # (`loosening`), not asserted ("the optimum moves in steps ...", the Seventh review's #19, #24)
        by_name = {row.name: row for row in model.rows}

        def label(name: str) -> str:
            what, whom = element_words(name, math)
            if whom and count_row(by_name[name], model):  # a rule on a pair: "conflicts for camera and tent"
                whom = join(whom.split(", "))
            return what.lower() + (f" for {ordered_pair(name, math) or whom}" if whom else "")

        measured = ([least] if least else []) + loosening_sentences(model, values, binding_all, label)
        closing = " ".join(measured) or realize(
            "[With whole-number decisions|In a mixed-integer program] no shadow price applies: a binding row shows "
            "where the plan meets a limit, not what one more unit of that limit is worth.",
            rng,
        )
    return "\n".join([intro, "", *lines, "", closing])


def _grouped(whom: str) -> str:
    """A row of several keys ("camera, tent") in parentheses, so a list of them stays readable."""
    return f"({whom})" if ", " in whom else whom


def _rhs(model, name: str) -> float:
    return next(row.rhs for row in model.rows if row.name == name)

"""The optimum checked by hand on this instance: the arithmetic a teacher writes under a solver's answer.

An answer that only states the solver's plan teaches the template; one that redoes the sums on the
instance's own numbers and names teaches how to read a plan. `worked_check` writes, from the verified
plan and model only:

- the objective recomputed term by term from the nonzero decisions ("40 × 27.95 (pale ale) + ...
  = 9,232.81"), stated as the reported optimum only when the sum agrees with it;
- the rows that hold the plan, written out: the activity of up to two binding rows (different
  constraint families first) and of the row with the most room, against their limits; where no
  short row binds, the row closest to its limit (the loosest row would say the least);
- for a linear program with a checked dual certificate, the options the plan leaves at zero priced
  out: the option's own objective coefficient against what it would use, valued at the rows' dual
  values (its reduced cost), which says why leaving it out is optimal and how far its coefficient
  would have to move before it enters.

`written_rows` gives the model section the concrete rows next to the general ones: one row of each
constraint family with the instance's coefficients and names, in the model's own symbols.

Every figure is computed from the `LinearModel` and the plan; nothing is copied from the solver's
log. Names come from the model's sets (`explain.element_words`), so the lines read as the story's
words, not LP identifiers.
"""

from __future__ import annotations

import math as _math
import random
import re
from dataclasses import replace

from trex.workloads.or_data.explain import element_words, key_names, ordered_pair, variable_phrase
from trex.workloads.or_data.linear_model import LinearModel, Row, family_of
from trex.workloads.or_data.math_model import MathModel
from trex.workloads.or_data.phrasing import capitalize
from trex.workloads.or_data.prose import number
from trex.workloads.or_data.row_shapes import switched_off
from trex.workloads.or_data.solve import solve_model
from trex.workloads.or_data.wording import realize

_ZERO = 1e-9
# Terms written out one by one in a sum; a longer objective is shown by kind of decision, each
# kind's terms on their own line (at most MAX_GROUP_TERMS; beyond that no sum is written).
MAX_TERMS = 8
MAX_GROUP_TERMS = 12


def signed(value: float, digits: int = 4) -> str:
    """`number` with a typographic minus: "−0.5"."""
    rounded = round(value, digits)
    return ("−" if rounded < 0 else "") + number(abs(rounded))


def factor(value: float, digits: int = 4) -> str:
    """A number as a factor of a product or a subtrahend: negatives in parentheses, "(−4)"."""
    text = signed(value, digits)
    return f"({text})" if text.startswith("−") else text


def _shown(value: float) -> tuple[str, bool]:
    """A value as shown (4 decimals at most) and whether showing it rounded it."""
    rounded = round(value, 4)
    return factor(rounded), abs(rounded - value) > 1e-9 * (1 + abs(value))


def _who(name: str, math: MathModel, families: int) -> str:
    what, whom = element_words(name, math)
    whom = ordered_pair(name, math) or whom  # an arc reads "Yard 2 → Hub Central", not as two places
    if families > 1:  # several kinds of decision in one sum: say which kind each term is
        kind = family_of(name).replace("_", " ")
        if " → " in whom:  # "flow on Yard Oeste → Port Antofa", not "flow, Yard Oeste, Port Antofa"
            return f"{kind} of {whom}" if " on " in whom else f"{kind} on {whom}"
        return f"{kind}, {whom}" if whom else kind
    return whom or re.sub(r" \([^()]*\)$", "", what.removeprefix("the "))


def _moved_label(name: str, math: MathModel, families: int) -> str:
    """A decision in the list of moves: "flow on Yard 2 → Hub Central", "put (bicycles, truck 1)",
    "lager". Not "put, bicycles, truck 1 1 → 0", where the kind reads as one more element and the
    truck's number runs into the value (the Seventh review's #8, #32)."""
    if families <= 1:
        return _who(name, math, families)
    kind = family_of(name).replace("_", " ")
    whom = ordered_pair(name, math) or element_words(name, math)[1]
    if not whom:
        return kind
    if " → " in whom:
        return f"{kind} on {whom}"
    return f"{kind} ({whom})" if ", " in whom else f"{kind} {whom}"


def _term(coef: float, value: float, label: str, first: bool) -> tuple[str, bool]:
    """ "− 7.5 × 31.7333 (lager)"; a unit coefficient is not multiplied out. A coefficient times a
    decision at 1 is written "45 × 1 (...)", so the coefficient never reads as the decision's value."""
    sign = "−" if coef < 0 else "+"
    size = abs(coef)
    shown_value, rounded = _shown(value)
    if abs(size - 1) <= _ZERO:
        body = f"{shown_value} ({label})"
    else:
        body = f"{number(round(size, 6))} × {shown_value} ({label})"
    if first:
        return ("−" + body if coef < 0 else body), rounded
    return f"{sign} {body}", rounded


def _used(terms: list[tuple[str, float]], values: dict[str, float]) -> list[tuple[str, float]]:
    return [(name, coef) for name, coef in terms if abs(values.get(name, 0.0)) > 1e-6]


def written_sum(
    terms: list[tuple[str, float]], values: dict[str, float], math: MathModel, families: int = 0, zeros: bool = False
) -> tuple[str, bool]:
    """The nonzero terms of `sum(coef * x)` at `values`, as text, and whether a shown value is
    rounded. Every term is written out: a sum the reader cannot redo does not check anything.
    `families`: the kinds of decision in the whole row (both sides), when more than this sum's;
    `zeros`: write the terms at 0 too (a limit made of decisions the plan leaves at 0)."""
    used = list(terms) if zeros else _used(terms, values)
    families = max(families, len({family_of(name) for name, _ in used}))
    if not used:
        return "0", False
    pieces, rounded = [], False
    for index, (name, coef) in enumerate(used):
        text, was_rounded = _term(coef, values.get(name, 0.0), _who(name, math, families), index == 0)
        pieces.append(text)
        rounded |= was_rounded
    return " ".join(pieces), rounded


def _equals(rounded: bool) -> str:
    """ "≈" only where a shown value was rounded: on an exact sum it would say the total is not exact."""
    return "≈" if rounded else "="


def objective_line(model: LinearModel, math: MathModel, values: dict[str, float], optimum: float) -> str:
    """The objective recomputed from the plan; "" when the recomputed sum does not match `optimum`
    or has more terms than a reader can check (`MAX_GROUP_TERMS` in one kind of decision). Beyond
    `MAX_TERMS` terms the sum is given per kind of decision: the subtotals add up to the total,
    and each subtotal is written out term by term on its own line."""
    total = model.objective_value(values)
    if abs(total - optimum) > 1e-6 * (1 + abs(optimum)):
        return ""
    used = _used(list(model.objective), values)
    if len(used) == 1 and abs(used[0][1] - 1) <= _ZERO:  # the objective is one variable: nothing to add up
        return ""
    if len(used) <= MAX_TERMS:
        text, rounded = written_sum(used, values, math)
        return f"{capitalize(math.objective_description)}: {text} {_equals(rounded)} {signed(total)}."
    groups: dict[str, list[tuple[str, float]]] = {}
    for name, coef in used:
        groups.setdefault(family_of(name), []).append((name, coef))
    if len(groups) == 1 or any(len(group) > MAX_GROUP_TERMS for group in groups.values()):
        return ""
    subtotals, details, rounded = [], [], False
    for index, (family, group) in enumerate(groups.items()):
        kind = family.replace("_", " ")
        subtotal = _math.fsum(coef * values[name] for name, coef in group)
        pieces = []
        for position, (name, coef) in enumerate(group):
            text, was_rounded = _term(coef, values[name], _who(name, math, 1), position == 0)
            pieces.append(text)
            rounded |= was_rounded
        shown, was_rounded = _shown(subtotal)
        rounded |= was_rounded
        subtotals.append(("" if index == 0 else "+ ") + f"{shown} ({kind})")
        details.append(f"- {kind}: {' '.join(pieces)} {_equals(was_rounded)} {shown}")
    head = f"{capitalize(math.objective_description)}: {' '.join(subtotals)} {_equals(rounded)} {signed(total)}"
    return head + ", by kind of decision:\n\n" + "\n".join(details)


def row_label(row: Row, math: MathModel) -> str:
    what, whom = element_words(row.name, math)
    whom = ordered_pair(row.name, math) or whom  # "Capacity for Hub Berlin → Brno", not "for Hub Berlin, Brno"
    return capitalize(what) + (f" for {whom}" if whom else "")


def slack_of(row: Row, values: dict[str, float]) -> float:
    activity = row.activity(values)
    if row.sense == "<=":
        return row.rhs - activity
    if row.sense == ">=":
        return activity - row.rhs
    return 0.0


def _sides(row: Row) -> tuple[list[tuple[str, float]], list[tuple[str, float]], str]:
    """The row as `left sense right + rhs` with positive coefficients on both sides: the terms an
    LP row moved to the left (a capacity times its open decision, a makespan) go back to the
    right, where the model states them. A row whose terms are all negative is turned around."""
    terms, sense = list(row.terms), row.sense
    if terms and all(coef < 0 for _, coef in terms):
        terms = [(name, -coef) for name, coef in terms]
        sense = {"<=": ">=", ">=": "<=", "==": "=="}[sense]
    left = [(name, coef) for name, coef in terms if coef > 0]
    right = [(name, -coef) for name, coef in terms if coef < 0]
    return left, right, sense


def row_line(row: Row, math: MathModel, values: dict[str, float], rng: random.Random) -> str:
    """A row's activity at the plan against its limit: binding, or how much room is left. Terms
    on the limit's side are written there ("35 (flow ...) = 35, against 80 × 1 (build ...) = 80")."""
    left, right, sense = _sides(row)
    rhs = row.rhs if sense == row.sense else -row.rhs
    # the limit's decisions, written out even at 0 when there are few ("0.25 × 0 (...)"): a bare
    # "minimum of 0" would hide what the limit is made of
    right_used = right if len(right) <= MAX_TERMS else _used(right, values)
    # a decision at 0 beside nonzero ones adds nothing to the limit: "10.5 (start, backup) − 3.5", not
    # "+ 32.5 × 0 (before, ...)", which reads as a switched-off big-M row when the row is the active one
    right_used = _used(right_used, values) or right_used
    kinds = len({family_of(name) for name, _ in [*_used(left, values), *right_used]})
    left_text, left_rounded = written_sum(left, values, math, kinds)
    left_value = _math.fsum(coef * values.get(name, 0.0) for name, coef in left)
    limit_value = rhs + _math.fsum(coef * values.get(name, 0.0) for name, coef in right)
    if right_used:
        right_text, right_rounded = written_sum(right_used, values, math, kinds, zeros=True)
        if abs(rhs) > _ZERO:
            right_text += f" {'−' if rhs < 0 else '+'} {number(round(abs(rhs), 6))}"
        single = len(right_used) == 1 and abs(right_used[0][1] - 1) <= _ZERO and abs(rhs) <= _ZERO
        limit = right_text if single else f"{right_text} {_equals(right_rounded)} {signed(limit_value)}"
    else:
        limit = signed(limit_value, 6)
    idle = len(right) if right and not right_used else 0  # too many to write out, and every one at 0
    slack = limit_value - left_value if sense == "<=" else left_value - limit_value
    if abs(slack) <= 1e-6 * (1 + abs(limit_value)):
        state = realize(
            "[exactly the limit of {limit}: binding|equal to its limit {limit}, so the row binds|"
            "at its limit of {limit}, so it binds]",
            rng,
            limit=limit,
        )
    else:
        room = number(round(abs(slack), 4))
        side = "below the cap of" if sense == "<=" else "above the minimum of"
        state = f"{room} {side} {limit}"
        if idle:  # "above the minimum of 0" hides that the limit is made of decisions (blending's share rows)
            state = (
                f"{room} {side.removesuffix(' of')}, which is {limit} here because none of the {idle} decisions "
                "on its limit's side is used"
            )
    return f"{row_label(row, math)}: {left_text} {_equals(left_rounded)} {signed(left_value)}, {state}."


def _rows_to_show(model: LinearModel, values: dict[str, float]) -> tuple[list[Row], Row | None, Row | None, int]:
    """Up to two binding inequality rows with a nonzero term (one per constraint family first),
    the row with the most room (None when every row binds), the loose row closest to its limit
    (what to show when no short row binds: the loosest row is the least informative one), and the
    number of binding rows too long to write out. Rows with more nonzero terms than `MAX_TERMS`
    are not written out. Room is compared as a share of the limit, so a row with 5,270 to spare
    on 100,000 is not called roomier than one with 27,900 on 30,000 by accident of scale."""
    binding: list[Row] = []
    loose: list[tuple[float, Row]] = []
    long_binding = 0
    for row in model.rows:
        if row.sense == "==":
            continue
        used = _used(list(row.terms), values)
        if not used:
            continue
        slack = slack_of(row, values)
        if switched_off(row, model, values):
            continue  # its room (or its zero room) is the big-M's: it holds nothing of this plan
        if len(used) > MAX_TERMS:
            long_binding += abs(slack) <= 1e-6 * (1 + abs(row.rhs))
            continue
        if abs(slack) <= 1e-6 * (1 + abs(row.rhs)):
            binding.append(row)
        elif slack > 0 and _used(_sides(row)[0], values):
            loose.append((slack / (1 + abs(row.rhs)), row))
    chosen: list[Row] = []
    seen: set[str] = set()
    for row in binding:  # one per family first, then fill up
        if family_of(row.name) not in seen:
            chosen.append(row)
            seen.add(family_of(row.name))
        if len(chosen) == 2:
            break
    for row in binding:
        if len(chosen) == 2:
            break
        if row not in chosen:
            chosen.append(row)
    roomiest = max(loose, key=lambda item: item[0])[1] if loose else None
    closest = min(loose, key=lambda item: item[0])[1] if loose else None
    return chosen, roomiest, closest, long_binding


def pricing_out(
    model: LinearModel, math: MathModel, values: dict[str, float], duals: dict[str, float], limit: int = 2
) -> list[str]:
    """Reduced costs of options the plan leaves at a zero lower bound, in the model's own sense:
    the option's objective coefficient minus the rows' dual values times its coefficients in them.
    `duals` are row multipliers in the minimization sense (as `Certificate.rows`). An option is
    explained only when its reduced cost has the sign optimality requires (it does, for a checked
    dual certificate) and is not zero."""
    sign = 1.0 if model.sense == "minimize" else -1.0
    prices = {name: sign * value for name, value in duals.items()}  # per unit of right-hand side, own sense
    cost = dict(model.objective)
    columns: dict[str, list[tuple[str, float]]] = {}
    for row in model.rows:
        for name, coef in row.terms:
            columns.setdefault(name, []).append((row.name, coef))
    rejected = []
    for variable in model.variables:
        value = values.get(variable.name, 0.0)
        if variable.lower != 0 or abs(value) > 1e-6 or variable.kind != "continuous":
            continue
        priced = [
            (row, coef, prices[row])
            for row, coef in columns.get(variable.name, [])
            if abs(prices.get(row, 0.0)) > _ZERO
        ]
        own = cost.get(variable.name, 0.0)
        reduced = own - _math.fsum(coef * price for _, coef, price in priced)
        wrong_sign = reduced < -1e-7 if model.sense == "minimize" else reduced > 1e-7
        if wrong_sign or abs(reduced) <= 1e-7 or not priced:
            continue
        rejected.append((abs(own), variable.name, own, priced, reduced))
    # the most tempting first: the largest own coefficient for a maximization, the smallest cost otherwise
    rejected.sort(key=lambda item: (-item[0] if model.sense == "maximize" else item[0], item[1]))
    optimum = model.objective_value({variable.name: values.get(variable.name, 0.0) for variable in model.variables})
    lines = []
    for _, name, own, priced, reduced in rejected[:limit]:
        parts = []
        for index, (row_name, coef, price) in enumerate(priced[:4]):
            what, whom = element_words(row_name, math)
            label = what.lower() + (f" for {whom}" if whom else "")
            product = f"{factor(coef, 6)} × {factor(price)} ({label})"
            parts.append(product if index == 0 else f"+ {product}")
        more = f" + {len(priced) - 4} more" if len(priced) > 4 else ""
        worth = _math.fsum(coef * price for _, coef, price in priced)
        subject = variable_phrase(name, math)
        line = (
            f"{capitalize(subject)} is 0. One unit of it has objective coefficient {signed(own, 6)}, and "
            f"at the dual values of its rows it is worth {' '.join(parts)}{more} = {signed(worth)}; "
            f"its reduced cost is {signed(own, 6)} − {factor(worth)} = {signed(reduced)}"
        )
        rate = forced_rate(model, name, optimum)
        if rate is not None and abs(rate - abs(reduced)) <= _RATE_TOLERANCE * (1 + abs(reduced)):
            lines.append(f"{line}, {_verdict(model, math, abs(reduced), own)}.")
        elif rate is None:  # forcing it in breaks a row no other decision can make up for
            lines.append(
                f"{line}. These dual values are not the only ones of this plan, and no price makes the option "
                "enter: forcing any of it in and re-solving makes the problem infeasible."
            )
        else:  # a degenerate plan: its dual values are not unique, and these ones understate the option's cost
            lines.append(
                f"{line}. These dual values are not the only ones of this plan (it is degenerate), so the reduced "
                f"cost is not what the option costs: forcing {number(_STEP)} of it in and re-solving moves the "
                f"optimum by {number(round(rate * _STEP, 6))}, {_verdict(model, math, rate, own)}."
            )
    return lines


_STEP = 0.01  # how much of a rejected option `forced_rate` forces in: the rate at the plan, past any tie
_RATE_TOLERANCE = 1e-3


def forced_rate(model: LinearModel, name: str, optimum: float) -> float | None:
    """What each unit of `name` costs the optimum when `_STEP` of it is forced in and the LP is
    re-solved from the plan's optimum `optimum`, per unit and as a loss (positive); None when
    forcing it in is infeasible. This is the
    reduced cost when the plan's dual values are unique; at a degenerate plan they are not, and a
    reduced cost read from one set of them can understate the real cost (the Seventh review's #23:
    1.5 stated, 6.5 real), so the stated figure is checked against this one."""
    forced = replace(
        model,
        variables=tuple(
            replace(variable, lower=_STEP) if variable.name == name else variable for variable in model.variables
        ),
    )
    moved = solve_model(forced)
    if moved.status != "optimal":
        return None
    loss = moved.objective - optimum if model.sense == "minimize" else optimum - moved.objective
    return loss / _STEP


def _verdict(model: LinearModel, math: MathModel, rate: float, own: float) -> str:
    """Each unit's loss and the objective coefficient at which the option would enter the plan."""
    if model.sense == "maximize":
        return (
            f"so each unit would lower the {math.objective_description} by {signed(rate)}; "
            f"its coefficient would have to rise above {signed(own + rate)} before it enters the plan"
        )
    if own - rate < -1e-9:  # "fall below −3" names a price no option has: say it enters at no cost of 0 or more
        return (
            f"so each unit would raise the {math.objective_description} by {signed(rate)}, more than its own cost of "
            f"{signed(own)}: even at a cost of 0 it would stay out of the plan"
        )
    return (
        f"so each unit would raise the {math.objective_description} by {signed(rate)}; "
        f"its cost would have to fall below {signed(own - rate)} before it enters the plan"
    )


def worked_check(
    model: LinearModel,
    math: MathModel,
    values: dict[str, float],
    optimum: float,
    rng: random.Random,
    duals: dict[str, float] | None = None,
) -> str:
    """The module docstring's checks of an optimal plan, as a short section; "" when there is
    nothing to recompute (no nonzero decision)."""
    if not any(abs(values.get(name, 0.0)) > 1e-6 for name, _ in model.objective):
        return ""
    blocks = []
    objective = objective_line(model, math, values, optimum)
    if objective:
        intro = realize(
            "[Recomputing the objective from the plan confirms the reported optimum|Term by term, the objective at "
            "the optimum adds up to the reported value|Adding up the objective over the nonzero decisions gives the "
            "reported value]:",
            rng,
        )
        blocks.append(f"{intro}\n\n{objective}")
    binding, roomiest, closest, long_binding = _rows_to_show(model, values)
    lines = [row_line(row, math, values, rng) for row in binding]
    if binding and roomiest is not None:
        lines.append(row_line(roomiest, math, values, rng))
    elif closest is not None:
        lines.append(row_line(closest, math, values, rng))
    if lines and binding:
        intro = realize(
            "[The rows that hold the plan, written out|Checking the tightest rows by hand|"
            "What the plan uses of its limits]"
            + (" (and, for contrast, the row with the most room)" if roomiest is not None else "")
            + ":",
            rng,
        )
    elif lines:  # no short row is at its limit: say so, and show the one nearest to binding
        longer = (
            f" ({long_binding} longer {'row binds' if long_binding == 1 else 'rows bind'}; "
            f"{'it has' if long_binding == 1 else 'they have'} more than {MAX_TERMS} terms)"
            if long_binding
            else ""
        )
        intro = realize(
            "[No row short enough to write out is at its limit here{longer}; the one closest to its limit|"
            "None of the short rows binds at this plan{longer}; the one nearest to binding is]:",
            rng,
            longer=longer,
        )
    if lines:  # both branches: the binding rows were computed and then dropped before (the Seventh's #38)
        blocks.append(intro + "\n\n" + "\n".join(f"- {line}" for line in lines))
    if duals and not model.is_mip:
        priced = pricing_out(model, math, values, duals)
        if priced:
            intro = realize(
                "[Why the plan leaves some options at zero|Pricing out the options the plan does not use] "
                "(reduced costs from the dual values):",
                rng,
            )
            blocks.append(intro + "\n\n" + "\n".join(f"- {line}" for line in priced))
    return "\n\n".join(blocks)


_LATEX_SPECIAL = re.compile(r"([&%$#_{}])")


def _latex_name(text: str) -> str:
    return text if re.fullmatch(r"\d+", text) else r"\text{" + _LATEX_SPECIAL.sub(r"\\\1", text) + "}"


def _latex_number(value: float) -> str:
    rounded = round(value, 6)
    return str(int(rounded)) if rounded.is_integer() else f"{rounded:.6f}".rstrip("0").rstrip(".")


def _latex_variable(name: str, math: MathModel) -> str:
    """`make__pale_ale` as the model's own symbol with the instance's names as its index:
    `x_{\\text{pale ale}}`."""
    family, *keys = name.split("__")
    variable = next((v for v in math.variables if v.lp_family == family), None)
    base = re.match(r"\\?[A-Za-z]+", variable.symbol).group(0) if variable is not None else r"\mathit{" + family + "}"
    if not keys:
        return base
    names = key_names(math)
    return base + "_{" + ",".join(_latex_name(names.get(key, key.replace("_", " "))) for key in keys) + "}"


def written_rows(model: LinearModel, math: MathModel, families: int = 4, max_terms: int = 8) -> str:
    """One row of each constraint family (up to `families`) with this instance's coefficients, in the
    model's symbols: the general constraint next to what it says for these data. "" when no row is
    short enough to read (more than `max_terms` terms)."""
    chosen: dict[str, Row] = {}
    for row in model.rows:
        family = family_of(row.name)
        if family not in chosen and 1 <= len(row.terms) <= max_terms:
            chosen[family] = row
    lines = []
    for row in list(chosen.values())[:families]:
        terms = []
        for index, (name, coef) in enumerate(row.terms):
            size = abs(coef)
            factor_ = "" if abs(size - 1) <= _ZERO else _latex_number(size) + r"\,"
            sign = ("-" if coef < 0 else "") if index == 0 else (" - " if coef < 0 else " + ")
            terms.append(f"{sign}{factor_}{_latex_variable(name, math)}")
        sense = {"<=": r"\le", ">=": r"\ge", "==": "="}[row.sense]
        lines.append(f"- {row_label(row, math)}: ${''.join(terms)} {sense} {_latex_number(row.rhs)}$")
    if not lines:
        return ""
    intro = "**With these data** (one row of each constraint, written out):"
    return intro + "\n\n" + "\n".join(lines)


def moved_decisions(
    model: LinearModel,
    before: dict[str, float],
    after: dict[str, float],
    math: MathModel,
    new_objective: tuple[tuple[str, float], ...] | None = None,
    limit: int = 6,
) -> str:
    """The decisions a what-if moved, old -> new with the difference ("lager 31.7333 → 35.1 (+3.3667)"),
    largest moves first; "" when none moved. Variables of only one of the two models are left out
    (a structural change says what it removed). When the objective's coefficients did not change
    (`new_objective` equal to the model's) and every move is shown, the moves are priced: their
    coefficients times their differences add up to the change of the optimum, which traces the
    change to the decisions that carry it (18 × 320 more overtime − 18 × 20 less stock = 5,400)."""
    moves = []
    for variable in model.variables:
        if variable.name not in after:
            continue
        old, new = before.get(variable.name, 0.0), after[variable.name]
        if abs(new - old) > 1e-6 * (1 + abs(old)):
            moves.append((abs(new - old), variable.name, old, new))
    if not moves:
        return ""
    moves.sort(key=lambda item: (-item[0], item[1]))
    families = len({family_of(name) for _, name, _, _ in moves})
    shown = []
    for _, name, old, new in moves[:limit]:
        difference = new - old
        change = ("+" if difference > 0 else "") + signed(difference)
        shown.append(f"{_moved_label(name, math, families)}: {signed(old)} → {signed(new)} ({change})")
    hidden = len(moves) - limit
    more = f", and {hidden} smaller {'move' if hidden == 1 else 'moves'}" if hidden > 0 else ""
    count = "1 decision moves" if len(moves) == 1 else f"{len(moves)} decisions move"
    text = f"Decision by decision, {count}: {'; '.join(shown)}{more}."
    costs = dict(model.objective)
    if new_objective is None or dict(new_objective) != costs or len(moves) > limit or len(after) < len(before):
        return text
    priced = [(name, costs[name], new - old) for _, name, old, new in moves if abs(costs.get(name, 0.0)) > _ZERO]
    if not priced:
        return text
    terms = []
    for index, (name, coef, difference) in enumerate(priced):
        size = f"{number(round(abs(coef), 6))} × {number(round(abs(difference), 4))} ({_who(name, math, families)})"
        negative = (coef < 0) != (difference < 0)
        terms.append(("−" if negative else "") + size if index == 0 else ("− " if negative else "+ ") + size)
    total = _math.fsum(coef * difference for _, coef, difference in priced)
    change = _math.fsum(coef * (after.get(name, 0.0) - before.get(name, 0.0)) for name, coef in costs.items())
    if abs(total - change) > 1e-6 * (1 + abs(change)):  # small moves left out carry part of it: say nothing
        return text
    rounded = any(abs(round(d, 4) - d) > 1e-9 for _, _, d in priced)
    return (
        f"{text} Priced in the objective, the moves account for the whole change: {' '.join(terms)} "
        f"{_equals(rounded)} {signed(total)}."
    )

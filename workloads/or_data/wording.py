"""Sentences composed from independent parts, so the frame of an answer is not one fixed string.

An answer's framing sentences ("The decisions are ...", "So this is a mixed-integer program.")
recur in every sample of a family; written as one string each (or as three whole-sentence
variants) they are 5-grams every sample shares, and a model trained on them learns the
generator's phrases. Here each such sentence is a small grammar: `[a|b|c]` picks one
alternative, groups nest, `{name}` is filled afterwards. Independent choices multiply: a
sentence of four slots with five alternatives each has 625 forms, and the 5-grams that span two
slots repeat far less often than any whole-sentence variant could.

    realize("[So|Hence|Therefore] this is [a mixed-integer program|a MIP].", rng)

Every alternative must be correct English in every combination: slots are chosen so that any
choice agrees with its neighbours (the prose checker still reads every answer).
"""

from __future__ import annotations

import random
import re

_GROUP = re.compile(r"\[([^\[\]]*)\]")


def realize(template: str, rng: random.Random, **fills: str) -> str:
    """`template` with every `[a|b]` group replaced by one alternative (innermost first), then
    `{name}` filled from `fills`."""
    text = template
    while True:
        match = _GROUP.search(text)
        if match is None:
            break
        choice = rng.choice(match.group(1).split("|"))
        text = text[: match.start()] + choice + text[match.end() :]
    text = text.format(**fills) if fills else text
    return re.sub(r"\s{2,}", " ", text).replace(" ,", ",").replace(" .", ".").strip()


_CHOICE = re.compile(r"\[([^\[\]|]*(?:\|[^\[\]|]*)+)\]")


def choose(text: str, rng: random.Random) -> str:
    """`text` with every `[a|b|...]` group replaced by one alternative (innermost first); brackets
    without a `|` (LaTeX, "x[i]") and `{...}` are left alone. The families write their reasons
    (`ConstraintDef.why`, `technique`) this way: one piece of knowledge, several correct wordings."""
    while True:
        match = _CHOICE.search(text)
        if match is None:
            return re.sub(r"\s{2,}", " ", text)
        text = text[: match.start()] + rng.choice(match.group(1).split("|")) + text[match.end() :]


# -- understanding -------------------------------------------------------------------------------

DECISIONS = (
    "[The decisions are|The decisions to make are|What has to be decided is|The model [decides|settles|determines]"
    "|The unknowns are|[We have|The planner has] to [decide|settle|determine]|The plan [has to settle|must "
    "settle|fixes]"
    "|[Our|The] choices [here |]are] {x}."
)
GOAL_MIN = (
    "[The [goal|aim|objective] is to|We [want|need|try] to|The [plan|model] should] "
    "[minimize|bring down|cut|hold down] the {what}."
)
GOAL_MAX = (
    "[The [goal|aim|objective] is to|We [want|need|try] to|The [plan|model] should] "
    "[maximize|raise|drive up|push up] the {what}."
)
CONSTRAINTS_INTRO = (
    "[[The|Our] constraints|The [rules|requirements|limits] of the model|What [restricts|limits|shapes] the plan]"
    "[, and [why each is needed|where each comes from|the reason for each]|, each with its reason"
    "|, [read|taken] from the [story|problem|situation]]:"
)
CONSTRAINT_BULLETS = ("- {label}: {why}.", "- {label} — {why}.", "- **{label}**: {why}.", "- {label}, because {why}.")
CONSTRAINT_SENTENCE_FIRST = "[The|A] {label} constraint [is [there|needed]|is [in the model|required]] because {why}."
CONSTRAINT_SENTENCE_NEXT = (
    "[Next|Then|Also|Besides|In addition|Further], [the|a] {label} constraint [is [there|needed]|is required] "
    "[because|since] {why}."
)
BOUNDS = (
    "[Limits|Minimums and caps|Lower and upper limits|Caps and minimums] [that concern|on|that touch] "
    "[a single quantity|one variable [only|alone]|only one decision] [are written|go into the model|are entered] "
    "as [bounds|lower and upper bounds] on [its|that] variable[, not| rather than| and not] as separate "
    "[constraints|rows]."
)
WHOLE = "{what} [must be|have to be|can only be] whole numbers [because|since|as] {why}."
WHOLE_STATED = "{what} [must be|have to be] whole numbers[, as the problem [states|says]|: the problem says so]."
BINARY_ONE = "{what} is a yes/no [choice|decision], [modelled|written] [with|as] a binary (0/1) variable."
BINARY_MANY = "{what} are yes/no [choices|decisions], [modelled|written] [with|as] binary (0/1) variables."
MIP = (
    # "Because of these" needs a plural before it, and the sentence before may name one decision (the Seventh
    # review's #25, #29, #38; the tenth session's #4): "that" reads after either
    "[So|Hence|Therefore|With [that|these integer variables]|Because of that] "
    "[this is|the model is|we [have|get]|it becomes] a mixed-integer [program|linear program][| (MIP)]."
)
LP = (
    "[Every quantity may take fractional [values|amounts]|Every quantity may be fractional|Nothing has to be a whole number"
    "|No [variable|decision] [needs|has] to be [integral|a whole number]|Fractions are [allowed|fine] everywhere]"
    "[, so|; hence|, which means] [this is|the model is|we have] a linear program[| (LP)]"
    "[|, and its optimum is [proven|certified] by LP duality]."
)

# -- no solution (infeasible) --------------------------------------------------------------------

INFEASIBLE = "[The problem is infeasible.|No plan [meets|satisfies] every requirement: the problem is infeasible.]"
DELETION_MANY = (
    "[Removing|Dropping|Taking out] the requirements one at a time and [re-solving|solving again] "
    "(a deletion filter, {tests} feasibility checks) [leaves|isolates|ends with] {count} that cannot all hold "
    "[together|at once]:"
)
DELETION_ONE = (
    "[Removing|Dropping|Taking out] the requirements one at a time and [re-solving|solving again] "
    "(a deletion filter, {tests} feasibility checks) [leaves|isolates|ends with] a single requirement that cannot "
    "be met even on its own:"
)
MINIMAL_MANY = (
    "[Dropping|Relaxing|Removing] any one of them [makes the rest satisfiable|leaves a feasible problem]"
    "[, so|; so|, which means] at least one of these [requirements|conditions] has to [change|give way]."
)
MINIMAL_ONE = (
    "[Without it|Once it is dropped] the rest of the model is [satisfiable|feasible], so this requirement itself "
    "has to [change|give way]."
)
FARKAS = (
    "[A Farkas certificate confirms it|A Farkas certificate [proves|backs] this|[LP duality|Farkas' lemma] "
    "confirms it]: [adding up|summing] the {rows} constraints, each [with|times] a suitable nonnegative "
    "[weight|multiplier], [gives|yields] an inequality that no plan can satisfy."
)

# -- what-if -------------------------------------------------------------------------------------

CHANGE = "[The change|What changes|The scenario]: {change}."
BASE_PLAN = "[Original|Base-case|Current] optimal plan (objective {objective}):"
NEW_PLAN = "[Optimal plan after the change|New optimal plan|Optimal plan under the change] (objective {objective}):"
SAME_DECISIONS = (
    "[The optimal decisions stay the same.|The plan itself does not change.|The same decisions stay optimal.]"
)
NEW_DECISIONS = "[The optimal decisions change.|The plan changes.|A different plan becomes optimal.]"
OPTIMUM_STAYS = "[The optimum stays at {value}.|The optimal value [remains|is still] {value}.]"
OPTIMUM_MOVES = (
    "[The optimum|The optimal value|The objective] {direction} from {before} to {after}, "
    "[by|a change of] {delta}{share}."
)

ROWS_EACH = (
    "[Here|In this instance|With this data|For these data] [the constraint|it] [expands to|becomes|gives] "
    "{rows}, one for each {noun}{elements}."
)
ROWS_PLAIN = (
    "[Here|In this instance|With this data|For these data] [the constraint|it] [expands to|becomes|gives] {rows}."
)

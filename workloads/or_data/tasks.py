"""The four task categories, built from one verified problem (examples: `TASKS.md`).

| category | variant | the user gives | a correct answer gives | reaches the outcome of |
| --- | --- | --- | --- | --- |
| text_to_model | model | the statement | mathematical model + LP file | the problem |
| text_to_code | code | the statement | model summary + program (pyscipopt, PuLP, Pyomo or coptpy, as asked) | the problem |
| model_to_code | translate | the mathematical model (with data), or for `LP_INPUT_SHARE` of them the LP file | program (library as asked) | the problem |
| model_to_code | repair | the model and a buggy program | diagnosis, diff, corrected program | the problem |
| solve_analyze | decision | the statement | program, the optimal decision (or why none exists) | the problem |
| solve_analyze | what_if | the statement and a parameter change | program for the changed data, comparison | the changed problem, re-solved and verified |

`Task.reference` is the answer written from the ground truth (what the programmatic teacher
says); `Task.target` is the verified problem whose outcome a correct answer must reach.
Repair needs a mutation that demonstrably changes the result and what-if needs the changed
problem to verify; when either is impossible for an instance the task falls back to translate
or decision, and `Task.fallback` says so.
"""

from __future__ import annotations

import math
import random
import re
import zlib
from dataclasses import dataclass
from math import prod as math_prod

from trex.workloads.or_data.bugs import Bug, inject_bug
from trex.workloads.or_data.certificates import Certificate, check_solution
from trex.workloads.or_data.explain import (
    element_words,
    iis_explanation,
    instance_phrase,
    key_names,
    limits_analysis,
    variable_phrase,
)
from trex.workloads.or_data.families.base import WhatIf
from trex.workloads.or_data.linear_model import LinearModel, family_of
from trex.workloads.or_data.lp_input_program import lp_input_program
from trex.workloads.or_data.math_model import MathModel
from trex.workloads.or_data.outcome import Outcome, format_objective
from trex.workloads.or_data.phrasing import FRAMINGS, capitalize, join, pick
from trex.workloads.or_data.program_runner import ProgramRunner
from trex.workloads.or_data.prose import agree, article, singular_noun
from trex.workloads.or_data.prose_check import check_texts
from trex.workloads.or_data.repair_reason import symptom_reason
from trex.workloads.or_data.row_shapes import row_shapes
from trex.workloads.or_data.solver_libraries import DISPLAY
from trex.workloads.or_data.style import AnswerParts
from trex.workloads.or_data.verify import Problem, VerificationFailed, verify_problem
from trex.workloads.or_data.what_if_limits import broken_rows, limits_taking_over
from trex.workloads.or_data.wording import (
    BASE_PLAN,
    BINARY_MANY,
    BINARY_ONE,
    BOUNDS,
    CHANGE,
    CONSTRAINT_BULLETS,
    CONSTRAINT_SENTENCE_FIRST,
    CONSTRAINT_SENTENCE_NEXT,
    CONSTRAINTS_INTRO,
    DECISIONS,
    FARKAS,
    GOAL_MAX,
    GOAL_MIN,
    INFEASIBLE,
    LP,
    MIP,
    NEW_DECISIONS,
    NEW_PLAN,
    OPTIMUM_MOVES,
    OPTIMUM_STAYS,
    ROWS_EACH,
    ROWS_PLAIN,
    SAME_DECISIONS,
    WHOLE,
    WHOLE_STATED,
    choose,
    realize,
)
from trex.workloads.or_data.worked import moved_decisions, worked_check, written_rows, written_sum

# The decision line of an optimal plan in which every variable is zero (doing nothing is optimal).
NOTHING_DONE = "Every decision variable is zero in the optimal plan: nothing needs to be done."
# Share of translate tasks whose input is the LP file instead of the mathematical model.
LP_INPUT_SHARE = 0.35
# Shares of model tasks whose input is a program (code -> model) or the statement with an LP file
# (LP -> model: the indexed model behind a flat file), instead of the statement alone.
CODE_TO_MODEL_SHARE = 0.2
LP_TO_MODEL_SHARE = 0.15
CATEGORIES = ("text_to_model", "text_to_code", "model_to_code", "solve_analyze")
VARIANTS: dict[str, tuple[str, ...]] = {
    "text_to_model": ("model",),
    "text_to_code": ("code",),
    "model_to_code": ("translate", "repair"),
    "solve_analyze": ("decision", "what_if"),
}
# Representations a task takes in and produces: text (statement), math (model), lp, code, answer.
REPRESENTATIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "model": (("text",), ("math", "lp")),
    "code": (("text",), ("math", "code")),
    "translate": (("math",), ("code",)),
    "repair": (("math", "code"), ("code",)),
    "decision": (("text",), ("math", "code", "answer")),
    "what_if": (("text",), ("math", "code", "answer")),
}


@dataclass(frozen=True)
class Task:
    id: str
    category: str
    variant: str
    prompt: str
    problem: Problem  # the generated instance
    target: Problem  # what the answer is about: the instance, or its what-if change
    reference: AnswerParts
    statement: str = ""
    bug: Bug | None = None
    what_if: WhatIf | None = None
    fallback: str = ""  # "repair->translate" when the planned variant was impossible
    source: str = ""  # the input representation when it is not the variant's usual one ("lp": an LP file to translate)

    @property
    def family(self) -> str:
        return self.problem.family.name

    @property
    def truth(self) -> Outcome:
        return self.target.outcome

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(self.source.split("+")) if self.source else REPRESENTATIONS[self.variant][0]

    @property
    def outputs(self) -> tuple[str, ...]:
        produced = REPRESENTATIONS[self.variant][1]
        return tuple(output for output in produced if output not in self.inputs)


_PROMPTS = {
    "model": (
        "{statement}\n\nFormulate a mathematical optimization model for this problem: define the sets, parameters, decision variables, objective and constraints. Then write the same model as a CPLEX LP file.",
        "Build the mathematical model (sets, parameters, variables, objective, constraints) of the problem below, and give it in LP format as well.\n\n{statement}",
        "{statement}\n\nWrite down the linear or mixed-integer programming model of this problem and its LP-file version.",
        "Model the following situation as an optimization problem. Give the formulation in mathematical notation and as an LP file.\n\n{statement}",
        "Turn this into a mathematical program. State sets, parameters, variables, objective and constraints, then give the LP file.\n\n{statement}",
        "{statement}\n\nI need a formal optimization model of this: the algebraic formulation first, then an equivalent LP file I can load into a solver.",
        "As an operations research analyst, formulate the problem below. Define every symbol you use and finish with the model in CPLEX LP format.\n\n{statement}",
        "{statement}\n\nWhat is the optimization model here? Write it algebraically and as an LP file, and report the optimal objective value.",
        "Problem:\n\n{statement}\n\nDeliverables: (1) a mathematical model with sets, parameters, decision variables, objective and constraints; (2) the same model as an LP file.",
        "Please set up the linear (or integer) program for the following case and express it as an LP file too.\n\n{statement}",
    ),
    "code": (
        "{statement}\n\nWrite a Python program using {lib} that models and solves this problem.",
        "Solve the following problem with a {lib} program.\n\n{statement}",
        "{statement}\n\nImplement an optimization model for this in Python with {lib} and report the optimal value.",
        "Here is a planning problem:\n\n{statement}\n\nFormulate it and solve it with {lib_long}.",
        "{statement}\n\nCode this up as an optimization model in Python ({lib}), run it, and tell me the optimal value.",
        "Write a complete {lib} script for the problem below. It should print the optimal objective value.\n\n{statement}",
        "Problem description:\n\n{statement}\n\nModel it and solve it in Python using {lib_long}.",
        "{statement}\n\nSketch the model, then give a runnable {lib} program that solves it.",
        "Using Python and {lib}, build and solve a model for this situation.\n\n{statement}",
    ),
    "translate": (
        "Implement the following mathematical model in Python with {lib} and solve it.\n\n{math}",
        "{math}\n\nWrite a {lib} program for this model and report its optimal objective value.",
        "Translate this optimization model into solver code ({lib}):\n\n{math}",
        "Here is a formulation:\n\n{math}\n\nCode it in {lib}, keeping the names of sets and parameters recognizable, and solve it.",
        "Convert the model below into a runnable Python script that uses {lib}.\n\n{math}",
        "{math}\n\nImplement this formulation with {lib_long} and report the optimum.",
        "Given the following algebraic model and its data, write the solver program (Python, {lib}).\n\n{math}",
        "Please turn this model into {lib} code and run it.\n\n{math}",
    ),
    "repair": (
        "The program below should implement this model, but {symptom_clause}. Find the bug and fix it.\n\n{math}\n\n```python\n{buggy}```",
        "{math}\n\nI wrote this pyscipopt program for the model above, but {symptom_clause}. What is wrong?\n\n```python\n{buggy}```",
        "Debug this pyscipopt implementation of the model that follows it; {symptom_clause}.\n\n```python\n{buggy}```\n\n{math}",
        "{math}\n\nA colleague implemented the model above as follows, but {symptom_clause}. Locate the mistake and give a corrected program.\n\n```python\n{buggy}```",
        "This code is supposed to solve the model given after it, yet {symptom_clause}. Diagnose and fix it.\n\n```python\n{buggy}```\n\n{math}",
        "Code review request: {symptom_clause}.\n\n```python\n{buggy}```\n\nThe intended model:\n\n{math}",
    ),
    "translate_lp": (
        "Here is an optimization model in CPLEX LP format:\n\n```lp\n{lp}```\n\nWrite a {lib} program that builds the same model from readable data structures and solves it.",
        "```lp\n{lp}```\n\nRe-implement this LP file as a Python program with {lib} (do not just read the file) and report the optimum.",
        "A solver file for {a_title} is given below. Translate it into a {lib} script and solve it.\n\n```lp\n{lp}```",
        "Translate the LP model below into {lib} code, with named sets and parameters instead of one variable per line.\n\n```lp\n{lp}```",
    ),
    "model_from_code": (
        "Here is a {lib} program:\n\n```python\n{program}```\n\nWrite down the mathematical model it implements (sets, parameters, variables, objective, constraints) and the same model as an LP file.",
        "```python\n{program}```\n\nWhat optimization model does this code solve? Give it in algebraic form and as a CPLEX LP file, and state the optimum.",
        "Reverse-engineer the formulation behind this script: define every symbol, then give the LP file.\n\n```python\n{program}```",
        "A colleague left this {lib} code without documentation. Write out the mathematical model it builds and an equivalent LP file.\n\n```python\n{program}```",
        "Document the model in the following solver script as an algebraic formulation with its data, plus an LP file.\n\n```python\n{program}```",
    ),
    "model_from_lp": (
        "{statement}\n\nAn LP file was written for this problem:\n\n```lp\n{lp}```\n\nGive the indexed algebraic model behind it: sets, parameters, decision variables, objective and constraints.",
        "Here is a problem and a flat LP file for it.\n\n{statement}\n\n```lp\n{lp}```\n\nRewrite the LP file as a compact mathematical model with index sets and parameters.",
        "```lp\n{lp}```\n\nThe file above models this situation:\n\n{statement}\n\nState the algebraic model (sets, parameters, variables, objective, constraints) that generates it.",
        "{statement}\n\nSomeone solved this with the LP file below. Which general model does it instantiate? Write it with sets and parameters.\n\n```lp\n{lp}```",
    ),
    "decision": (
        "{statement}\n\nSolve this problem and describe the optimal decision.",
        "{statement}\n\nWhat should be done, and what is the optimal objective value?",
        "Find the optimal plan for the following problem and explain it.\n\n{statement}",
        "{statement}\n\nWhat is the best plan? Give the decision in full and its objective value.",
        "Help me decide.\n\n{statement}\n\nSolve it and spell out what to do.",
        "{statement}\n\nRecommend a plan, backed by an optimization model, and state the optimal value.",
        "Work out the optimal decision for this situation and report it with units.\n\n{statement}",
        "{statement}\n\nFormulate, solve, and explain the resulting decision.",
    ),
    "what_if": (
        "{statement}\n\nSolve the problem. Then: {question} Re-solve with that change and compare the two results.",
        "{statement}\n\n{question} Work out the optimal plan under this change and say how the optimum moves compared with the original data.",
        "Consider this problem:\n\n{statement}\n\nScenario analysis: {question} Solve both versions and compare.",
        "{statement}\n\nSensitivity question: {question} Compare the optimal plans before and after the change.",
        "{statement}\n\nFirst find the optimum. Then answer: {question} Explain what changes in the plan and why.",
        "Here is the base case:\n\n{statement}\n\nNow suppose this: {question} How do the optimal plan and value change?",
        "{statement}\n\nManagement asks: {question} Re-optimize and explain the effect on the plan and the objective.",
    ),
}


def understanding(math: MathModel, rng: random.Random | None = None, status: str = "optimal") -> str:
    """What the problem asks and why each part of the model is there, from the model's typed
    phrases (`VarDef.noun`/`indicator`/`whole`, `ConstraintDef.why`/`technique`): the decisions,
    the goal, every constraint with its reason, and why the variables are (or need not be)
    whole numbers. `rng` picks among equivalent phrasings; `status` is the problem's outcome, and
    only an optimal LP is said to have an optimum proven by LP duality (the Seventh review's #40
    read that of an unbounded one)."""
    rng = rng or random.Random(0)
    # a "whether ..." clause runs on over whatever follows its "and" ("whether a lorry drives ... and the
    # bottles delivered so far", the Seventh review's #7, #48): noun phrases first, clauses last, each
    # clause with its own "whether"
    nouns = [f"the {variable.noun}" for variable in math.variables if not variable.indicator]
    clauses = [variable.indicator for variable in math.variables if variable.indicator]
    decisions = nouns + clauses
    goal = realize(GOAL_MIN if math.sense == "minimize" else GOAL_MAX, rng, what=math.objective_description)
    paragraphs = [f"{realize(DECISIONS, rng, x=join(decisions))} {goal}"]
    if math.constraints:
        as_list = rng.random() < 0.6
        bullet = pick(rng, CONSTRAINT_BULLETS)  # one format per list
        lines = []
        for number_, constraint in enumerate(math.constraints):
            why = choose(constraint.why, rng) if constraint.why else constraint.description
            if as_list:
                line = bullet.format(label=constraint.label, why=why)
            else:
                frame = CONSTRAINT_SENTENCE_FIRST if number_ == 0 else CONSTRAINT_SENTENCE_NEXT
                line = capitalize(realize(frame, rng, label=constraint.label.lower(), why=why))
            if constraint.technique:
                line += f" {choose(constraint.technique, rng)}"
            expansion = rows_in_words(constraint, math, rng)
            if expansion:
                line += f" {expansion}"
            lines.append(line)
        paragraphs.append(realize(CONSTRAINTS_INTRO, rng) + "\n" + "\n".join(lines) if as_list else " ".join(lines))
    else:
        paragraphs.append("No constraint links the decisions: each quantity is limited only by its own bounds.")
    if any(_has_bound(variable.symbol, variable.domain) for variable in math.variables):
        paragraphs.append(realize(BOUNDS, rng))
    integral, binary = [], []
    reasons: dict[str, list[str]] = {}  # variables that are whole for the same reason share a sentence
    for variable in math.variables:
        if r"\{0, 1\}" in variable.domain:
            indicator = variable.indicator
            if indicator.startswith("which "):  # "which jobs each machine takes" is a question, not a subject
                indicator = f"the choice of {indicator}"
            binary.append(indicator or f"the {variable.noun}")
        elif "mathbb{Z}" in variable.domain:
            reasons.setdefault(variable.whole, []).append(f"the {variable.noun}")
    for why, nouns in reasons.items():
        what = join(nouns) if len(nouns) < 3 else f"all {len(nouns)} kinds of decision quantities"
        integral.append(realize(WHOLE, rng, what=what, why=why) if why else realize(WHOLE_STATED, rng, what=what))
    sentences = []
    if binary:
        sentences.append(capitalize(realize(BINARY_ONE if len(binary) == 1 else BINARY_MANY, rng, what=join(binary))))
    sentences += [capitalize(sentence) for sentence in integral]
    sentences.append(realize(MIP, rng) if sentences else _lp_sentence(rng, status))
    paragraphs.append(" ".join(sentences))
    return agree("\n\n".join(paragraphs))


_DUALITY_CLAUSE = re.compile(r", and its optimum is (?:proven|certified) by LP duality")


def _lp_sentence(rng: random.Random, status: str) -> str:
    """The LP sentence, its duality clause kept only for a problem solved to optimality (an
    infeasible or unbounded LP has no optimum to prove; a program-input task, status "", is not
    about one). The same `rng` draws either way, so the rest of the text does not change."""
    sentence = realize(LP, rng)
    return sentence if status == "optimal" else _DUALITY_CLAUSE.sub("", sentence)


def rows_in_words(constraint, math: MathModel, rng: random.Random) -> str:
    """How a constraint family expands on this instance: "With this data it gives 3 rows, one for
    each resource (wood, labour and paint)." ("" when the sets cannot be worded plainly)."""
    try:
        sets = [math.set(symbol) for symbol in constraint.over]
    except (KeyError, ValueError, StopIteration):
        return ""
    rows = constraint.count
    if rows is None:
        rows = math_prod(len(set_def.elements) for set_def in sets) if sets else 1
    rows_text = f"{rows} {'row' if rows == 1 else 'rows'}"
    if len(sets) != 1 or rows < 2:
        return realize(ROWS_PLAIN, rng, rows=rows_text)
    set_def = sets[0]
    noun = re.split(r"[,(]", set_def.description, maxsplit=1)[0].strip()
    if "$" in noun or " of " in noun or constraint.count is not None or not noun:
        return realize(ROWS_PLAIN, rng, rows=rows_text)
    elements = ""
    if not set_def.display and len(set_def.elements) <= 8:
        # pairs are written "Inland Port → Cross-Dock Leipzig": no parenthesis inside the list's own. A pair
        # without a direction (a conflict) is "machine parts and spare tires", not an arrow,
        # and two such pairs are kept apart by semicolons (the tenth session's review, #10)
        unordered = bool(re.search(r"\bconflicting pairs\b|\bpairs of jobs\b", set_def.description))
        pairs = [e[1:-1] for e in map(str, set_def.elements) if e.startswith("(") and e.endswith(")")]
        if pairs and len(pairs) == len(set_def.elements) and unordered:
            elements = f" ({'; '.join(pair.replace(', ', ' and ', 1) for pair in pairs)})"
        else:
            listed = [
                element[1:-1].replace(", ", " → ", 1) if element.startswith("(") and element.endswith(")") else element
                for element in map(str, set_def.elements)
            ]
            elements = f" ({join(listed)})"
    return realize(ROWS_EACH, rng, rows=rows_text, noun=singular_noun(noun), elements=elements)


def lp_reading(model, target: str = "program") -> str:
    """What an LP file says, read from its own names: the objective, the variable families (with
    their kinds and bounds) and the constraint families, so an answer to an LP-input task does not
    use facts the prompt never gave."""
    from trex.workloads.or_data.linear_model import family_of

    kinds: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    bounded: set[str] = set()
    for variable in model.variables:
        family = family_of(variable.name)
        kinds.setdefault(family, set()).add(variable.kind)
        counts[family] = counts.get(family, 0) + 1
        if variable.lower > 0 or (variable.upper is not None and variable.kind != "binary"):
            bounded.add(family)
    rows: dict[str, tuple[int, set[str]]] = {}
    for row in model.rows:
        family = family_of(row.name)
        number_, senses = rows.get(family, (0, set()))
        rows[family] = (number_ + 1, senses | {row.sense})
    sample = {}
    for variable in model.variables:
        sample.setdefault(family_of(variable.name), variable.name)
    kind_words = {"binary": "binary", "integer": "whole-number", "continuous": "continuous"}
    families = []
    for family in counts:
        kinds_ = join([kind_words.get(kind, kind) for kind in sorted(kinds[family])], conjunction="or")
        noun = "variable" if counts[family] == 1 else "variables"
        named = "" if counts[family] == 1 else f", e.g. `{sample[family]}`"
        families.append(f"{counts[family]} {noun} `{family}` ({kinds_}{named})")
    objective = "minimizes" if model.sense == "minimize" else "maximizes"
    text = f"The LP file {objective} a linear objective over {join(families)}. "
    if rows:
        row_parts = []
        for family, (number_, senses) in rows.items():
            sense_words = join(
                [{"<=": "at-most", ">=": "at-least", "==": "equality"}.get(sense, sense) for sense in sorted(senses)]
            )
            row_parts.append(f"{number_} {sense_words} {'row' if number_ == 1 else 'rows'} named `{family}`")
        text += f"Under Subject To it has {join(row_parts)}. "
    else:
        text += "Its Subject To section is empty: no row links the variables, only their bounds limit them. "
    text += (
        "Each name before the double underscore becomes one indexed variable or one loop of constraints in the program"
        if target == "program"
        else "Each name before the double underscore becomes one indexed variable or one indexed constraint of the "
        "algebraic model"
    ) + ", with the keys taken from the names after it."
    if bounded:
        text += f" The Bounds section limits {join([f'`{family}`' for family in sorted(bounded)])}; these become the bounds of those variables in the {target}."
    binary = sorted(family for family, found in kinds.items() if "binary" in found)
    general = sorted(family for family, found in kinds.items() if "integer" in found)
    if binary or general:
        sections = [
            f"{join([f'`{f}`' for f in names])} in the {section} section"
            for names, section in ((binary, "Binary"), (general, "General"))
            if names
        ]
        text += f" The file lists {join(sections)}, so this is a mixed-integer program."
    else:
        text += " No variable is listed under General or Binary, so this is a linear program."
    shapes = row_shapes(model)
    if shapes:  # what the rows do, not only how many there are (the Sixth review's mechanical readings)
        text += "\n\nWhat each family of rows says, read from its coefficients alone:\n\n" + "\n".join(
            f"- {line}" for line in shapes
        )
    return text


_INNER_PARENTHESIS = re.compile(r" [(]([^()]*)[)]")
_AS_CLAUSE = r", \1"


def code_reading(problem: Problem, rng: random.Random) -> str:
    """What a program says, read from its own names and comments (the program is the whole prompt
    of a code -> model task): the variables it declares, the constraint blocks it adds, the
    objective, and the variable types that make it an LP or a MIP."""
    program = problem.program
    declared = re.findall(r"^(\w+) = (?:\{|\[|pulp\.LpVariable|\w+\.addVar|\w+\.\w+$)", program, re.M)
    declared = [name for name in dict.fromkeys(declared) if name not in ("model", "mdl", "prob", "scip_model")]
    comments = dict(re.findall(r"^# (\w+): (.+)$", program, re.M))
    variable_families = {family_of(v.name) for v in problem.model.variables}
    variables = [f"`{name}`" for name in declared if name in variable_families]
    # every constraint family of the model is a block of the program, whether or not a data dictionary
    # shares its name (`capacity` is both a parameter and the rows `capacity[t]`): none is left out
    blocks = []
    for name in dict.fromkeys(family_of(row.name) for row in problem.model.rows):
        text = comments.get(name)
        blocks.append(
            f"`{name}` ({_INNER_PARENTHESIS.sub(_AS_CLAUSE, text.rstrip('.'))})"  # no parenthesis inside another
            if text
            else f"`{name}`"
        )
    sense = "minimizes" if problem.model.sense == "minimize" else "maximizes"
    # only what the program says: a unit in parentheses ("total cost (USD)") the program never names is dropped
    objective = re.sub(
        r" \(([^()]*)\)",
        lambda match: match.group(0) if match.group(1).lower() in program.lower() else "",
        problem.math.objective_description,
    )
    parts = [
        f"The program's data block holds the sets and parameters; the model {sense} the {objective} over the "
        f"variables {join(variables) or 'it declares'}."
    ]
    if blocks:
        parts.append(
            f"Its constraint blocks, named by its comments, are {join(blocks)}; each loop becomes one indexed "
            "constraint family, and each dictionary of the data block one indexed parameter."
        )
    kinds = {variable.kind for variable in problem.model.variables}
    whole = sorted({family_of(v.name) for v in problem.model.variables if v.kind in ("integer", "binary")})
    if whole:  # the reason first: which declarations make it a MIP ("Because of that" needs a "that")
        keyword = next((word for word in ("vtype", "cat", "within", "domain") if f"{word}=" in program), "")
        parts.append(
            f"The program declares {join([f'`{name}`' for name in whole])} with an integer or binary type"
            + (f" (its `{keyword}=` argument)." if keyword else ".")
        )
    parts.append(realize(MIP, rng) if kinds & {"integer", "binary"} else _lp_sentence(rng, ""))
    return agree(" ".join(parts))


_DEFINITION_UNIT = re.compile(r"(?m)^(- \$[^\n]*?) \(([^()\n]*)\)")


def program_units_only(math_text: str, program: str) -> str:
    """The model written for a program-input task, without a unit the program never names: a
    definition's short parenthesis ("(USD)", "(pallets)") stays only when one of its words occurs in
    the program (its names, comments or strings), so the answer does not bring in the story's
    currency (the Sixth review's #18, #28). Longer notes ("(table below)", "(– = not qualified)")
    are kept."""
    known = set(re.findall(r"[a-z]{3,}", program.lower()))

    def keep(match: re.Match) -> str:
        words = re.findall(r"[a-z]{3,}", match.group(2).lower())
        unit_like = 0 < len(match.group(2).split()) <= 3 and "table" not in words and "–" not in match.group(2)
        if unit_like and words and not any(word in known or word.rstrip("s") in known for word in words):
            return match.group(1)
        return match.group(0)

    previous = None
    while previous != math_text:  # a line may carry more than one such parenthesis
        previous, math_text = math_text, _DEFINITION_UNIT.sub(keep, math_text)
    return math_text


def _has_bound(symbol: str, domain: str) -> bool:
    """Whether a variable's domain carries a bound given by a parameter (a minimum or a cap),
    not just nonnegativity or integrality: anything named in it besides the variable itself."""
    rest = re.sub(r"\\[a-zA-Z]+(?:\{[^}]*\})?", " ", domain).replace(symbol, " ")
    return bool(re.search(r"[a-zA-Z]", rest))


def lp_plan(problem: Problem) -> tuple[str, ...]:
    """The optimal plan in the LP file's own names, for a task whose only input is the LP file.

    The file has variable names and coefficients, no nouns and no units: "Start the bracket order
    ...; it finishes after 2 hours" states facts the prompt never gave (the Sixth review's #17).
    Each nonzero variable is given with its value, in the file's order; a binary at 1 is "chosen".
    The story's plan lines remain for the tasks whose prompt tells the story."""
    lines = []
    for variable in problem.model.variables:
        value = problem.values.get(variable.name, 0.0)
        if abs(value) <= 1e-6:
            continue
        shown = format_objective(value)
        if variable.kind == "binary":
            lines.append(f"`{variable.name}` = {shown} (binary: chosen)")
        else:
            lines.append(f"`{variable.name}` = {shown}")
    if lines:
        rest = len(problem.model.variables) - len(lines)
        lines.append(
            "The file's one other variable is zero."
            if rest == 1
            else f"The file's other {rest} variables are all zero."
            if rest
            else "No variable of the file is zero."
        )
    return tuple(lines)


def no_solution_explanation(problem: Problem) -> str:
    """Why an infeasible or unbounded problem has no optimal solution: the clashing
    requirements (an IIS, computed by a deletion filter) or the improving direction, in words,
    with the checked certificate behind the claim."""
    certificate: Certificate | None = problem.certificate
    note = problem.note[:1].upper() + problem.note[1:] if problem.note else ""
    rng = _wording_rng(problem)
    if problem.status == "infeasible":
        parts = [f"{realize(INFEASIBLE, rng)} {note}.".replace("..", ".").replace(". .", ".")]
        clash = _cached(problem, "iis", lambda: iis_explanation(problem.model, problem.math, rng))
        if clash:
            parts.append(clash)
        families = sorted({family_of(row) for row in (certificate.rows if certificate else {})})
        if families:
            parts.append(realize(FARKAS, rng, rows=join([f"`{name}`" for name in families])))
        return agree("\n\n".join(parts))
    ray = certificate.ray if certificate else {}
    grouped: dict[str, list[str]] = {}
    specific: list[str] = []
    for name in sorted(ray)[:6]:
        what, whom = element_words(name, problem.math)
        phrase = instance_phrase(what.removeprefix("the "), name, problem.math) if whom else None
        if phrase is not None and phrase != what.removeprefix("the "):
            specific.append(f"the {phrase}")  # "the tons of solvent A to make per month"
        else:
            grouped.setdefault(what, []).append(whom)
    moves = specific + [_ray_group(what, whoms) for what, whoms in grouped.items()]
    return agree(
        f"The problem is unbounded. {note}. Starting from any feasible plan, increasing {join(moves)} "
        + ("together (in a fixed proportion) " if len(ray) > 1 else "alone ")
        + "keeps every constraint satisfied and improves the objective without limit, "
        "so no plan is optimal: the model lacks a limit the real situation has."
    ).replace("..", ".")


def _ray_group(what: str, whoms: list[str]) -> str:
    """The decisions of one family that an unbounded ray increases, in one phrase: the elements
    take the place of the description's "each <noun>" ("the amount (million dollars) to put into
    corporate bonds and real estate"), not pasted after it ("the amount ... to put into each option
    for corporate bonds", the Seventh review's #9, #40)."""
    what = what.removeprefix("the ")
    named = [whom for whom in whoms if whom]
    if not named:
        return f"the {what}"
    general = re.search(r"\beach [a-z-]+", what)
    if general is not None and all(", " not in whom for whom in named):
        return f"the {what[: general.start()]}{join(named)}{what[general.end() :]}"
    return f"the {what} for {join(named)}"


def lp_no_solution_explanation(problem: Problem) -> str:
    """`no_solution_explanation` for a task whose only input is the LP file: the reason in the
    file's own names and numbers (rows, bounds, objective coefficients), never in the story's words
    or data the file does not give (the Fifth review: rates, units and goods invented for #3, #33,
    #44, #47)."""
    from trex.workloads.or_data.iis import deletion_filter

    model = problem.model
    certificate: Certificate | None = problem.certificate
    rng = _wording_rng(problem)
    if problem.status == "infeasible":
        parts = ["The LP file's constraints cannot all hold at once, so it has no feasible point."]
        found = _cached(problem, "lp_iis", lambda: deletion_filter(model))
        if found is not None and found.elements:
            rows = {row.name: row for row in model.rows}
            lines = []
            for element in found.elements[:8]:
                if element.kind == "row" and element.name in rows:
                    row = rows[element.name]
                    terms = " + ".join(f"{format_objective(coef)} {name}" for name, coef in row.terms[:10])
                    more = f" + {len(row.terms) - 10} more terms" if len(row.terms) > 10 else ""
                    sense = {"==": "="}.get(row.sense, row.sense)  # as the LP file writes it
                    lines.append(
                        f"- `{element.name}`: {terms}{more} {sense} {format_objective(row.rhs)}".replace("+ -", "− ")
                    )
                else:
                    side = "lower" if element.kind == "lower" else "upper"
                    lines.append(
                        f"- the {side} bound {element.sense} {format_objective(element.value)} of `{element.name}`"
                    )
            more = f"\n- ... and {len(found.elements) - 8} more" if len(found.elements) > 8 else ""
            count = len(found.elements)
            parts.append(
                f"A deletion filter ({found.tests} feasibility solves) keeps {count} "
                f"{'requirement' if count == 1 else 'requirements'} of the file that already clash"
                + (
                    " and drops every other one; removing any one of these makes the rest feasible"
                    if found.irreducible
                    else ""
                )
                + ":\n\n"
                + "\n".join(lines)
                + more
            )
        families = sorted({family_of(row) for row in (certificate.rows if certificate else {})})
        if families:
            parts.append(realize(FARKAS, rng, rows=join([f"`{name}`" for name in families])))
        return "\n\n".join(parts)
    ray = certificate.ray if certificate else {}
    if not ray:
        return "The LP is unbounded: the solver found an improving direction that no row or bound stops."
    costs = dict(model.objective)
    names = sorted(ray)[:6]
    in_rows = {name for row in model.rows for name, _ in row.terms}
    direction = "raises" if model.sense == "maximize" else "lowers"
    moves = join([f"`{name}` (objective coefficient {format_objective(costs.get(name, 0.0))})" for name in names])
    more = f" and {len(ray) - len(names)} more" if len(ray) > len(names) else ""
    gain = math.fsum(costs.get(name, 0.0) * step for name, step in ray.items())
    free = [name for name in names if name not in in_rows]
    one = len(free) == 1
    if not model.rows:
        why = "the file has no rows at all, and none of these variables has an upper bound in the Bounds section"
    elif free and len(free) == len(names):
        why = f"{join([f'`{n}`' for n in free])} {'appears' if one else 'appear'} in no row and {'has' if one else 'have'} no upper bound"
    elif free:
        why = (
            f"{join([f'`{n}`' for n in free])} {'appears' if one else 'appear'} in no row, the rows of the others stay "
            "satisfied along this direction, and no bound stops them"
        )
    else:
        why = "every row they appear in stays satisfied along this direction, and no bound stops them"
    return agree(
        f"The LP is unbounded. Increasing {moves}{more} "
        + ("together, in the proportion of the solver's improving direction, " if len(ray) > 1 else "alone ")
        + f"keeps every constraint satisfied, because {why}; one step along that direction {direction} the objective "
        f"by {format_objective(abs(gain))}, so the objective has no limit and no point is optimal."
    )


def _wording_rng(problem: Problem) -> random.Random:
    """A wording stream fixed by the instance (its LP file), so the same problem reads the same."""
    return random.Random(zlib.crc32(problem.lp.encode("utf-8")))


def _cached(problem: Problem, key: str, compute):
    store = problem.__dict__.setdefault("_explanations", {})
    if key not in store:
        store[key] = compute()
    return store[key]


def _plan_block(title: str, problem: Problem, rng: random.Random) -> str:
    lines = problem.decisions()
    shown = "\n".join(f"- {line}" for line in lines[:12]) + ("\n- ..." if len(lines) > 12 else "")
    return f"{realize(title, rng, objective=problem.outcome.text())}\n\n{shown or '- nothing is done'}"


def _as_old_options(base: Problem, changed: Problem) -> dict[str, float]:
    """The new plan under the old model's names, for a decision-by-decision comparison: by name when
    the change keeps the options, by content (`same_options`) when it re-enumerates them, so that
    a renumbered pattern is not compared with a different one; options of only one model are left out."""
    if {v.name for v in base.model.variables} == {v.name for v in changed.model.variables}:
        return changed.values
    return {old: changed.values.get(new, 0.0) for old, new in same_options(base.model, changed.model).items()}


def what_if_analysis(base: Problem, changed: Problem, what_if: WhatIf) -> str:
    """Base plan, new plan and why the optimum moved (or did not)."""
    rng = _wording_rng(changed)
    change = what_if.change or (
        f"`{what_if.parameter}` goes from {format_objective(what_if.old)} to {format_objective(what_if.new)}"
    )
    blocks = [realize(CHANGE, rng, change=change), _plan_block(BASE_PLAN, base, rng)]
    if changed.outcome.status != "optimal":
        blocks.append(
            f"After the change the problem becomes {changed.outcome.status}. {no_solution_explanation(changed)}"
        )
        return "\n\n".join(blocks)
    blocks.append(_plan_block(NEW_PLAN, changed, rng))
    before, after = base.outcome.objective, changed.outcome.objective
    assert before is not None and after is not None
    delta = after - before
    same_plan = base.decisions() == changed.decisions() or _nonzero(base.values) == _nonzero(changed.values)
    if abs(delta) <= 1e-9 * (1 + abs(before)):
        movement = realize(OPTIMUM_STAYS, rng, value=changed.outcome.text())
    else:
        share = f" ({abs(delta) / abs(before) * 100:.1f}%)" if before else ""
        movement = realize(
            OPTIMUM_MOVES,
            rng,
            direction=pick(rng, ("rises", "goes up", "increases") if delta > 0 else ("falls", "goes down", "drops")),
            before=base.outcome.text(),
            after=changed.outcome.text(),
            delta=format_objective(abs(delta)),
            share=share,
        )
    reason = (
        _structural_reason(base, changed, same_plan)
        if what_if.change
        else _what_if_reason(base, changed, delta, same_plan)
    )
    plan = realize(SAME_DECISIONS if same_plan else NEW_DECISIONS, rng)
    blocks.append(" ".join(part for part in (movement, plan, reason) if part))
    moved = (
        ""
        if same_plan
        else moved_decisions(
            base.model, base.values, _as_old_options(base, changed), base.math, changed.model.objective
        )
    )
    if moved:
        blocks.append(moved)
    return "\n\n".join(blocks)


def _structural_reason(base: Problem, changed: Problem, same_plan: bool) -> str:
    """Why a structural change (an option removed) moved the optimum or not: whether the original
    plan used what was removed, and that removing options can only keep or worsen the optimum."""
    kept_names = {variable.name for variable in changed.model.variables}
    removed = [variable.name for variable in base.model.variables if variable.name not in kept_names]
    used = [name for name in removed if abs(base.values.get(name, 0.0)) > 1e-6]
    worse = "higher" if base.model.sense == "minimize" else "lower"
    if not used:
        return (
            "The original plan did not use the removed option, so it is still feasible and still optimal: "
            "taking away an option the optimum does not use cannot change it."
        )
    words = []
    for name in used[:3]:
        what, whom = element_words(name, base.math)
        specific = instance_phrase(what.removeprefix("the "), name, base.math) if whom else None
        if specific is not None and specific != what.removeprefix("the "):
            about = specific  # "units of tables to make"
        else:  # the general description next to an element reads as a seam: the element alone
            about = whom or what.removeprefix("the ")
        words.append(f"`{name}` ({about}) was {format_objective(base.values[name])}")
    shown = join(words)
    return (
        f"The original plan used the removed option: {shown}. That plan is no longer feasible, so the volume has to "
        f"move to the next-best options; with fewer options the optimum can only stay or get {worse}"
        + (", and here the same decisions remain possible." if same_plan else ".")
    )


def _limits(problem: Problem) -> str:
    """`explain.limits_analysis` of an optimal plan (dual values when the certificate is an LP
    dual), "" otherwise."""
    if problem.status != "optimal" or not problem.values:
        return ""
    certificate = problem.certificate
    duals = None
    if certificate is not None and certificate.kind == "dual":
        sign = 1.0 if problem.model.sense == "minimize" else -1.0
        duals = {name: sign * value for name, value in certificate.rows.items()}
    least = problem.family.least_reason(problem.data, problem.values)
    return limits_analysis(problem.model, problem.math, problem.values, _wording_rng(problem), duals, least)


def _check(problem: Problem) -> str:
    """`worked.worked_check` of an optimal plan (reduced costs when the certificate is an LP dual),
    "" otherwise."""
    if problem.status != "optimal" or not problem.values or problem.outcome.objective is None:
        return ""
    certificate = problem.certificate
    duals = certificate.rows if certificate is not None and certificate.kind == "dual" else None
    rng = random.Random(zlib.crc32(problem.lp.encode("utf-8")) ^ 0x5EED)  # its own stream: other sections keep theirs
    return worked_check(problem.model, problem.math, problem.values, problem.outcome.objective, rng, duals)


def _nonzero(values: dict[str, float]) -> dict[str, float]:
    return {name: round(value, 6) for name, value in values.items() if abs(value) > 1e-6}


def same_options(base: LinearModel, changed: LinearModel) -> dict[str, str]:
    """Old decision -> the new decision with the same column (kind and coefficient in every row,
    rows matched by name; the objective coefficient may differ, a what-if can move it), the same
    name first. Names alone do not carry an option across a change that re-enumerates the options:
    a cutting-stock program numbers its maximal patterns for the new bar length afresh, so `cut__p5`
    is 3A+B+D at 700 cm and 4A+B+D at 800 cm (the Seventh review's #12)."""

    def columns(model: LinearModel) -> dict[str, tuple]:
        column: dict[str, list[tuple[str, float]]] = {variable.name: [] for variable in model.variables}
        for row in model.rows:
            for name, coef in row.terms:
                column[name].append((row.name, round(coef, 9)))
        kinds = {variable.name: variable.kind for variable in model.variables}
        return {name: (kinds[name], tuple(sorted(terms))) for name, terms in column.items()}

    old, new = columns(base), columns(changed)
    by_content: dict[tuple, list[str]] = {}
    for name, key in new.items():
        by_content.setdefault(key, []).append(name)
    matched: dict[str, str] = {}
    taken: set[str] = set()
    for name, key in old.items():
        if new.get(name) == key:
            matched[name] = name
            taken.add(name)
    for name, key in old.items():
        if name not in matched:
            free = [other for other in by_content.get(key, []) if other not in taken]
            if free:
                matched[name] = free[0]
                taken.add(free[0])
    return matched


def _options_reason(base: Problem, changed: Problem) -> str:
    """Why the optimum moved when the change adds or removes decision options (a longer job has
    fewer start slots, a larger capacity other patterns): whether the original choices are still
    allowed and still chosen, and, when they are, which of their coefficients moved the optimum.
    Options are matched by content (`same_options`), not by name."""
    match = same_options(base.model, changed.model)
    new_names = {v.name for v in changed.model.variables}
    gone = len(base.model.variables) - len(match)
    added = len(new_names - set(match.values()))
    options = join(
        [
            text
            for count, text in ((gone, f"removes {gone} of the old options"), (added, f"adds {added} new options"))
            if count
        ]
    )
    chosen_old = sorted(name for name, value in base.values.items() if abs(value) > 1e-6)
    lost = [name for name in chosen_old if name not in match]
    carried = {name: 0.0 for name in new_names}  # a new option is not taken by the old plan
    carried.update({match[name]: base.values[name] for name in chosen_old if name in match})
    if lost:
        shown = join([variable_phrase(name, base.math) for name in lost[:3]]) + (
            f" and {len(lost) - 3} more" if len(lost) > 3 else ""
        )
        why = (
            f"{len(lost)} of the original plan's decisions ({shown}) {'has' if len(lost) == 1 else 'have'} no "
            "counterpart with the same coefficients among the new options"
        )
        return f"The change {options}; {why}, so the plan has to be re-optimized from the new options."
    if not check_solution(changed.model, carried).feasible:
        return (
            f"The change {options}; the original plan, carried over option by option, breaks a limit of the new "
            "data, so the plan has to be re-optimized from the new options."
        )
    chosen = sorted(match[name] for name in chosen_old)
    same_choices = chosen == sorted(name for name, value in changed.values.items() if abs(value) > 1e-6)
    old_costs, new_costs = dict(base.model.objective), dict(changed.model.objective)
    moved = [name for name in chosen_old if abs(old_costs.get(name, 0.0) - new_costs.get(match[name], 0.0)) > 1e-9]
    if not moved:
        return f"The change {options}, but the original plan is still allowed and " + (
            "still optimal, and none of its decisions changes its coefficient."
            if same_choices
            else "another plan of the new options does better."
        )
    terms_old, _ = written_sum([(name, old_costs.get(name, 0.0)) for name in moved], base.values, base.math)
    terms_new, _ = written_sum([(name, new_costs.get(match[name], 0.0)) for name in moved], base.values, base.math)
    old_part = math.fsum(old_costs.get(name, 0.0) * base.values[name] for name in moved)
    new_part = math.fsum(new_costs.get(match[name], 0.0) * base.values[name] for name in moved)
    text = (
        f"The change {options}, but every decision of the original plan is still allowed"
        + f". What moves the objective is the coefficient of the chosen decisions: {terms_old} = "
        f"{format_objective(old_part)} before, {terms_new} = {format_objective(new_part)} after"
    )
    kept = changed.model.objective_value(carried)
    if same_choices:
        return text + "."
    return text + (
        f"; the original choices would now score {format_objective(kept)}, and re-optimizing reaches "
        f"{changed.outcome.text()}."
    )


def _what_if_reason(base: Problem, changed: Problem, delta: float, same_plan: bool) -> str:
    """Why the optimum moved: the changed row's shadow price (LP) or whether it was binding,
    or for a changed objective coefficient what keeping the old plan would have given."""
    new_rows = {row.name: row for row in changed.model.rows}

    def slack_of(row) -> float:
        activity = row.activity(base.values)
        return row.rhs - activity if row.sense == "<=" else activity - row.rhs if row.sense == ">=" else 0.0

    # a change that moves several right-hand sides is explained by the row the plan presses against
    moved = sorted(
        (row for row in base.model.rows if row.name in new_rows and new_rows[row.name].rhs != row.rhs),
        key=lambda row: max(slack_of(row), 0.0),
    )
    for row in moved:
        other = new_rows[row.name]
        step = other.rhs - row.rhs
        what, whom = element_words(row.name, base.math)
        label = f"{what.lower()} limit" + (f" for {whom}" if whom else "")
        activity = row.activity(base.values)
        slack = row.rhs - activity if row.sense == "<=" else activity - row.rhs if row.sense == ">=" else 0.0
        if base.certificate is not None and base.certificate.kind == "dual":
            multiplier = base.certificate.rows.get(row.name, 0.0)
            price = multiplier if base.model.sense == "minimize" else -multiplier
            if abs(price) < 1e-9:
                return (
                    f"The {label} had slack in the original plan ({format_objective(max(slack, 0.0))} unused), so its shadow price "
                    "is 0 and the change does not move the optimum."
                    if abs(delta) < 1e-9
                    else f"The {label} had a shadow price of 0 in the original plan, but the change is larger than its slack, so another plan takes over."
                )
            predicted = price * step
            agree_ = abs(predicted - delta) <= 1e-6 * (1 + abs(delta))
            return (
                f"The {label} is binding in the original plan, with a shadow price (dual value) of {format_objective(price)} per unit: "
                f"changing it by {format_objective(step)} predicts a change of {format_objective(predicted)} in the optimum"
                + (
                    ", which is what re-solving gives (the same constraints stay binding)."
                    if agree_
                    else f"; re-solving gives {format_objective(delta)}, so the change is large enough that another "
                    + (
                        f"limit takes over: {over}."
                        if (over := _taking_over(base, changed, {row.name}))
                        else "limit takes over."
                    )
                )
            )
        if slack > 1e-6 and abs(delta) < 1e-9:
            return (
                f"The {label} had {format_objective(slack)} unused in the original plan, so the change does not bind."
            )
        if row.sense == "==":  # an equation is not "used to the full": every plan must meet its new value
            return f"The {label} is an equation that every plan must meet exactly, so the plan has to follow " + (
                "its new value; here the change is absorbed without changing the optimum."
                if abs(delta) < 1e-9
                else "its new value, and the optimum moves with it."
            )
        if slack <= 1e-6 and abs(delta) < 1e-9:  # binding, yet the optimum stays: say so, claim no forced change
            return f"The {label} was used to the full in the original plan, " + (
                "but the same decisions still meet it after the change, so the optimum does not move."
                if same_plan
                else "but another plan of the same value meets it after the change, so the optimum does not move."
            )
        new_slack = other.rhs - activity if row.sense == "<=" else activity - other.rhs
        if new_slack < -1e-6 * (1 + abs(other.rhs)):  # the change cuts off the original plan
            side = "more than" if row.sense == "<=" else "less than"
            return (
                f"The original plan used {format_objective(activity)} of the {label}, {side} the new limit of "
                f"{format_objective(other.rhs)}"
                + (f" ({format_objective(slack)} was unused before)" if slack > 1e-6 else "")
                + ", so it is no longer feasible and the plan has to change."
            )
        if slack <= 1e-6:
            return f"The {label} was used to the full in the original plan, so changing it forces the plan to adapt."
        over = _taking_over(base, changed, set())  # the changed row too: the better plan may fill its new room
        return (
            f"The {label} had {format_objective(slack)} unused in the original plan and the original plan still meets "
            "the new limit, but with whole-number decisions the extra room admits a better combination"
            + (f", one that meets {over}." if over else ".")
        )
    if {v.name for v in base.model.variables} != {v.name for v in changed.model.variables}:
        return _options_reason(base, changed)
    rows_changed = [
        row.name for row in base.model.rows if row.name in new_rows and new_rows[row.name].terms != row.terms
    ]
    if rows_changed:
        check = check_solution(changed.model, base.values)
        what, whom = element_words(rows_changed[0], base.math)
        where = f"{what.lower()}" + (f" for {whom}" if whom else "")
        if len(rows_changed) > 1:  # not "the capacity for truck 1 constraint" when all 5 capacity rows change
            families = {family_of(name) for name in rows_changed}
            where = f"{len(rows_changed)} {what.lower()}" if len(families) == 1 else f"{len(rows_changed)}"
        noun = "constraint" if len(rows_changed) == 1 else "constraints"
        if check.feasible:
            kept = changed.model.objective_value(base.values)
            return (
                f"The change alters coefficients of the {where} {noun}; the original plan still satisfies {'it' if noun == 'constraint' else 'them'} and would score "
                f"{format_objective(kept)}, "
                + (
                    "which is still optimal."
                    if same_plan
                    else "which is still optimal (re-optimizing finds another plan of the same value)."
                    if abs(kept - changed.outcome.objective) <= 1e-6 * (1 + abs(kept))
                    else f"but re-optimizing reaches {changed.outcome.text()}."
                )
            )
        broken = broken_rows(changed.model, base.values, rows_changed, base.math)
        return (
            f"The change alters coefficients of the {where} {noun}, and the original plan no longer satisfies "
            + (f"{'it' if noun == 'constraint' else 'them'}" if not broken else f"them: it breaks {broken}")
            + ", so the plan has to change."
        )
    new_variables = {variable.name: variable for variable in changed.model.variables}
    for variable in base.model.variables:
        other = new_variables.get(variable.name)
        if other is None or (other.lower, other.upper) == (variable.lower, variable.upper):
            continue
        level = base.values.get(variable.name, 0.0)
        subject = variable_phrase(variable.name, base.math)
        at_bound = (variable.upper is not None and abs(level - variable.upper) < 1e-6) or abs(
            level - variable.lower
        ) < 1e-6
        if at_bound and (variable.lower > 0 or variable.upper is not None):
            return _bound_reason(base, changed, variable.name, other, subject, level)
        return (
            f"In the original plan {subject} is {format_objective(level)}, strictly inside its bounds, so the bound change "
            + (
                "leaves the optimum where it was."
                if abs(delta) < 1e-9
                else "matters only because the new bound cuts off that level."
            )
        )
    old_costs, new_costs = dict(base.model.objective), dict(changed.model.objective)
    changes = [
        (name, old_costs.get(name, 0.0), new_costs.get(name, 0.0))
        for name in sorted(set(old_costs) | set(new_costs))
        if old_costs.get(name, 0.0) != new_costs.get(name, 0.0)
    ]
    if not changes:
        return ""
    kept = math.fsum((new - old) * base.values.get(name, 0.0) for name, old, new in changes)
    if len(changes) == 1:
        name, old, new = changes[0]
        level = base.values.get(name, 0.0)
        subject = variable_phrase(name, base.math)
        used = f"The changed coefficient multiplies {subject}, which is {format_objective(level)} in the original plan"
        upper = base.model.variable(name).upper
        better = delta * (1 if base.model.sense == "maximize" else -1) >= 0
        if upper is not None and level > 0 and abs(level - upper) <= 1e-6 * (1 + abs(upper)) and better:
            used += f", already at its upper bound of {format_objective(upper)}"  # more of it is not possible (#50)
        arithmetic = f"{format_objective(new - old)} × {format_objective(level)} = {format_objective(kept)}"
    else:
        used = f"The changed coefficient appears on {len(changes)} variables"
        arithmetic = f"the coefficient change times their original levels, {format_objective(kept)}"
    if same_plan:
        return f"{used}; the plan stays optimal, so the optimum moves by exactly {arithmetic}."
    return (
        f"{used}; keeping the original plan would change the objective by {arithmetic}, but re-optimizing finds a plan that does "
        f"at least as well ({format_objective(delta)} in total), so the plan changes."
    )


def _taking_over(base: Problem, changed: Problem, skip: set[str]) -> str:
    """`what_if_limits.limits_taking_over` of a what-if's two plans, in the base model's words."""
    return limits_taking_over(
        base.model, changed.model, base.values, _as_old_options(base, changed) or changed.values, base.math, skip
    )


def _bound_reason(base: Problem, changed: Problem, name: str, other, subject: str, level: float) -> str:
    """A moved bound that held the original plan: how far the new plan follows it, and which limits
    the new plan meets that the original one had room on (the Seventh review's #8: the bound moved
    by 17 and the optimum by 6, because the arcs feeding it reach their capacity)."""
    head = f"In the original plan {subject} is at its bound, {format_objective(level)}"
    old = base.model.variable(name)
    new_bound = other.upper if other.upper != old.upper and other.upper is not None else other.lower
    new_level = changed.values.get(name, 0.0)
    over = _taking_over(base, changed, {name})
    if abs(new_level - new_bound) <= 1e-6 * (1 + abs(new_bound)):
        return f"{head}, and the new plan follows the bound to {format_objective(new_level)}" + (
            f"; it also meets {over}, where the original plan had room." if over else ", so the plan moves with it."
        )
    return (
        f"{head}; the new plan moves it only to {format_objective(new_level)}, short of the new bound of "
        f"{format_objective(new_bound)}"
        + (f", because it now meets {over}." if over else ", because other limits stop it first.")
    )


def build_task(
    task_id: str,
    problem: Problem,
    category: str,
    variant: str,
    *,
    text_rng: random.Random,
    task_rng: random.Random,
    runner: ProgramRunner,
) -> Task:
    """The task `category`/`variant` on `problem`, with its reference answer (see the module
    docstring for the fallbacks). Raises `VerificationFailed("prose", ...)` when the prompt or
    the reference answer trips the prose checker (`prose_check`), naming the flags."""
    task = _build_task(task_id, problem, category, variant, text_rng=text_rng, task_rng=task_rng, runner=runner)
    flags = check_texts([task.prompt, *_reference_texts(task.reference)])
    if flags:
        raise VerificationFailed("prose", "; ".join(str(flag) for flag in flags[:5]))
    return task


def _without_framing(statement: str) -> str:
    first, _, rest = statement.partition("\n\n")
    return rest if first in FRAMINGS and rest else statement


def _reference_texts(parts: AnswerParts) -> list[str]:
    program = f"```python\n{parts.program}\n```" if parts.program else ""
    return [
        parts.reasoning,
        parts.math,
        parts.diagnosis,
        parts.explanation,
        parts.analysis,
        parts.check,
        program,
        "\n".join(parts.decisions),
    ]


def _build_task(
    task_id: str,
    problem: Problem,
    category: str,
    variant: str,
    *,
    text_rng: random.Random,
    task_rng: random.Random,
    runner: ProgramRunner,
) -> Task:
    if variant not in VARIANTS[category]:
        raise ValueError(f"task {category!r} has no variant {variant!r}; valid: {', '.join(VARIANTS[category])}")
    statement = problem.statement(text_rng)
    math_full = problem.math.to_markdown(with_data=True)
    math_brief = problem.math.to_markdown(with_data=False)
    written = written_rows(problem.model, problem.math)  # the general model next to this instance's rows
    answer_full = f"{math_full.rstrip()}\n\n{written}\n" if written else math_full
    answer_brief = f"{math_brief.rstrip()}\n\n{written}\n" if written else math_brief
    base_parts = dict(reasoning=understanding(problem.math, text_rng, problem.outcome.status), outcome=problem.outcome)

    if variant == "repair":
        bug = inject_bug(problem.program, problem.outcome, task_rng, runner) if problem.status == "optimal" else None
        if bug is not None:
            symptom_clause = pick(task_rng, (f"when I run it {bug.symptom}", "its result is wrong", f"{bug.symptom}"))
            prompt = pick(task_rng, _PROMPTS["repair"]).format(
                math=math_full, buggy=bug.buggy, symptom_clause=symptom_clause
            )
            reason = symptom_reason(bug, problem.model, problem.math, random.Random(zlib.crc32(bug.buggy.encode())))
            parts = AnswerParts(
                diagnosis=f"{bug.diagnosis} When it runs, {bug.symptom}." + (f"\n\n{reason}" if reason else ""),
                diff=bug.diff(),
                program=problem.program,
                outcome=problem.outcome,
            )
            return Task(task_id, category, variant, prompt, problem, problem, parts, bug=bug)
        variant, fallback = "translate", "repair->translate"
    elif variant == "what_if":
        what_if, changed = _what_if_change(problem, task_rng, runner) if problem.status == "optimal" else (None, None)
        if changed is not None and what_if is not None:
            template = pick(task_rng, _PROMPTS["what_if"])
            if not template.startswith("{"):
                statement = _without_framing(statement)
            prompt = template.format(statement=statement, question=agree(what_if.question))
            parts = AnswerParts(
                reasoning=base_parts["reasoning"],
                math=answer_brief,
                program=changed.program,
                analysis=what_if_analysis(problem, changed, what_if),
                check=_check(changed),
                outcome=changed.outcome,
            )
            return Task(
                task_id, category, variant, prompt, problem, changed, parts, statement=statement, what_if=what_if
            )
        variant, fallback = "decision", "what_if->decision"
    else:
        fallback = ""

    source = ""
    draw = task_rng.random()
    if variant == "translate" and draw < LP_INPUT_SHARE:
        source = "lp"
        template = pick(task_rng, _PROMPTS["translate_lp"])
    elif variant == "model" and draw < CODE_TO_MODEL_SHARE:
        source = "code"
        template = pick(task_rng, _PROMPTS["model_from_code"])
    elif variant == "model" and draw < CODE_TO_MODEL_SHARE + LP_TO_MODEL_SHARE:
        source = "text+lp"
        template = pick(task_rng, _PROMPTS["model_from_lp"])
    else:
        template = pick(task_rng, _PROMPTS[variant])
    if not template.startswith("{"):
        statement = _without_framing(statement)  # the template's own lead-in frames it
    lib, lib_long = DISPLAY[problem.library]
    prompt = template.format(
        statement=statement,
        math=math_full,
        lp=problem.lp,
        a_title=article(f"{problem.family.title.lower()} model"),
        lib=lib,
        lib_long=lib_long,
        program=problem.program.rstrip("\n") + "\n",
    )
    explain_status = lp_no_solution_explanation if source == "lp" else no_solution_explanation
    plan = lp_plan(problem) if source == "lp" else tuple(problem.decisions())
    solved = dict(
        decisions=plan or ((NOTHING_DONE,) if problem.status == "optimal" else ()),
        explanation=explain_status(problem) if problem.status != "optimal" else "",
        check=_check(problem),
    )
    if variant == "model" and source == "code":  # the program is all the user gave: read the model from it
        base_parts = {**base_parts, "reasoning": code_reading(problem, text_rng)}
        parts = AnswerParts(
            math=program_units_only(answer_full, problem.program), lp=problem.lp, **solved, **base_parts
        )
    elif variant == "model" and source == "text+lp":  # the LP file is given: the answer is the indexed model
        reasoning = f"{lp_reading(problem.model, 'model')}\n\n{base_parts['reasoning']}"
        # the LP file section repeats the given (verified) file, so the judge re-solves what the answer states
        parts = AnswerParts(math=answer_full, lp=problem.lp, **solved, **{**base_parts, "reasoning": reasoning})
    elif variant == "model":
        parts = AnswerParts(math=answer_full, lp=problem.lp, **solved, **base_parts)
    elif variant == "code":
        parts = AnswerParts(math=answer_brief, program=problem.program, **solved, **base_parts)
    elif variant == "translate":
        program = problem.program
        if source == "lp":  # only the LP file is given: read the model from its names, not from the story
            base_parts = {**base_parts, "reasoning": lp_reading(problem.model)}
            # and write the program in the file's keys and words (the Seventh review's #14, #27)
            program = lp_input_program(problem.program, problem.model, key_names(problem.math))
        parts = AnswerParts(program=program, **solved, **base_parts)
    else:  # decision: the plan, then what holds it in place
        parts = AnswerParts(
            math=answer_brief, program=problem.program, analysis=_limits(problem), **solved, **base_parts
        )
    uses_statement = variant in ("code", "decision") or (variant == "model" and source != "code")
    return Task(
        task_id,
        category,
        variant,
        prompt,
        problem,
        problem,
        parts,
        statement=statement if uses_statement else "",
        fallback=fallback,
        source=source,
    )


# A what-if whose change makes the problem infeasible or unbounded is kept with this probability
# (another change is drawn otherwise), so the samples' status shares stay at the configured ones:
# every non-optimal what-if adds to the infeasible or unbounded share the configuration sets.
NON_OPTIMAL_WHAT_IF = 0.1
WHAT_IF_DRAWS = 3


def _what_if_change(
    problem: Problem, rng: random.Random, runner: ProgramRunner
) -> tuple[WhatIf | None, Problem | None]:
    """A verified what-if change of `problem` (see `NON_OPTIMAL_WHAT_IF`), or (None, None)."""
    from trex.workloads.or_data.solve import solve_model

    for _ in range(WHAT_IF_DRAWS):
        what_if = problem.family.what_if(problem.data, rng)
        status = solve_model(problem.family.linear_model(what_if.data)).status
        if status != "optimal" and rng.random() >= NON_OPTIMAL_WHAT_IF:
            continue  # checked before the (costly) verification of the changed instance
        changed = _verified_change(problem, what_if, runner)
        if changed is not None:
            return what_if, changed
    return None, None


def _verified_change(problem: Problem, what_if: WhatIf, runner: ProgramRunner) -> Problem | None:
    """The changed instance, verified like any other (its status is whatever re-solving says,
    proven by the same certificates); None when it cannot be verified."""
    from trex.workloads.or_data.solve import solve_model

    family = problem.family
    status = solve_model(family.linear_model(what_if.data)).status
    if status not in ("optimal", "infeasible", "unbounded"):
        return None
    try:
        return verify_problem(
            family, what_if.data, status, _changed_note(problem, what_if, status), runner, library=problem.library
        )
    except VerificationFailed:
        return None


def _changed_note(problem: Problem, what_if: WhatIf, status: str) -> str:
    if status == "optimal":
        return ""
    return (
        f"with {what_if.parameter} = {format_objective(what_if.new)} the constraints can no longer all be met"
        if status == "infeasible"
        else f"with {what_if.parameter} = {format_objective(what_if.new)} nothing limits the objective"
    )

"""Zero-shot prompt templates, one per answer form.

| form | the model is asked for | evaluated by |
| --- | --- | --- |
| coptpy, pyscipopt, gurobipy, pyomo, pulp | a model and a Python program using that solver | running the program in the sandbox |
| lp | the model in CPLEX LP format | solving the LP file with SCIP in the sandbox |
| answer | the final optimal value | reading the number from the text |
| orlm | ORLM's own template (coptpy), verbatim | running the program in the sandbox |

Code forms ask for one fenced block and an explicit `Optimal objective value: ...` line; the
solver recorders read the objective even when a model ignores that instruction.
"""

from __future__ import annotations

from trex.workloads.or_eval.answers import Quantities
from trex.workloads.or_eval.benchmarks import Item

CODE_FORMS = ("coptpy", "pyscipopt", "gurobipy", "pyomo", "pulp", "orlm")
FORMS = (*CODE_FORMS, "lp", "answer")

OBJECTIVE_MARKER = "Optimal objective value"

# ORLM eval/generate.py TEMPLATE_q2mc_en (Cardinal-Operations/ORLM), reproduced verbatim.
ORLM_TEMPLATE = """
Below is an operations research question. Build a mathematical model and corresponding python code using `coptpy` that appropriately addresses the question.

# Question:
{question}

# Response:
""".strip()

_CODE_TEMPLATE = """Below is an operations research question. Build a mathematical model and write a Python program using `{solver}` that solves it.

# Question:
{question}

# Requirements:
- Put the complete program in one ```python code block.
- Solve the model with `{solver}`{solver_hint}.
- Print the optimal objective value on its own line as `{marker}: <number>`, or `{marker}: infeasible` / `{marker}: unbounded` when there is no optimal solution.
{quantities}
# Response:
"""

_SOLVER_HINTS = {
    "pyomo": " (through `SolverFactory('appsi_highs')`)",
    "pulp": " (its bundled CBC solver)",
}

_LP_TEMPLATE = """Below is an operations research question. Build a mathematical model and write it in CPLEX LP format.

# Question:
{question}

# Requirements:
- Put the complete model in one ```lp code block with the sections Maximize or Minimize, Subject To, Bounds, General or Binary (when needed), and End.
- Use variable names made of letters, digits and underscores.

# Response:
"""

_ANSWER_TEMPLATE = """Below is an operations research question. Solve it.

# Question:
{question}

# Requirements:
- End your response with the optimal objective value as \\boxed{{<number>}}, or \\boxed{{infeasible}} / \\boxed{{unbounded}} when there is no optimal solution.
{quantities}
# Response:
"""


def _quantity_lines(item: Item, how: str) -> str:
    if not isinstance(item.answer, Quantities):
        return ""
    names = "\n".join(f"  - {name}" for name, _ in item.answer.values)
    return f"- {how} each of these quantities on its own line as `<name>: <number>`, with the names exactly as written:\n{names}\n"


def build_prompt(item: Item, form: str) -> str:
    """The zero-shot prompt for `item` in answer form `form`."""
    if form == "orlm":
        return ORLM_TEMPLATE.format(question=item.question)
    if form in CODE_FORMS:
        return _CODE_TEMPLATE.format(
            solver=form,
            solver_hint=_SOLVER_HINTS.get(form, ""),
            question=item.question,
            marker=OBJECTIVE_MARKER,
            quantities=_quantity_lines(item, "Also print"),
        )
    if form == "lp":
        return _LP_TEMPLATE.format(question=item.question)
    if form == "answer":
        return _ANSWER_TEMPLATE.format(
            question=item.question, quantities=_quantity_lines(item, "Before the boxed value, state")
        )
    raise ValueError(f"unknown answer form {form!r}; valid: {', '.join(FORMS)}")

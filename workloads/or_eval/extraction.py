"""Reading programs out of model output, and answers out of program output.

From model output:
- `extract_code`: the fenced Python block to run. Reasoning (`<think>...</think>`) is dropped
  first; among Python blocks the last one that imports a solver wins (models that revise their
  code put the final version last); an unterminated block (output cut at the token limit) runs
  to the end of the text.
- `extract_lp`: a fenced ```lp block, or the text from `Maximize`/`Minimize` to `End`.
- `extract_final_answer`: `\\boxed{...}`, else an explicit objective line, else "answer is ...".

From what a program printed and what the solver recorders saw (`prediction_from_run`), in this
order of trust:
1. `marker`: an explicit objective line, ours (`Optimal objective value: ...`) or ORLM's
   (`Just print the best solution: ...`, `No Best Solution`); the last one printed counts.
2. `solver:<api>`: the last solve the recorders saw (optimal -> its objective; infeasible or
   unbounded -> no solution).
3. `printed`: the last printed line that names an objective-like quantity with a number
   ("Minimum cost: $29.0"), for programs using solvers without a recorder.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trex.workloads.or_eval.answers import NO_SOLUTION_WORDS, Prediction, parse_number
from trex.workloads.sandbox import SolveRecord

SOLVER_MODULES = (
    "coptpy",
    "pyscipopt",
    "gurobipy",
    "pyomo",
    "pulp",
    "highspy",
    "docplex",
    "ortools",
    "scipy",
    "cvxpy",
    "mip",
)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_SOLVER_IMPORT = re.compile(r"^\s*(?:import|from)\s+(" + "|".join(SOLVER_MODULES) + r")\b", re.MULTILINE)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_PYTHON_LANGS = {"python", "py", "python3", "ipython"}
_LP_LANGS = {"lp", "cplex", "cplex-lp"}

# The value may be a number or a no-solution word; the marker itself is matched case-insensitively.
_MARKERS = re.compile(
    r"^\s*(?:optimal objective value|just print the best solution)\s*[:=]\s*(?P<value>.+?)\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_ORLM_NO_SOLUTION = re.compile(r"^\s*No Best Solution\s*$", re.MULTILINE)
_OBJECTIVE_WORDS = re.compile(
    r"(objective|optimal (?:value|cost|profit|solution)|minimum|maximum|minimal|maximal|min(?:imized)?\s+\w+|"
    r"max(?:imized)?\s+\w+|total (?:cost|profit|revenue)|lowest|highest|best)",
    re.IGNORECASE,
)
_LABELLED_NUMBER = re.compile(r"^\s*(?P<label>[^:=\n]{1,200}?)\s*[:=]\s*(?P<value>[^\n]*?)\s*$", re.MULTILINE)
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_ANSWER_IS = re.compile(r"answer\s+is\s*[:=]?\s*([^\n]+)", re.IGNORECASE)

MAX_QUANTITIES = 500


def strip_reasoning(text: str) -> str:
    """Drop `<think>...</think>` sections; an unclosed one is kept (it may be all there is)."""
    return _THINK.sub("", text)


def _blocks(text: str) -> list[tuple[str, str]]:
    return [(match.group(1).lower(), match.group(2)) for match in _FENCE.finditer(text)]


def extract_code(text: str) -> str | None:
    """The Python program in a model's output, or None when there is none."""
    for body in (strip_reasoning(text), text):
        blocks = _blocks(body)
        python = [code for lang, code in blocks if lang in _PYTHON_LANGS]
        unlabeled = [code for lang, code in blocks if lang == "" and _compiles(code)]
        for candidates in (python, unlabeled):
            with_solver = [code for code in candidates if _SOLVER_IMPORT.search(code)]
            if with_solver:
                return with_solver[-1].strip("\n") + "\n"
        for candidates in (python, unlabeled):
            non_empty = [code for code in candidates if code.strip()]
            if non_empty:
                return non_empty[-1].strip("\n") + "\n"
        if not blocks and _SOLVER_IMPORT.search(body) and _compiles(body):
            return body.strip("\n") + "\n"  # a bare program without fences
    return None


def _compiles(code: str) -> bool:
    try:
        compile(code, "<model output>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


_LP_START = re.compile(r"^\s*(maximize|minimize|maximise|minimise|max|min)\s*$", re.IGNORECASE | re.MULTILINE)
_LP_END = re.compile(r"^\s*end\s*$", re.IGNORECASE | re.MULTILINE)


def extract_lp(text: str) -> str | None:
    """An LP-format model in a model's output, or None."""
    body = strip_reasoning(text)
    fenced = [code for lang, code in _blocks(body) if lang in _LP_LANGS]
    if not fenced:
        fenced = [code for lang, code in _blocks(body) if lang in ("", "text") and _LP_START.search(code)]
    if fenced:
        return fenced[-1].strip() + "\n"
    start = _LP_START.search(body)
    if start is None:
        return None
    end = _LP_END.search(body, start.end())
    return body[start.start() : end.end() if end else len(body)].strip() + "\n"


def lp_runner_program(file_name: str = "model.lp") -> str:
    """The program that solves an extracted LP file with SCIP and prints the objective marker."""
    return f"""from pyscipopt import Model

model = Model()
model.hideOutput()
model.readProblem({file_name!r})
model.optimize()
status = model.getStatus()
if status == "optimal":
    print(f"Optimal objective value: {{model.getObjVal()!r}}")
else:
    print(f"Optimal objective value: {{status}}")
"""


def _value_prediction(value: str, source: str) -> Prediction | None:
    cleaned = value.strip().strip("`*$").strip()
    if cleaned.lower().rstrip(".") in NO_SOLUTION_WORDS or cleaned.lower().startswith(("infeasible", "unbounded")):
        return Prediction(no_solution=True, source=source)
    number = parse_number(cleaned)
    return None if number is None else Prediction(objective=number, source=source)


def labelled_numbers(text: str) -> dict[str, float]:
    """`label: number` lines (last occurrence of a label wins), for named-quantity answers."""
    found: dict[str, float] = {}
    for match in _LABELLED_NUMBER.finditer(text):
        number = parse_number(match.group("value"))
        if number is not None:
            found.pop(match.group("label"), None)
            found[match.group("label")] = number
            if len(found) > MAX_QUANTITIES:
                found.pop(next(iter(found)))
    return found


def prediction_from_run(stdout: str, solves: Sequence[SolveRecord], *, quantities: bool = False) -> Prediction:
    """What a finished program answered (see the module docstring for the order of trust)."""
    named = labelled_numbers(stdout) if quantities else {}
    markers = [(match.start(), match.group("value")) for match in _MARKERS.finditer(stdout)]
    markers += [(match.start(), "No Best Solution") for match in _ORLM_NO_SOLUTION.finditer(stdout)]
    for _, value in sorted(markers, reverse=True):
        prediction = _value_prediction(value, "marker")
        if prediction is not None:
            return _with_quantities(prediction, named)
    if solves:
        last = solves[-1]
        if last.status == "optimal" and last.objective is not None:
            return _with_quantities(Prediction(objective=last.objective, source=f"solver:{last.api}"), named)
        if last.status in ("infeasible", "unbounded", "infeasible_or_unbounded"):
            return _with_quantities(Prediction(no_solution=True, source=f"solver:{last.api}"), named)
    for line in reversed(stdout.splitlines()):
        label, sep, value = line.partition(":")
        if not sep:
            label, sep, value = line.partition("=")
        if sep and _OBJECTIVE_WORDS.search(label):
            number = parse_number(value)
            if number is not None:
                return _with_quantities(Prediction(objective=number, source="printed"), named)
    return Prediction(quantities=named, source="printed" if named else "")


def _with_quantities(prediction: Prediction, named: dict[str, float]) -> Prediction:
    if not named:
        return prediction
    return Prediction(
        objective=prediction.objective, no_solution=prediction.no_solution, quantities=named, source=prediction.source
    )


def extract_final_answer(text: str, *, quantities: bool = False) -> Prediction:
    """A final answer stated in text (the `answer` form): boxed, marker line, or "answer is"."""
    body = strip_reasoning(text)
    named = labelled_numbers(body) if quantities else {}
    candidates = [(match.group(1), "boxed") for match in _BOXED.finditer(body)][-1:]
    candidates += [(match.group("value"), "marker") for match in _MARKERS.finditer(body)][-1:]
    candidates += [(match.group(1), "answer_is") for match in _ANSWER_IS.finditer(body)][-1:]
    for value, source in candidates:
        prediction = _value_prediction(value.replace("\\,", "").replace("\\$", ""), source)
        if prediction is not None:
            return _with_quantities(prediction, named)
    return Prediction(quantities=named, source="text" if named else "")

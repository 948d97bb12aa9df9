"""Buggy programs for the repair task: one realistic mistake injected into a verified program.

Mutations work on the program layout every family writes (`trex.workloads.or_data.program`):
commented constraint blocks, `addVar(vtype=...)`, `setObjective(..., sense=...)`. Each kind is
a mistake people make when they translate a model into code:

| kind | the mistake |
| --- | --- |
| flipped_inequality | a constraint family written with `>=` instead of `<=` (or the reverse) |
| loosened_equality | an equality written as an inequality |
| missing_constraint | a whole constraint family left out |
| objective_sense | minimizing what should be maximized (or the reverse) |
| relaxed_integrality | an integer or binary variable declared continuous |
| swapped_indices | a two-key parameter looked up with its keys in the wrong order |
| dropped_objective_term | one part of a composite objective left out |
| missing_optimize | the model is built but never solved |
| wrong_big_m | (modelling) the big-M of a disjunction too small, so it cuts off valid schedules |
| missing_linking | (modelling) a capacity not multiplied by its open/use/setup indicator, so the yes/no decision no longer limits the flow |

A mutation counts as a bug only when it changes what the program reports: `inject_bug` runs the
buggy program in the sandbox and keeps it only when it fails or reaches another outcome than the
verified one. A mutation that happens not to matter for this instance (a constraint that is not
binding) is discarded, so every repair sample's buggy program is demonstrably wrong.
"""

from __future__ import annotations

import difflib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trex.workloads.or_data.outcome import Outcome
from trex.workloads.or_data.program_runner import ProgramRunner

BUG_KINDS = (
    "flipped_inequality",
    "loosened_equality",
    "missing_constraint",
    "objective_sense",
    "relaxed_integrality",
    "swapped_indices",
    "dropped_objective_term",
    "missing_optimize",
    "wrong_big_m",
    "missing_linking",
)


@dataclass(frozen=True)
class Bug:
    kind: str
    diagnosis: str  # what is wrong and why, in words
    buggy: str  # the buggy program
    fixed: str  # the verified program
    symptom: str  # what the buggy program does when run ("prints ... 1250", "fails: KeyError ...")

    def diff(self) -> str:
        lines = difflib.unified_diff(
            self.buggy.splitlines(), self.fixed.splitlines(), "buggy.py", "fixed.py", n=1, lineterm=""
        )
        return "\n".join(lines)


@dataclass(frozen=True)
class _Block:
    label: str
    description: str
    start: int  # line index of the comment
    end: int  # one past the last line


def _blocks(lines: list[str]) -> list[_Block]:
    """Commented constraint blocks: `# label: description` followed by code up to a blank line."""
    blocks = []
    for index, line in enumerate(lines):
        match = re.match(r"^# (\w+): (.+)$", line)
        if match is None or match.group(1) in ("Data", "Objective"):
            continue
        end = index + 1
        while end < len(lines) and lines[end].strip():
            end += 1
        if any("addCons" in lines[i] for i in range(index + 1, end)):
            blocks.append(_Block(match.group(1), match.group(2), index, end))
    return blocks


Mutation = tuple[str, str]  # (buggy source, diagnosis)


def _sense_position(line: str, operators: Sequence[str]) -> int:
    """Where the constraint's own comparison operator stands in an `addCons(...)` line: the first of
    `operators` at the call's top level, not one inside a generator's condition (`if t <= s`) or a
    lookup; -1 when there is none."""
    start = line.find("addCons(")
    if start < 0:
        return -1
    depth = 0
    for index in range(start + len("addCons"), len(line)):
        char = line[index]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return -1
        elif depth == 1 and any(line.startswith(operator, index) for operator in operators):
            return index
    return -1


def _replace_sense(line: str, position: int, new: str) -> str:
    return line[:position] + new + line[position + len(new) :]


def _flipped_inequality(lines: list[str], rng: random.Random) -> Mutation | None:
    options = [
        (block, i)
        for block in _blocks(lines)
        for i in range(block.start, block.end)
        if _sense_position(lines[i], (" <= ", " >= ")) >= 0
    ]
    if not options:
        return None
    block, i = rng.choice(options)
    position = _sense_position(lines[i], (" <= ", " >= "))
    old = lines[i][position : position + 4]
    new = " >= " if old == " <= " else " <= "
    mutated = lines[:i] + [_replace_sense(lines[i], position, new)] + lines[i + 1 :]
    return "\n".join(mutated), (
        f"The `{block.label}` constraints use `{new.strip()}` where the model needs `{old.strip()}` "
        f"({block.description}), so the program solves a different problem."
    )


def _loosened_equality(lines: list[str], rng: random.Random) -> Mutation | None:
    options = [
        (block, i)
        for block in _blocks(lines)
        for i in range(block.start, block.end)
        if _sense_position(lines[i], (" == ",)) >= 0
    ]
    if not options:
        return None
    block, i = rng.choice(options)
    new = rng.choice((" <= ", " >= "))
    mutated = lines[:i] + [_replace_sense(lines[i], _sense_position(lines[i], (" == ",)), new)] + lines[i + 1 :]
    return "\n".join(mutated), (
        f"The `{block.label}` constraints must hold with equality ({block.description}), but the program writes "
        f"`{new.strip()}`, which lets the solver move away from the required value."
    )


def _missing_constraint(lines: list[str], rng: random.Random) -> Mutation | None:
    blocks = _blocks(lines)
    if not blocks:
        return None
    block = rng.choice(blocks)
    end = block.end + 1 if block.end < len(lines) and not lines[block.end].strip() else block.end
    mutated = lines[: block.start] + lines[end:]
    return "\n".join(mutated), (
        f"The program never adds the `{block.label}` constraints ({block.description}); without them the "
        "solver is free to choose plans the problem forbids."
    )


def _objective_sense(lines: list[str], rng: random.Random) -> Mutation | None:
    for i, line in enumerate(lines):
        if "setObjective(" in line and ('sense="minimize"' in line or 'sense="maximize"' in line):
            right, wrong = ("minimize", "maximize") if 'sense="minimize"' in line else ("maximize", "minimize")
            mutated = lines[:i] + [line.replace(f'sense="{right}"', f'sense="{wrong}"')] + lines[i + 1 :]
            return "\n".join(mutated), f"The objective is set to `{wrong}`, but the problem asks to {right} it."
    return None


def _relaxed_integrality(lines: list[str], rng: random.Random) -> Mutation | None:
    options = [i for i, line in enumerate(lines) if "addVar(" in line and ('vtype="I"' in line or 'vtype="B"' in line)]
    if not options:
        return None
    i = rng.choice(options)
    kind = "integer" if 'vtype="I"' in lines[i] else "binary"
    variable = lines[i].split("=", 1)[0].strip()
    mutated = lines[:i] + [re.sub(r'vtype="[IB]"', 'vtype="C"', lines[i])] + lines[i + 1 :]
    return "\n".join(mutated), (
        f'`{variable}` is declared continuous (`vtype="C"`), but the decisions it stands for are {kind}; '
        f"the solver returns a fractional plan."
    )


_TWO_KEYS = re.compile(r"\b([a-z_]+)\[(\w+), (\w+)\]")


def _swapped_indices(lines: list[str], rng: random.Random) -> Mutation | None:
    assigned = {line.split(" = ", 1)[0] for line in lines if " = " in line and not line.startswith((" ", "#"))}
    options = [
        (i, match)
        for i, line in enumerate(lines)
        if "addCons(" in line or "setObjective(" in line
        for match in _TWO_KEYS.finditer(line)
        if match.group(2) != match.group(3) and match.group(1) in assigned
    ]
    if not options:
        return None
    i, match = rng.choice(options)
    name, first, second = match.groups()
    line = lines[i][: match.start()] + f"{name}[{second}, {first}]" + lines[i][match.end() :]
    mutated = lines[:i] + [line] + lines[i + 1 :]
    return "\n".join(mutated), (
        f"`{name}` is keyed by `({first}, {second})`, but one line looks it up as `{name}[{second}, {first}]`; "
        "the keys must come in the order the data uses."
    )


def _dropped_objective_term(lines: list[str], rng: random.Random) -> Mutation | None:
    for i, line in enumerate(lines):
        if "setObjective(" not in line:
            continue
        match = re.search(r"setObjective\((.+), sense=", line)
        if match is None:
            continue
        terms = _split_top_level(match.group(1))
        if len(terms) < 2:
            return None
        dropped = rng.randrange(len(terms))
        kept = [term for k, term in enumerate(terms) if k != dropped]
        expression = kept[0][1] + "".join(f" {sign} {term}" for sign, term in kept[1:])
        mutated = lines[:i] + [line[: match.start(1)] + expression + line[match.end(1) :]] + lines[i + 1 :]
        return "\n".join(
            mutated
        ), f"The objective leaves out the term `{terms[dropped][1]}`, so part of the cost or profit is not counted."
    return None


def _split_top_level(expression: str) -> list[tuple[str, str]]:
    """`a + quicksum(b - c) - d` -> [("+", "a"), ("+", "quicksum(b - c)"), ("-", "d")]."""
    terms, depth, current, sign = [], 0, "", "+"
    index = 0
    while index < len(expression):
        char = expression[index]
        depth += char in "([{"
        depth -= char in ")]}"
        if depth == 0 and expression[index : index + 3] in (" + ", " - "):
            terms.append((sign, current.strip()))
            sign, current = expression[index + 1], ""
            index += 3
            continue
        current += char
        index += 1
    terms.append((sign, current.strip()))
    return terms


def _missing_optimize(lines: list[str], rng: random.Random) -> Mutation | None:
    if "model.optimize()" not in lines:
        return None
    mutated = [line for line in lines if line != "model.optimize()"]
    return (
        "\n".join(mutated),
        "The program builds the model but never calls `model.optimize()`, so nothing is solved and no objective value exists.",
    )


def _wrong_big_m(lines: list[str], rng: random.Random) -> Mutation | None:
    """`big_m = <bound>` replaced by a value that looks plausible (the longest single duration)
    but is not larger than every possible schedule."""
    for i, line in enumerate(lines):
        if line.startswith("big_m = ") and "duration" in line:
            mutated = lines[:i] + ["big_m = max(duration.values())"] + lines[i + 1 :]
            return "\n".join(mutated), (
                "`big_m` is set to the longest single processing time, which is not large enough: when an order indicator "
                "switches a disjunction off, the constraint must hold for any start times, so M has to exceed the latest "
                "possible completion (latest release plus all processing). With the small M the 'inactive' constraint still "
                "binds and cuts off valid schedules."
            )
    return None


_LINKED = re.compile(r"(<= )(\w+(?:\[\w+\])?) \* (\w+)\[(\w+)\]")


def _missing_linking(lines: list[str], rng: random.Random) -> Mutation | None:
    options = [
        (i, match) for i, line in enumerate(lines) if "addCons(" in line for match in [_LINKED.search(line)] if match
    ]
    if not options:
        return None
    i, match = rng.choice(options)
    line = lines[i][: match.start()] + match.group(1) + match.group(2) + lines[i][match.end() :]
    mutated = lines[:i] + [line] + lines[i + 1 :]
    indicator = f"{match.group(3)}[{match.group(4)}]"
    return "\n".join(mutated), (
        f"The capacity on the right-hand side is no longer multiplied by `{indicator}`, so the yes/no decision is not linked to "
        f"what is assigned: the solver can use the capacity while `{indicator}` is 0 and save its cost. The linking term "
        f"`{match.group(2)} * {indicator}` is what makes a closed or unused option hold nothing."
    )


MUTATIONS: dict[str, Callable[[list[str], random.Random], Mutation | None]] = {
    "flipped_inequality": _flipped_inequality,
    "loosened_equality": _loosened_equality,
    "missing_constraint": _missing_constraint,
    "objective_sense": _objective_sense,
    "relaxed_integrality": _relaxed_integrality,
    "swapped_indices": _swapped_indices,
    "dropped_objective_term": _dropped_objective_term,
    "missing_optimize": _missing_optimize,
    "wrong_big_m": _wrong_big_m,
    "missing_linking": _missing_linking,
}
# missing_optimize is the least interesting; it is tried only when nothing else matters
_LAST_RESORT = ("missing_optimize",)


def inject_bug(
    program: str,
    truth: Outcome,
    rng: random.Random,
    runner: ProgramRunner,
    *,
    attempts: int = 4,
    kinds: Sequence[str] = BUG_KINDS,
) -> Bug | None:
    """A mutation of `program` (of one of `kinds`) that demonstrably changes its result, or None
    (see the module docstring). At most `attempts` mutated programs are run."""
    unknown = [kind for kind in kinds if kind not in MUTATIONS]
    if unknown:
        raise ValueError(f"unknown bug kinds {unknown}; valid: {', '.join(BUG_KINDS)}")
    lines = program.rstrip("\n").split("\n")
    ordered = [kind for kind in kinds if kind not in _LAST_RESORT]
    rng.shuffle(ordered)
    tried = 0
    for kind in [*ordered, *(kind for kind in _LAST_RESORT if kind in kinds)]:
        mutation = MUTATIONS[kind](lines, rng)
        if mutation is None:
            continue
        buggy, diagnosis = mutation
        buggy += "\n"
        if buggy == program:
            continue
        run = runner.run(buggy, clock_verdict=False)
        tried += 1
        if run.outcome is None:
            last = run.stdout.strip().splitlines()[-1:] or [""]
            symptom = (
                f"it fails (`{run.failure}: {run.detail}`)"  # the error as printed: code, not prose
                if run.failure != "no_objective"
                else f"it prints `{last[0]}` and no objective value"
            )
            return Bug(kind, diagnosis, buggy, program, symptom)
        if not run.outcome.matches(truth):
            return Bug(kind, diagnosis, buggy, program, f"it reports `{run.outcome.marker_line()}`")
        if tried >= attempts:
            break
    return None

"""DTA Phase I: the teacher ensemble behind one interface.

A `Teacher` answers a batch of tasks with one `Candidate` each. Three kinds:

- `ProgrammaticTeacher` writes from the ground truth (the verified model, program and LP file)
  straight into the student's style. It needs nothing but the solver, so the whole pipeline runs
  offline with it alone.
- `ClientTeacher` wraps any client of the OR evaluator (`trex.workloads.llm_clients`): an
  OpenAI-compatible endpoint (`OpenAIClient`, e.g. a vLLM server) or a local transformers model
  (`TransformersClient`, whose forward passes go through `trex.compile`). Its free-form answers
  are rewritten into the student's style in Phase II (`rewrite`).

Teachers never see the verified answer; the judge and the agreement checks do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from trex.workloads.llm_clients.base import Client, GenerationRequest
from trex.workloads.or_data.style import AnswerParts, StyleTemplate
from trex.workloads.or_data.tasks import Task
from trex.workloads.or_eval.answers import NoSolution, Objective
from trex.workloads.or_eval.benchmarks import Item
from trex.workloads.or_eval.errors import ClientError

PROGRAMMATIC = "programmatic"


@dataclass(frozen=True)
class Candidate:
    """One teacher's answer to one task. `parts` is set when the teacher wrote structured
    parts (the programmatic teacher); `error` when it produced nothing."""

    teacher: str
    task_id: str
    text: str
    parts: AnswerParts | None = None
    error: str = ""


class Teacher(Protocol):
    name: str

    def identity(self) -> dict: ...

    def propose(self, tasks: Sequence[Task]) -> list[Candidate]: ...

    def close(self) -> None: ...


class ProgrammaticTeacher:
    """Writes each task's reference answer (from the verified ground truth) in the style."""

    def __init__(self, style: StyleTemplate | None = None, name: str = PROGRAMMATIC):
        self.style = style or StyleTemplate()
        self.name = name

    def identity(self) -> dict:
        return {"teacher": self.name, "kind": "programmatic"}

    def propose(self, tasks: Sequence[Task]) -> list[Candidate]:
        return [
            Candidate(
                self.name, task.id, self.style.render(task.category, task.variant, task.reference), task.reference
            )
            for task in tasks
        ]

    def close(self) -> None:
        pass


_REQUIREMENTS = {
    "model": "Give the mathematical model (sets, parameters, decision variables, objective, constraints), then the same model as a CPLEX LP file in one ```lp code block (sections Maximize/Minimize, Subject To, Bounds, General/Binary as needed, End).",
    "code": "Explain the model briefly, then give one complete Python program in a ```python code block that builds and solves it with pyscipopt.",
    "translate": "Give one complete Python program in a ```python code block that builds and solves the model with pyscipopt.",
    "repair": "Explain what is wrong, then give the complete corrected program in one ```python code block.",
    "decision": "Explain the model, give one complete pyscipopt program in a ```python code block, and describe the optimal decision.",
    "what_if": "Explain the model, give one complete pyscipopt program for the changed data in a ```python code block, and compare the optimum before and after the change.",
}


def teacher_prompt(task: Task) -> str:
    """The task's prompt plus the output contract every teacher is asked to follow."""
    return (
        f"{task.prompt}\n\n# Requirements\n- {_REQUIREMENTS[task.variant]}\n"
        "- The program must print `Optimal objective value: <value>` (or `Optimal objective value: infeasible` / `unbounded`).\n"
        "- End your answer with the line `Optimal objective value: <value>` (or `infeasible` / `unbounded`).\n"
    )


def ask(client: Client, prompts: Sequence[tuple[str, Task, str]]) -> tuple[list[str | None], str]:
    """Send (request id, task, prompt) triples through an OR-evaluator client; returns each
    answer's text (None when it gave none) and the error that stopped the client, if any.

    The evaluator's requests carry a benchmark `Item`; the task's verified outcome fills its
    answer field, which clients never read (they see only the prompt)."""
    requests = []
    for request_id, task, prompt in prompts:
        truth = task.truth
        answer = Objective(truth.objective) if truth.objective is not None else NoSolution()
        item = Item(
            id=request_id, question=task.prompt, answer=answer, category=f"{task.category}/{task.variant}", line=0
        )
        requests.append(GenerationRequest(item=item, sample=0, prompt=prompt))
    texts: dict[str, str] = {}
    error = ""
    try:
        for completion in client.generate(requests):
            texts[completion.key] = completion.text or ""
    except ClientError as failure:
        error = str(failure)
    return [texts.get(request.key) for request in requests], error


class ClientTeacher:
    """A model behind an OR-evaluator client, asked with `teacher_prompt`."""

    def __init__(self, name: str, client: Client):
        if name == PROGRAMMATIC:
            raise ValueError(f"teacher name {PROGRAMMATIC!r} is reserved for the programmatic teacher")
        self.name, self.client = name, client

    def identity(self) -> dict:
        return {"teacher": self.name, "kind": "client", **self.client.identity()}

    def propose(self, tasks: Sequence[Task]) -> list[Candidate]:
        texts, error = ask(self.client, [(task.id, task, teacher_prompt(task)) for task in tasks])
        return [
            Candidate(self.name, task.id, text or "", error="" if text is not None else (error or "no completion"))
            for task, text in zip(tasks, texts, strict=True)
        ]

    def close(self) -> None:
        self.client.close()

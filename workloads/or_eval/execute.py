"""Turning one completion into a prediction: extract, run in the sandbox, read the answer."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from trex.workloads.llm_clients.base import Completion
from trex.workloads.or_eval.answers import Prediction, Quantities
from trex.workloads.or_eval.benchmarks import Item
from trex.workloads.or_eval.extraction import (
    extract_code,
    extract_final_answer,
    extract_lp,
    lp_runner_program,
    prediction_from_run,
)
from trex.workloads.or_eval.prompts import CODE_FORMS
from trex.workloads.sandbox import Sandbox

# Failure kinds the evaluator adds to the sandbox's (`trex.workloads.sandbox.FailureKind`).
NO_PROGRAM = "no_program"  # the output holds no program (or LP model) to run
NO_OBJECTIVE = "no_objective"  # the program ran cleanly but stated no objective
NO_ANSWER = "no_answer"  # an `answer`-form output states no final value
MISSING_PREDICTION = "missing_prediction"  # the replay file has nothing for this sample

TAIL_CHARS = 2000


@dataclass(frozen=True)
class SampleResult:
    """One sample's outcome: a prediction, or a failure kind with a one-line detail."""

    key: str
    item_id: str
    sample: int
    prediction: Prediction | None
    failure: str | None
    detail: str
    origin: str
    executed: bool
    wall_s: float = 0.0
    cpu_s: float = 0.0
    program_sha256: str = ""
    stdout_tail: str = ""
    stderr_tail: str = ""

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "item": self.item_id,
            "sample": self.sample,
            "prediction": None if self.prediction is None else self.prediction.to_json(),
            "failure": self.failure,
            "detail": self.detail,
            "origin": self.origin,
            "executed": self.executed,
            "wall_s": round(self.wall_s, 4),
            "cpu_s": round(self.cpu_s, 4),
            "program_sha256": self.program_sha256,
            "stdout_tail": self.stdout_tail,
            "stderr_tail": self.stderr_tail,
        }

    @classmethod
    def from_json(cls, data: dict) -> SampleResult:
        prediction = data.get("prediction")
        return cls(
            key=str(data["key"]),
            item_id=str(data["item"]),
            sample=int(data["sample"]),
            prediction=None if prediction is None else Prediction.from_json(prediction),
            failure=data.get("failure"),
            detail=str(data.get("detail", "")),
            origin=str(data.get("origin", "")),
            executed=bool(data.get("executed", False)),
            wall_s=float(data.get("wall_s", 0.0)),
            cpu_s=float(data.get("cpu_s", 0.0)),
            program_sha256=str(data.get("program_sha256", "")),
            stdout_tail=str(data.get("stdout_tail", "")),
            stderr_tail=str(data.get("stderr_tail", "")),
        )


def evaluate_completion(item: Item, sample: int, completion: Completion, form: str, sandbox: Sandbox) -> SampleResult:
    """The prediction `completion` makes for `item`, running its program when the form has one."""
    base = {"key": completion.key, "item_id": item.id, "sample": sample, "origin": completion.origin}
    wants_quantities = isinstance(item.answer, Quantities)
    if completion.text is None and completion.program is None:
        return SampleResult(
            **base, prediction=None, failure=MISSING_PREDICTION, detail="no prediction for this sample", executed=False
        )
    if form == "answer" and completion.program is None:
        prediction = extract_final_answer(completion.text or "", quantities=wants_quantities)
        if prediction.empty:
            return SampleResult(
                **base, prediction=None, failure=NO_ANSWER, detail="no boxed or stated final value", executed=False
            )
        return SampleResult(**base, prediction=prediction, failure=None, detail="", executed=False)

    files: dict[str, str] = {}
    if completion.program is not None:
        program = completion.program
    elif form == "lp":
        model = extract_lp(completion.text or "")
        program = None if model is None else lp_runner_program("model.lp")
        files = {} if model is None else {"model.lp": model}
    elif form in CODE_FORMS:
        program = extract_code(completion.text or "")
    else:
        raise ValueError(f"unknown answer form {form!r}")
    if program is None:
        what = "an LP model" if form == "lp" else "a Python code block"
        return SampleResult(
            **base, prediction=None, failure=NO_PROGRAM, detail=f"the output holds no {what}", executed=False
        )

    execution = sandbox.run(program, files=files)
    digest = hashlib.sha256((program + "".join(files.values())).encode()).hexdigest()
    run = {
        "executed": True,
        "wall_s": execution.wall_s,
        "cpu_s": execution.cpu_s,
        "program_sha256": digest,
        "stdout_tail": execution.stdout[-TAIL_CHARS:],
        "stderr_tail": execution.stderr[-TAIL_CHARS:],
    }
    if execution.failure is not None:
        return SampleResult(**base, prediction=None, failure=execution.failure.value, detail=execution.detail, **run)
    prediction = prediction_from_run(execution.stdout, execution.solves, quantities=wants_quantities)
    if prediction.empty:
        return SampleResult(
            **base, prediction=None, failure=NO_OBJECTIVE, detail="ran, but printed and solved no objective", **run
        )
    return SampleResult(**base, prediction=prediction, failure=None, detail="", **run)

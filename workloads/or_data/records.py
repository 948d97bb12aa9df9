"""The output records: SFT samples (`sft.jsonl`) and their schema check.

One line per sample:

    {"messages": [{"role": "system", "content": ...},
                  {"role": "user", "content": ...},
                  {"role": "assistant", "content": ...}],
     "meta": {"id", "family", "task", "variant", "objective", "status", "program", "lp",
              "representations": {"input": [...], "output": [...]}, "verification": [...],
              "seed", "index", "dta": {...}, "fallback", "bug"?, "what_if"?}}

`meta.program`, `meta.lp`, `meta.objective` and `meta.status` describe the problem the answer's
final line is about: for a what-if, the changed problem (the original's outcome is under
`meta.what_if`); for a repair, the corrected program (the buggy one is under `meta.bug`).
`objective` is null when `status` is infeasible or unbounded.

The layout is the chat format HF `datasets` reads (`load_dataset("json", data_files=...)`):
every record has the same keys and types, so the columns infer consistently.
"""

from __future__ import annotations

from typing import Any

from trex.workloads.or_data.cpt_separation import lp_digest
from trex.workloads.or_data.dta import Decision
from trex.workloads.or_data.style import StyleTemplate
from trex.workloads.or_data.tasks import CATEGORIES, VARIANTS

ROLES = ("system", "user", "assistant")
STATUSES = ("optimal", "infeasible", "unbounded")
META_FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "family": str,
    "task": str,
    "variant": str,
    "objective": (float, int, type(None)),
    "status": str,
    "program": str,
    "lp": str,
    "representations": dict,
    "verification": list,
    "seed": int,
    "index": int,
    "dta": dict,
    "fallback": (str, type(None)),
    "bug": (dict, type(None)),
    "what_if": (dict, type(None)),
}


def sample_id(seed: int, index: int) -> str:
    return f"ordata-s{seed}-{index:07d}"


def sft_record(decision: Decision, style: StyleTemplate, *, seed: int, index: int) -> dict[str, Any]:
    task, target = decision.task, decision.task.target
    assert decision.answer is not None, "only kept decisions become records"
    bug = None
    if task.bug is not None:
        bug = {"kind": task.bug.kind, "buggy_program": task.bug.buggy, "symptom": task.bug.symptom}
    what_if = None
    if task.what_if is not None:
        what_if = {
            "question": task.what_if.question,
            "parameter": task.what_if.parameter,
            "old": task.what_if.old,
            "new": task.what_if.new,
            "base_objective": task.problem.outcome.objective,
            "base_status": task.problem.outcome.status,
            "base_lp_digest": lp_digest(task.problem.lp),
            "change": task.what_if.change or None,
        }
    meta = {
        "id": sample_id(seed, index),
        "family": task.family,
        "task": task.category,
        "variant": task.variant,
        "objective": target.outcome.objective,
        "status": target.outcome.status,
        "program": target.program,
        "lp": target.lp,
        "representations": {"input": list(task.inputs), "output": list(task.outputs)},
        "verification": list(target.checks),
        "seed": seed,
        "index": index,
        "dta": decision.to_json(),
        "fallback": task.fallback or None,
        "bug": bug,
        "what_if": what_if,
    }
    messages = [
        {"role": "system", "content": style.system_prompt},
        {"role": "user", "content": task.prompt},
        {"role": "assistant", "content": decision.answer},
    ]
    return {"messages": messages, "meta": meta}


def validate_sft_record(record: Any) -> list[str]:
    """Schema problems of one `sft.jsonl` record (empty when it conforms)."""
    if not isinstance(record, dict) or set(record) != {"messages", "meta"}:
        return [
            f"a record has exactly the keys messages and meta, got {sorted(record) if isinstance(record, dict) else type(record).__name__}"
        ]
    problems = []
    messages = record["messages"]
    if not isinstance(messages, list) or [m.get("role") if isinstance(m, dict) else None for m in messages] != list(
        ROLES
    ):
        problems.append("messages must be system, user, assistant in that order")
    else:
        for message in messages:
            if (
                set(message) != {"role", "content"}
                or not isinstance(message["content"], str)
                or not message["content"].strip()
            ):
                problems.append(f"the {message.get('role')} message needs exactly role and non-empty string content")
    meta = record["meta"]
    if not isinstance(meta, dict):
        return [*problems, "meta must be an object"]
    if set(meta) != set(META_FIELDS):
        problems.append(
            f"meta keys differ: missing {sorted(set(META_FIELDS) - set(meta))}, extra {sorted(set(meta) - set(META_FIELDS))}"
        )
    for name, kind in META_FIELDS.items():
        if name in meta and (not isinstance(meta[name], kind) or (kind is int and isinstance(meta[name], bool))):
            problems.append(f"meta.{name} has type {type(meta[name]).__name__}")
    if meta.get("task") not in CATEGORIES:
        problems.append(f"meta.task {meta.get('task')!r} is not one of {', '.join(CATEGORIES)}")
    elif meta.get("variant") not in VARIANTS[meta["task"]]:
        problems.append(f"meta.variant {meta.get('variant')!r} is not a variant of {meta['task']}")
    if meta.get("status") not in STATUSES:
        problems.append(f"meta.status {meta.get('status')!r} is not one of {', '.join(STATUSES)}")
    elif (meta["status"] == "optimal") != (meta.get("objective") is not None):
        problems.append("meta.objective must be set exactly when meta.status is optimal")
    for name in ("program", "lp"):
        if isinstance(meta.get(name), str) and not meta[name].strip():
            problems.append(f"meta.{name} is empty")
    return problems

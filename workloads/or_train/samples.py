"""Reading and encoding the training files: chat samples for SFT, documents for CPT.

Accepted lines (one JSON object per line, the files `trex data synth` writes or any HF-style chat
JSONL):

    sft   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...], ...}
    cpt   {"text": "..."}          (a chat record is accepted too: its messages are rendered as text)

Nothing is dropped silently: a line that is not JSON, lacks the field, names a role the chat does
not know, has no assistant turn (SFT) or does not fit the sequence under `--overlength drop` is
counted by reason, and the line itself (number, reason, text) goes to the run's `rejected.jsonl`.

SFT labels: only the assistant turns' tokens (their content and the end token) are trained; the
system and user turns are context. The split is found from the chat template itself: the tokens of
the conversation up to message i are a prefix of the tokens up to message i+1 (checked, with an
error naming the template if a template breaks that), so the tokens message i+1 adds are its own.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trex.errors import TrexError

ROLES = ("system", "user", "assistant")
IGNORE = -100  # the label of a token that is context, not a target (torch's cross_entropy ignore_index)
OVERLENGTH = ("drop", "truncate")


@dataclass(frozen=True)
class Encoded:
    """One sample as tokens: `labels[i]` is `ids[i]` where it is trained, IGNORE where it is context."""

    line: int
    ids: tuple[int, ...]
    labels: tuple[int, ...]
    truncated: bool = False


@dataclass
class Rejections:
    """Lines not trained on, by reason, with the lines themselves (written to rejected.jsonl)."""

    counts: Counter = field(default_factory=Counter)
    lines: list[dict[str, Any]] = field(default_factory=list)

    def add(self, number: int, reason: str, detail: str, text: str) -> None:
        self.counts[reason] += 1
        self.lines.append({"line": number, "reason": reason, "detail": detail, "text": text})

    def summary(self) -> str:
        return ", ".join(f"{count} {reason}" for reason, count in sorted(self.counts.items())) or "none"

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as out:
            for record in self.lines:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")


@dataclass
class Dataset:
    kind: str  # "sft" or "cpt"
    path: Path
    samples: list[Encoded]
    rejected: Rejections
    truncated: int = 0

    @property
    def trained_tokens(self) -> int:
        return sum(sum(1 for label in sample.labels if label != IGNORE) for sample in self.samples)


def read_dataset(path: Path, kind: str, tokenizer: Any, *, max_tokens: int, overlength: str = "drop") -> Dataset:
    """Encode every usable line of `path`; `max_tokens` is the longest a sample may be (the sequence + 1)."""
    if kind not in ("sft", "cpt"):
        raise ValueError(kind)
    if overlength not in OVERLENGTH:
        raise TrexError(f"--overlength {overlength!r}: choose one of {', '.join(OVERLENGTH)}")
    if not path.is_file():
        raise TrexError(f"--data: {path} is not a file; pass a JSONL file or the directory `trex data synth` wrote")
    rejected = Rejections()
    samples: list[Encoded] = []
    truncated = 0
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, 1):
            text = raw.rstrip("\n")
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                rejected.add(number, "malformed_json", error.msg, text)
                continue
            try:
                encoded = _encode(record, kind, tokenizer, number)
            except _Reject as why:
                rejected.add(number, why.reason, why.detail, text)
                continue
            if len(encoded.ids) > max_tokens:
                if overlength == "drop":
                    rejected.add(
                        number,
                        "too_long",
                        f"{len(encoded.ids)} tokens > {max_tokens} (--seq + 1); --overlength drop",
                        text,
                    )
                    continue
                encoded = Encoded(number, encoded.ids[:max_tokens], encoded.labels[:max_tokens], truncated=True)
                truncated += 1
                if all(label == IGNORE for label in encoded.labels):
                    rejected.add(number, "too_long", f"no trained token is left within {max_tokens} tokens", text)
                    continue
            samples.append(encoded)
    if not samples:
        raise TrexError(
            f"--data {path}: no usable {kind} sample (rejected: {rejected.summary()}); "
            + (
                "raise --seq or pass --overlength truncate"
                if rejected.counts.get("too_long")
                else f"each line needs {'a messages list' if kind == 'sft' else 'a text field'}"
            )
        )
    return Dataset(kind, path, samples, rejected, truncated)


class _Reject(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _messages(record: Any) -> list[dict[str, str]]:
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise _Reject("no_messages", 'the line has no "messages" list')
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise _Reject("bad_message", f"message {index} is not an object with a string content")
        if message.get("role") not in ROLES:
            raise _Reject(
                "unknown_role", f"message {index} has role {message.get('role')!r}; known: {', '.join(ROLES)}"
            )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _encode(record: Any, kind: str, tokenizer: Any, number: int) -> Encoded:
    if kind == "cpt":
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            text = record["text"]
        elif isinstance(record, dict) and "messages" in record:
            text = "\n\n".join(m["content"] for m in _messages(record))
        else:
            raise _Reject("no_text", 'the line has no "text" string (nor a "messages" list)')
        if not text.strip():
            raise _Reject("empty", "the text is empty")
        ids = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        ids += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return Encoded(number, tuple(ids), tuple(ids))
    messages = _messages(record)
    if not any(m["role"] == "assistant" for m in messages):
        raise _Reject("no_assistant", "no assistant message: nothing to train on")
    return encode_chat(messages, tokenizer, number)


def encode_chat(messages: list[dict[str, str]], tokenizer: Any, number: int = 0) -> Encoded:
    """Tokens of the whole conversation, labels on the assistant turns only (see the module docstring)."""
    ids: list[int] = []
    labels: list[int] = []
    for end in range(1, len(messages) + 1):
        upto = _render(tokenizer, messages[:end])
        if upto[: len(ids)] != ids:
            raise TrexError(
                "the tokenizer's chat template does not render a conversation as a prefix of its continuation, "
                "so assistant tokens cannot be told apart; use a template without history rewriting "
                "(or --tokenizer byte)"
            )
        added = upto[len(ids) :]
        if messages[end - 1]["role"] == "assistant":
            # The assistant header (what `add_generation_prompt` adds) is given at inference: context, not target.
            try:
                prompt = _render(tokenizer, messages[: end - 1], generation_prompt=True) if end > 1 else []
            except ValueError:  # a template that refuses some conversation shapes: no header to tell apart
                prompt = []
            header = len(prompt) - len(ids) if upto[: len(prompt)] == prompt and len(prompt) >= len(ids) else 0
            labels += [IGNORE] * header + added[header:]
        else:
            labels += [IGNORE] * len(added)
        ids += added
    return Encoded(number, tuple(ids), tuple(labels))


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool = False) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        if not messages and not generation_prompt:
            return []
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
    # No template: role-prefixed plain text, each turn closed by the end-of-sequence token.
    ids: list[int] = []
    for message in messages:
        ids += tokenizer(f"{message['role']}: {message['content']}\n", add_special_tokens=False)["input_ids"]
        ids.append(tokenizer.eos_token_id)
    if generation_prompt:
        ids += tokenizer("assistant: ", add_special_tokens=False)["input_ids"]
    return ids


def data_file(data: str | Path, kind: str) -> Path:
    """`--data` is a JSONL file, or the directory `trex data synth` wrote (its sft.jsonl / cpt.jsonl)."""
    path = Path(data)
    if path.is_dir():
        candidate = path / f"{kind}.jsonl"
        if not candidate.is_file():
            raise TrexError(f"--data {path}: the directory has no {kind}.jsonl (written by `trex data synth`)")
        return candidate
    return path

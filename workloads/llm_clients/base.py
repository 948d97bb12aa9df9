"""The interface every model client implements, and the request/completion records it exchanges.

A request is about one `item` - anything with an `id` (an OR benchmark question, a data-pipeline
task) - so the clients serve every workload without knowing their records."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol


class Identified(Protocol):
    id: str


@dataclass(frozen=True)
class GenerationRequest:
    """Sample number `sample` for `item`, prompted with `prompt`."""

    item: Identified
    sample: int
    prompt: str

    @property
    def key(self) -> str:
        return sample_key(self.item.id, self.sample)


def sample_key(item_id: str, sample: int) -> str:
    return f"{item_id}#{sample}"


@dataclass(frozen=True)
class Completion:
    """A client's answer to one request.

    `text` is the model's output. `program`, when set, is a ready-to-run program that takes
    precedence over extracting one from `text` (ORLM's released `to_run_script`). Both None
    means the client has no prediction for this request (a replay file missing the item).
    """

    key: str
    text: str | None
    program: str | None = None
    origin: str = "generated"  # "generated", "replay:<field>", "replay:missing"


class Client(Protocol):
    """Turns prompts into completions.

    `generate` yields completions as they finish, in any order, one per request; it raises
    `ClientError` when it cannot go on (completions already yielded stay valid).
    `persist_generations` says whether the runner should store outputs for resuming (true for
    clients that cost time or money to call; a replay client already is a file).
    `identity` describes what produces the outputs; resuming a run with another identity is
    refused so results of two models never mix.
    """

    persist_generations: bool

    def identity(self) -> dict: ...

    def generate(self, requests: Sequence[GenerationRequest]) -> Iterator[Completion]: ...

    def close(self) -> None: ...

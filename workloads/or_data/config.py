"""What a synthesis run is configured with: `SynthConfig`, and the teacher specs it builds from.

A config is plain data (JSON round-trippable) because worker processes rebuild their teachers
and judge from it, and because a resumed run must be the same run: the manifest stores the
config, and resuming with a different one is refused (`n`, `workers` and the sandbox isolation
are not part of it: `n` can grow on a resume, and the output never depends on the others).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trex.errors import TrexError
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.selection import SelectionPolicy

TEACHER_KINDS = ("programmatic", "openai", "transformers")
# What each index's CPT document is about (`pipeline.cpt_instance`): "separate", an instance of its
# own, generated and verified like an SFT instance (issue 23: continued pretraining never shows an
# SFT problem; about 1.4x the work of a sample); "same", the SFT sample's own verified instance
# written up again (no second instance: the CPT set then repeats the SFT problems); "none", no
# CPT documents.
CPT_INSTANCES = ("separate", "same", "none")


@dataclass(frozen=True)
class TeacherSpec:
    """A teacher (or reflection judge) to build: `kind` with its client `options`.

    openai: base_url, model, and optionally api, temperature, top_p, max_tokens, api_key_env (the
    environment variable holding the key: specs are stored in the manifest and sent to worker
    processes, keys never are), timeout_s, max_retries, concurrency, seed. transformers:
    model_path, and optionally compile, target, backend, max_new_tokens, temperature, batch_size,
    seed, dtype.
    """

    kind: str
    name: str
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in TEACHER_KINDS:
            raise TrexError(f"unknown teacher kind {self.kind!r}; valid: {', '.join(TEACHER_KINDS)}")
        if "api_key" in self.options:
            raise TrexError("a teacher spec names the environment variable of its API key (api_key_env), never the key")

    def client(self):
        """The OR-evaluator client this spec describes (openai and transformers kinds)."""
        options = dict(self.options)
        if self.kind == "openai":
            import os

            from trex.workloads.llm_clients import OpenAIClient

            key_variable = options.pop("api_key_env", None)
            api_key = os.environ.get(key_variable) if key_variable else None
            return OpenAIClient(options.pop("base_url"), options.pop("model"), api_key=api_key, **options)
        if self.kind == "transformers":
            from trex.workloads.llm_clients.local import TransformersClient

            return TransformersClient(options.pop("model_path"), **options)
        raise TrexError(f"a {self.kind} teacher has no client")

    def build_teacher(self, style):
        from trex.workloads.or_data.teachers import ClientTeacher, ProgrammaticTeacher

        if self.kind == "programmatic":
            return ProgrammaticTeacher(style, name=self.name)
        return ClientTeacher(self.name, self.client())

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "options": dict(self.options)}


PROGRAMMATIC_TEACHER = TeacherSpec("programmatic", "programmatic")


@dataclass(frozen=True)
class SynthConfig:
    seed: int = 0
    families: tuple[str, ...] = tuple(FAMILIES)
    infeasible_share: float = 0.06
    unbounded_share: float = 0.03
    shard_size: int = 25
    teachers: tuple[TeacherSpec, ...] = (PROGRAMMATIC_TEACHER,)
    reflection: TeacherSpec | None = None  # a model judge after the programmatic one
    policy: SelectionPolicy = field(default_factory=SelectionPolicy)
    isolation: str = "auto"
    ngram: int = 13  # decontamination n-gram length
    near_duplicate: float = 0.8  # estimated Jaccard at which a prompt is a near duplicate
    cpt_instances: str = "separate"  # see CPT_INSTANCES

    def __post_init__(self) -> None:
        unknown = [name for name in self.families if name not in FAMILIES]
        if unknown or not self.families:
            raise TrexError(f"unknown families {unknown}; valid: {', '.join(FAMILIES)}")
        if not (
            self.infeasible_share >= 0
            and self.unbounded_share >= 0
            and self.infeasible_share + self.unbounded_share < 0.5
        ):
            raise TrexError(
                f"infeasible ({self.infeasible_share}) and unbounded ({self.unbounded_share}) shares must be non-negative "
                "and together below 0.5: they are the labelled minority"
            )
        if self.shard_size < 1:
            raise TrexError(f"shard size must be at least 1, got {self.shard_size}")
        if not self.teachers:
            raise TrexError("at least one teacher is needed (the programmatic teacher works offline)")
        names = [teacher.name for teacher in self.teachers]
        if len(set(names)) != len(names):
            raise TrexError(f"teacher names must be distinct, got {names}")
        if not 0 < self.near_duplicate <= 1:
            raise TrexError(f"near-duplicate threshold must lie in (0, 1], got {self.near_duplicate}")
        if self.cpt_instances not in CPT_INSTANCES:
            raise TrexError(f"unknown CPT instance mode {self.cpt_instances!r}; valid: {', '.join(CPT_INSTANCES)}")
        if self.ngram < 5:
            raise TrexError(f"decontamination n-grams shorter than 5 words flag ordinary phrases; got {self.ngram}")

    def identity(self) -> dict:
        """What makes two runs the same run: everything but how programs are isolated, which
        never changes an output. The manifest stores this."""
        data = self.to_json()
        del data["isolation"]
        if data["cpt_instances"] == "separate":
            del data["cpt_instances"]  # the default: runs made before the option existed are the same runs
        return data

    def to_json(self) -> dict:
        data = asdict(self)
        data["families"] = list(self.families)
        data["teachers"] = [teacher.to_json() for teacher in self.teachers]
        data["reflection"] = self.reflection.to_json() if self.reflection else None
        data["policy"] = self.policy.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict) -> SynthConfig:
        data = dict(data)
        data["families"] = tuple(data["families"])
        data["teachers"] = tuple(TeacherSpec(**teacher) for teacher in data["teachers"])
        data["reflection"] = TeacherSpec(**data["reflection"]) if data.get("reflection") else None
        policy = data["policy"]
        data["policy"] = SelectionPolicy(policy["keep_single"], policy["keep_unanimous"], tuple(policy["prefer"]))
        return cls(**data)

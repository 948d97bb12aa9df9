"""The run directory: what was asked, what the model said, what each sample scored. Resumable.

    OUT/run.json            benchmark (name, path, sha256), answer form, samples, client identity
    OUT/generations.jsonl   model outputs as they arrive (clients that are costly to call)
    OUT/results.jsonl       one SampleResult per line, appended as each finishes
    OUT/report.json, .md    written at the end of each invocation

Re-running with the same OUT skips finished samples and executes stored generations without
asking the model again; a killed run loses at most the samples in flight. Only complete records
count as finished: an interrupted program is never written (`RunInterrupted`), and a record whose
failure is the sandbox's own (`sandbox_error`: not the program's outcome) is executed again. A run
directory holding another benchmark version, form, sample count or client is refused rather than
mixed.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from trex.workloads.llm_clients.base import Completion
from trex.workloads.or_eval.errors import DataFormatError, RunStateError
from trex.workloads.or_eval.execute import SampleResult
from trex.workloads.or_eval.jsonio import JsonlLog

MANIFEST_VERSION = 1
# manifest entries that must agree for results to be resumed
_MUST_MATCH = ("benchmark_sha256", "form", "samples", "client")
# failures that are no outcome of the program: such a record is incomplete and runs again on resume
INCOMPLETE_FAILURES = frozenset({"sandbox_error"})


class RunStore:
    """Finished samples and stored generations, in memory and (with `out_dir`) on disk."""

    def __init__(self, out_dir: str | os.PathLike | None, manifest: dict):
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.manifest = {"version": MANIFEST_VERSION, **manifest}
        self.results: dict[str, SampleResult] = {}
        self.generations: dict[str, Completion] = {}
        self._lock = threading.Lock()
        self._results_log: JsonlLog | None = None
        self._generations_log: JsonlLog | None = None
        if self.out_dir is not None:
            self._open()

    def _open(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        manifest_path = self.out_dir / "run.json"
        if manifest_path.exists():
            try:
                previous = json.loads(manifest_path.read_text(encoding="utf-8"))
            except ValueError as error:
                raise DataFormatError(str(manifest_path), None, f"not valid JSON ({error})") from None
            differences = [
                f"{key}: stored {previous.get(key)!r}, now {self.manifest.get(key)!r}"
                for key in _MUST_MATCH
                if previous.get(key) != self.manifest.get(key)
            ]
            if differences:
                raise RunStateError(
                    f"{self.out_dir} holds results of a different run ({'; '.join(differences)}); "
                    "use another --out directory"
                )
        else:
            created = {**self.manifest, "created_utc": datetime.now(UTC).isoformat(timespec="seconds")}
            temporary = manifest_path.with_suffix(".json.tmp")
            temporary.write_text(json.dumps(created, indent=2, default=str) + "\n", encoding="utf-8")
            os.replace(temporary, manifest_path)
        self._results_log = JsonlLog(self.out_dir / "results.jsonl")
        for number, record in enumerate(self._results_log.records, start=1):
            try:
                result = SampleResult.from_json(record)
            except (KeyError, TypeError, ValueError) as error:
                raise DataFormatError(str(self._results_log.path), number, f"not a sample result ({error!r})") from None
            if result.failure not in INCOMPLETE_FAILURES:
                self.results[result.key] = result
        generations = self.out_dir / "generations.jsonl"
        if not generations.exists():
            return
        self._generations_log = JsonlLog(generations)
        for record in self._generations_log.records:
            completion = Completion(
                key=str(record["key"]),
                text=record.get("text"),
                program=record.get("program"),
                origin=str(record.get("origin", "generated")),
            )
            self.generations[completion.key] = completion

    def add_generation(self, completion: Completion) -> None:
        with self._lock:
            self.generations[completion.key] = completion
            if self._generations_log is None and self.out_dir is not None:
                self._generations_log = JsonlLog(self.out_dir / "generations.jsonl")
        if self._generations_log is not None:
            self._generations_log.append(
                {
                    "key": completion.key,
                    "text": completion.text,
                    "program": completion.program,
                    "origin": completion.origin,
                }
            )

    def add_result(self, result: SampleResult) -> None:
        with self._lock:
            self.results[result.key] = result
        if self._results_log is not None:
            self._results_log.append(result.to_json())

    def close(self) -> None:
        for log in (self._results_log, self._generations_log):
            if log is not None:
                log.close()

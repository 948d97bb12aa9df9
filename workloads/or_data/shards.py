"""The resumable on-disk state of a run: the manifest and one file per finished shard.

    DIR/manifest.json                 the run's config (resuming with another one is refused)
    DIR/shards/shard-000012.jsonl     the results of indices 12*size .. 13*size-1, one line each

A shard file appears only complete: it is written to a temporary name, fsynced and renamed
(rename is atomic on POSIX). A run killed at any moment leaves finished shards and nothing else
of its work; the next run skips them and redoes the rest, so no index is done twice into the
output or skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trex.errors import TrexError

MANIFEST_FORMAT = 1


class ShardStore:
    def __init__(self, out_dir: str | os.PathLike, shard_size: int):
        self.root = Path(out_dir)
        self.directory = self.root / "shards"
        self.shard_size = shard_size

    def path(self, shard: int) -> Path:
        return self.directory / f"shard-{shard:06d}.jsonl"

    def indices(self, shard: int) -> range:
        return range(shard * self.shard_size, (shard + 1) * self.shard_size)

    def done(self, shard: int) -> bool:
        return self.path(shard).is_file()

    def write(self, shard: int, results: list[dict[str, Any]]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        expected = list(self.indices(shard))
        if [result["index"] for result in results] != expected:
            raise ValueError(f"shard {shard} must hold indices {expected[0]}..{expected[-1]} in order")
        final = self.path(shard)
        temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as file:
            for result in results:
                file.write(json.dumps(result, ensure_ascii=False, sort_keys=True) + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, final)

    def read(self, shard: int) -> list[dict[str, Any]]:
        with open(self.path(shard), encoding="utf-8") as file:
            results = [json.loads(line) for line in file if line.strip()]
        if [result["index"] for result in results] != list(self.indices(shard)):
            raise TrexError(
                f"{self.path(shard)} does not hold indices {self.indices(shard).start}..{self.indices(shard).stop - 1}; delete it to redo the shard"
            )
        return results

    def clean_temporaries(self) -> None:
        """Remove what killed writers left (their renames never happened)."""
        if self.directory.is_dir():
            for leftover in self.directory.glob(".shard-*.tmp"):
                leftover.unlink(missing_ok=True)


def open_manifest(out_dir: str | os.PathLike, config_json: dict[str, Any]) -> bool:
    """Write the manifest of a new run, or check that an existing run has the same config.
    Returns True when resuming."""
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "manifest.json"
    manifest = {"format": MANIFEST_FORMAT, "config": config_json}
    if path.is_file():
        try:
            existing = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            raise TrexError(f"{path} is not valid JSON; move {root} away to start a new run") from None
        if existing.get("config") != config_json:
            old = existing.get("config", {})
            differing = sorted(key for key in set(old) | set(config_json) if old.get(key) != config_json.get(key))
            raise TrexError(
                f"{root} holds a run with other settings ({', '.join(differing)} differ); use the same settings to resume it, "
                "or another --out directory"
            )
        return True
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return False

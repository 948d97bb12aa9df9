"""Checkpoints with torch.distributed.checkpoint (DCP): atomic, exact to resume, plan independent.

Layout of a checkpoint directory:

    step-000004/        one DCP checkpoint (every rank writes its shards) + trex.json (what it holds)
    latest              the name of the newest complete checkpoint

A save writes `step-N.partial/`, and only when every rank has finished does rank 0 add `trex.json`,
rename it to `step-N/` and then replace `latest` (write + `os.replace`). A save killed half way
leaves a `.partial` directory and `latest` still names the previous good checkpoint.

Every tensor is saved as the *global* tensor (DTensors over the plan's meshes, see
`AppliedPlan.model_state` and the optimizers' `state_dict`), so DCP reshards on load: a run saved
with one plan resumes under another. Data order depends on (seed, step) only, so the step number is
the data position; the RNG state is saved too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trex.errors import TrexError

FORMAT = "trex-checkpoint/1"


def fingerprint(shapes: dict[str, tuple[int, ...]]) -> str:
    """A model's identity for checkpoints: its parameters' names and global shapes."""
    text = json.dumps(sorted((name, list(shape)) for name, shape in shapes.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class CheckpointStore:
    def __init__(self, directory: str | Path, job: Any, shapes: dict[str, tuple[int, ...]]):
        self.root = Path(directory)
        self.job = job
        self.shapes = shapes
        self.identity = {
            "model": job.model,
            "fingerprint": fingerprint(shapes),
            "seed": job.seed,
            "data": job.data,
            "seq": job.parallel.seq,
            "gbs": job.parallel.gbs,
            "recipe": {"source": getattr(job, "source", None), **getattr(job, "source_args", {})}
            if getattr(job, "source", None)
            else None,
        }

    # -- what a checkpoint holds ---------------------------------------------------------------
    def _state(self, applied: Any, step: int) -> dict[str, Any]:
        applied.optimizer.ensure_state()
        return {
            "model": applied.model_state(),
            "optimizer": applied.optimizer.state_dict(),
            "progress": {"step": torch.tensor(step)},
            "rng": torch.get_rng_state(),
        }

    def latest(self) -> Path | None:
        pointer = self.root / "latest"
        if not pointer.exists():
            return None
        name = pointer.read_text().strip()
        return self.root / name

    def check_fresh(self) -> None:
        """A run without --resume must not write over an earlier run's checkpoints."""
        if self.latest() is not None:
            raise TrexError(
                f"{self.root} already holds checkpoints (latest: {self.latest().name}); pass --resume to "
                "continue that run, "
                "or choose an empty --checkpoint-dir (nothing is overwritten)"
            )

    # -- save -----------------------------------------------------------------------------------
    def save(self, applied: Any, step: int) -> Path:
        import torch.distributed.checkpoint as dcp

        final = self.root / f"step-{step:06d}"
        partial = self.root / f"step-{step:06d}.partial"
        if _rank() == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if partial.exists():
                shutil.rmtree(partial)  # left by a killed save; never the last good checkpoint
        _barrier()
        dcp.save(self._state(applied, step), checkpoint_id=str(partial))
        _barrier()
        if _rank() == 0:
            meta = {
                "format": FORMAT,
                "step": step,
                "plan": self.job.plan_text,
                "world_size": dist.get_world_size() if dist.is_initialized() else 1,
                **self.identity,
            }
            (partial / "trex.json").write_text(json.dumps(meta, indent=2) + "\n")
            if final.exists():
                raise TrexError(f"{final} already exists; refusing to overwrite it")
            os.rename(partial, final)
            pointer = self.root / "latest.tmp"
            pointer.write_text(final.name + "\n")
            os.replace(pointer, self.root / "latest")
        _barrier()
        return final

    # -- load -----------------------------------------------------------------------------------
    def load(self, applied: Any) -> int:
        """Restore the newest checkpoint into `applied`; returns the step to continue from."""
        import torch.distributed.checkpoint as dcp

        where = self.latest()
        if where is None:
            raise TrexError(
                f"--resume: no checkpoint in {self.root} (no 'latest' file); run without --resume first, with "
                "--save-every K"
            )
        meta_path = where / "trex.json"
        if not meta_path.exists():
            raise TrexError(
                f"--resume: {where} is not a complete trex checkpoint (trex.json is missing); it may be corrupt - "
                "delete 'latest' to fall back, or start a fresh --checkpoint-dir"
            )
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as error:
            raise TrexError(f"--resume: {meta_path} is corrupt ({error.msg}); start a fresh --checkpoint-dir") from None
        if meta.get("format") != FORMAT:
            raise TrexError(f"--resume: {where} is not a {FORMAT} checkpoint (format {meta.get('format')!r})")
        if meta.get("fingerprint") != self.identity["fingerprint"]:
            raise TrexError(
                f"--resume: the checkpoint in {where} is of another model ({meta.get('model')!r}, parameters "
                f"{meta.get('fingerprint')}); "
                f"this run trains {self.job.model!r} (parameters {self.identity['fingerprint']}). Pass the "
                "model it was saved with, "
                "or a fresh --checkpoint-dir"
            )
        differing = [
            f"{key} {meta.get(key)!r} -> {self.identity[key]!r}"
            for key in ("seed", "data", "seq", "gbs", "recipe")
            if meta.get(key) != self.identity[key]
        ]
        if differing:
            raise TrexError(
                f"--resume: the data order would differ from the saved run ({'; '.join(differing)}); resume "
                "with the saved "
                "--seed/--data/--seq/--gbs and data options (the plan may differ)"
            )
        step = int(meta["step"])
        state = self._state(applied, step)
        try:
            dcp.load(state, checkpoint_id=str(where))
        except Exception as error:  # noqa: BLE001 - DCP raises many kinds; name the file and the fix
            raise TrexError(
                f"--resume: could not read the checkpoint {where}: {type(error).__name__}: {str(error)[:300]}; "
                "it may be corrupt - "
                "point 'latest' at an earlier step-* directory or start a fresh --checkpoint-dir"
            ) from None
        torch.set_rng_state(state["rng"])
        loaded = int(state["progress"]["step"])
        if loaded != step:
            raise TrexError(
                f"--resume: {where} says step {step} in trex.json but {loaded} in its tensors; the checkpoint "
                "is corrupt"
            )
        return step

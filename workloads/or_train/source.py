"""The batch source every rank of an SFT or CPT run builds from the job (plain data, so it crosses
process boundaries): it re-reads and re-tokenizes the file, which is deterministic, so every rank and
every resumed run sees the same rows in the same order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trex.workloads.or_train.packing import PackedSource
from trex.workloads.or_train.samples import Dataset, read_dataset
from trex.workloads.or_train.tokenizer import load_tokenizer

FACTORY = "trex.workloads.or_train.source:build_source"


def source_args(kind: str, path: Path, tokenizer: str, overlength: str, pack: bool) -> dict[str, Any]:
    return {"kind": kind, "path": str(path), "tokenizer": tokenizer, "overlength": overlength, "pack": pack}


def load(args: dict[str, Any], seq: int) -> tuple[Any, Dataset]:
    tokenizer = load_tokenizer(args["tokenizer"])
    dataset = read_dataset(
        Path(args["path"]), args["kind"], tokenizer, max_tokens=seq + 1, overlength=args["overlength"]
    )
    return tokenizer, dataset


def packed_source(args: dict[str, Any], *, seq: int, gbs: int, seed: int) -> tuple[PackedSource, Dataset, Any]:
    tokenizer, dataset = load(args, seq)
    source = PackedSource(
        dataset.samples, seq=seq, gbs=gbs, seed=seed, pad_id=tokenizer.pad_token_id, pack=args["pack"]
    )
    return source, dataset, tokenizer


def build_source(job: Any, config: Any) -> PackedSource:
    """`TrainJob.source` entry point, called in each rank."""
    plan = job.parallel
    return packed_source(job.source_args, seq=plan.seq, gbs=plan.gbs, seed=job.seed)[0]

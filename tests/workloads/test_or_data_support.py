"""Shared by the OR-data tests: a program runner, verified instances, and a tiny local model.

(It holds no tests; the name keeps it with the other OR-data test files. Test modules import
the fixtures from here.)"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.program_runner import ProgramRunner
from trex.workloads.or_data.seeds import stream
from trex.workloads.or_data.verify import Problem, verify_problem

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "or_bench"
requires_bench = pytest.mark.skipif(not DATA_DIR.is_dir(), reason=f"benchmark data not found at {DATA_DIR}")


@pytest.fixture(scope="module")
def runner():
    """One sandboxed runner per test module; its cache never changes an outcome, only saves runs."""
    with ProgramRunner(isolation="process") as shared:
        yield shared


def generated(family: str, seed: int, status: str = "optimal"):
    return FAMILIES[family].generate(stream(seed, 0, "data"), status)


def verified(family: str, seed: int, runner: ProgramRunner, status: str = "optimal") -> Problem:
    made = generated(family, seed, status)
    return verify_problem(FAMILIES[family], made.data, made.status, made.note, runner)


@pytest.fixture(scope="module")
def tiny_lm_dir(tmp_path_factory) -> Path:
    """A random-init two-layer Llama and a character tokenizer saved to a directory (nothing is
    downloaded), loadable by `TransformersClient` like any local model."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM
    from workload_helpers import CHARACTER_VOCAB, character_tokenizer

    words = CHARACTER_VOCAB + ["\n"]
    tokenizer = character_tokenizer(words)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(words),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=8192,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
    )
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def text_rng(seed: int) -> random.Random:
    return random.Random(seed)

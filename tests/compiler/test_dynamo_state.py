"""What a model compiles does not depend on which models the process compiled before (`trex.dynamo_state`).

transformers wraps every model's forward in one decorator, and DeepSeek-V3's and DeepSeek-V4's forward bodies are
the same code, so Dynamo's automatic-dynamic memory (kept per code object) was shared between them: a V3 compiled
after a V4 was captured differently from a V3 compiled alone (an extra empty graph, a different main graph, and
with backend=["ascend"] a lower fused share: bench/RESULTS.md 12.5 and 12.6)."""

from __future__ import annotations

import torch

import trex
from trex.models import build_model, tiny_config


def _captured(family: str) -> list[tuple[str, int]]:
    """(phase, Dynamo graph node count) of every graph one training step of the tiny model captured."""
    config = tiny_config(family, num_layers=1)
    compiled = trex.compile(build_model(config, seed=1), backend=["eager"])
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    compiled(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return [(g.phase, len(g.dynamo_graph.graph.nodes)) for g in compiled.trex.graphs]


def test_a_model_compiles_the_same_after_another_model_with_the_same_forward_code():
    alone = _captured("deepseek-v3")
    _captured("deepseek-v4")  # same forward code as V3 (transformers' modular source), other sizes
    again = _captured("deepseek-v3")
    assert len(alone) == 1 and again == alone, (alone, again)


def test_each_compiled_model_has_its_own_automatic_dynamic_memory():
    from torch._dynamo import pgo

    from trex.dynamo_state import AutomaticDynamicMemory, own_automatic_dynamic_memory

    process = pgo._CODE_STATE
    memory = AutomaticDynamicMemory()
    with own_automatic_dynamic_memory(memory):
        assert pgo._CODE_STATE is None  # a fresh model starts as a fresh process does
        pgo.get_code_state()  # what Dynamo does when it compiles a frame
    assert pgo._CODE_STATE is process and memory.code_state is not None
    with own_automatic_dynamic_memory(memory):
        assert pgo._CODE_STATE is memory.code_state  # its own memory comes back on its next call

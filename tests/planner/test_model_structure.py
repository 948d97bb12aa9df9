"""The planner's view of a model (ModelSpec: layer kinds, counts, parameters) matches the model itself.

The planner splits stages and shards parameters by ModelSpec's layer kinds. Here every full-size
model is built on the meta device by transformers (no memory), its decoder stack grouped by
parameter shapes as `trex.meta_capture` does, and compared layer by layer with ModelSpec.
"""

from __future__ import annotations

import pytest

from trex.cost_model import get_model_spec
from trex.meta_capture import decoder_layers, parameter_counts
from trex.models import build_model, load_config

MODELS = ["deepseek-v3", "qwen3-235b-a22b", "deepseek-v4-flash", "deepseek-v4-pro"]


def built(name: str):
    model = build_model(load_config(name), device="meta")
    return model, decoder_layers(model)[1]


def partition(labels) -> set[frozenset[int]]:
    groups: dict[object, set[int]] = {}
    for index, label in enumerate(labels):
        groups.setdefault(label, set()).add(index)
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize("name", MODELS)
def test_layer_kinds_and_counts_match_the_built_model(name):
    spec = get_model_spec(name)
    _, layers = built(name)
    assert spec.num_layers == len(layers)
    shapes = [
        tuple(sorted((n, tuple(t.shape)) for n, t in (*layer.named_parameters(), *layer.named_buffers())))
        for layer in layers
    ]
    assert partition(layer.kind for layer in spec.layers) == partition(shapes)


@pytest.mark.parametrize("name", MODELS)
def test_parameters_per_layer_and_in_total_match_the_built_model(name):
    spec = get_model_spec(name)
    model, layers = built(name)
    for spec_layer, layer in zip(spec.layers, layers):
        total, active = parameter_counts(layer)
        assert (spec_layer.params(spec.hidden_size), spec_layer.active_params(spec.hidden_size)) == (total, active)
    assert (spec.total_params, spec.active_params) == parameter_counts(model)


@pytest.mark.slow
def test_captured_layer_kinds_are_the_planners_layer_kinds():
    from trex.meta_capture import ENDS, capture_model

    spec = get_model_spec("deepseek-v4-flash")
    capture = capture_model("deepseek-v4-flash")
    assert partition(layer.kind for layer in spec.layers) == {
        frozenset(k.layer_indices) for k in capture.kinds if k.name != ENDS
    }
    ends = next(k for k in capture.kinds if k.name == ENDS)
    assert ends.params_per_layer == spec.embedding_params + spec.head_params + spec.final_norm_params

"""The stored full-size configurations (trex.cost_model.config_cache) match what transformers builds,
and pricing a built-in model needs neither transformers nor torch."""

from __future__ import annotations

import json
import subprocess
import sys

import transformers

from trex.cost_model import config_cache
from trex.cost_model.model_spec import get_model_spec, spec_from_config
from trex.models import FULL_SIZE_MODELS, load_config


def test_store_holds_every_full_size_model_as_transformers_builds_it() -> None:
    assert config_cache.stored_names() == sorted(FULL_SIZE_MODELS), f"regenerate with `{config_cache.REGENERATE}`"
    built = config_cache.build_configs()
    for name in FULL_SIZE_MODELS:
        stored = config_cache.stored_config(name)
        assert stored is not None
        stored.pop("transformers_version", None)
        fresh = dict(built[name])
        fresh.pop("transformers_version", None)
        assert stored == fresh, (
            f"{name}: data/model_configs.json differs from transformers {transformers.__version__} "
            f"(stored with {config_cache.stored_transformers_version()}); regenerate with `{config_cache.REGENERATE}`"
        )


def test_specs_from_stored_dicts_equal_specs_from_config_objects() -> None:
    for name in FULL_SIZE_MODELS:
        assert get_model_spec(name) == spec_from_config(load_config(name), name), name


def test_stored_config_is_a_copy() -> None:
    first = config_cache.stored_config("deepseek-v3")
    assert first is not None
    first["hidden_size"] = 1
    assert config_cache.stored_config("deepseek-v3")["hidden_size"] == 7168


def test_estimate_and_planner_import_neither_transformers_nor_torch() -> None:
    code = (
        "import sys, json\n"
        "from trex.cost_model import get_model_spec, get_cluster, parse_plan, estimate_step\n"
        "import trex.planner\n"
        "e = estimate_step(get_model_spec('qwen3-235b-a22b'), get_cluster('h100', 256),\n"
        "                  parse_plan('tp=2,pp=8,vpp=4,ep=32', seq=4096, gbs=2048))\n"
        "print(json.dumps(sorted(m for m in ('torch', 'transformers') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []

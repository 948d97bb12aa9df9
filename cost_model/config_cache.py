"""Stored configurations of the full-size models, so that pricing them does not import transformers.

`trex estimate` and `trex plan` on a built-in model (deepseek-v3, qwen3-235b-a22b, ...) need only the
numbers of its transformers config. Building that config imports transformers, which imports torch:
about 2 s of every such command, against ~1 ms for the estimate itself. `data/model_configs.json`
holds `config.to_dict()` of every `trex.models.FULL_SIZE_MODELS` entry, and `spec_from_config`
reads the dict exactly as it reads the config object (tests/cost_model/test_config_cache.py checks
both the stored dicts against the pinned transformers and the specs built from either).

Regenerate after changing a configuration in `trex.models` or upgrading transformers:

    python -m trex.cost_model.config_cache
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

FILE_NAME = "model_configs.json"
REGENERATE = "python -m trex.cost_model.config_cache"


@cache
def _stored() -> dict[str, Any]:
    return json.loads(resources.files("trex.cost_model").joinpath("data", FILE_NAME).read_text())


def stored_config(name: str) -> dict[str, Any] | None:
    """The stored `to_dict()` of full-size model `name` (a fresh copy), or None when it has none."""
    config = _stored()["models"].get(name)
    return json.loads(json.dumps(config)) if config is not None else None


def stored_names() -> list[str]:
    return sorted(_stored()["models"])


def stored_transformers_version() -> str:
    return str(_stored()["transformers_version"])


def build_configs() -> dict[str, dict[str, Any]]:
    """`to_dict()` of every full-size configuration, built now with the installed transformers."""
    from trex.models import FULL_SIZE_MODELS

    return {
        name: json.loads(json.dumps(model.make_config().to_dict())) for name, model in sorted(FULL_SIZE_MODELS.items())
    }


def write(path: Path | None = None) -> Path:
    import transformers

    target = path or Path(__file__).parent / "data" / FILE_NAME
    payload = {"generated_by": REGENERATE, "transformers_version": transformers.__version__, "models": build_configs()}
    target.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return target


if __name__ == "__main__":
    print(f"wrote {write()}")

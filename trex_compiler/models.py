"""Named model configurations: full-size ones for planning, tiny ones for tests and the demo.

Full-size configurations are transformers configs (never weights): `DeepseekV4Config()` defaults are
DeepSeek-V4-Flash; the others state their source next to the numbers. Tiny configurations keep every
structural feature of their family (V4's hash-MoE layers, CSA/HCA attention and mHC streams; V3's dense
first layers and MLA) at sizes that train in milliseconds on a CPU. Nothing here downloads anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trex.errors import TrexError, UnknownNameError

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class NamedModel:
    name: str
    description: str
    source: str
    make_config: Callable[[], PretrainedConfig]


def _deepseek_v4_flash() -> PretrainedConfig:
    from transformers import DeepseekV4Config

    return DeepseekV4Config()


def _deepseek_v4_pro() -> PretrainedConfig:
    from transformers import DeepseekV4Config

    # DeepSeek-V4 report / transformers' DeepseekV4GroupedLinear docstring: 61 layers, hidden 7168,
    # 128 heads x 512, q-LoRA 1536, o_groups 16 x 1024, 384 routed experts of width 3072, top-6.
    return DeepseekV4Config(
        num_hidden_layers=61,
        hidden_size=7168,
        num_attention_heads=128,
        head_dim=512,
        q_lora_rank=1536,
        o_groups=16,
        o_lora_rank=1024,
        n_routed_experts=384,
        moe_intermediate_size=3072,
        num_experts_per_tok=6,
    )


def _deepseek_v3() -> PretrainedConfig:
    from transformers import DeepseekV3Config

    # transformers' defaults are DeepSeek-V3 (671B): 61 layers, 3 dense, 256 experts, top-8.
    return DeepseekV3Config()


def _qwen3_235b_a22b() -> PretrainedConfig:
    from transformers import Qwen3MoeConfig

    # Qwen3-235B-A22B config.json (Qwen/Qwen3-235B-A22B on the Hugging Face hub).
    return Qwen3MoeConfig(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        moe_intermediate_size=1536,
        num_hidden_layers=94,
        num_attention_heads=64,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    )


FULL_SIZE_MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel("deepseek-v4-flash", "DeepSeek-V4-Flash, ~284B total / ~13B active", "transformers DeepseekV4Config() defaults", _deepseek_v4_flash),
        NamedModel("deepseek-v4-pro", "DeepSeek-V4-Pro, ~1.6T total / ~49B active", "DeepSeek-V4 report", _deepseek_v4_pro),
        NamedModel("deepseek-v3", "DeepSeek-V3, 671B total / 37B active", "transformers DeepseekV3Config() defaults", _deepseek_v3),
        NamedModel("qwen3-235b-a22b", "Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B config.json", _qwen3_235b_a22b),
    )
}


TINY_PREFIX = "tiny-"


def model_names(*, include_tiny: bool = True) -> list[str]:
    names = sorted(FULL_SIZE_MODELS)
    return names + [TINY_PREFIX + f for f in TINY_FAMILIES] if include_tiny else names


def load_config(name_or_path: str | Path) -> PretrainedConfig:
    """A transformers config from a built-in name (full-size, or `tiny-<family>`) or a path to a
    `config.json` (or its folder)."""
    key = str(name_or_path)
    if key in FULL_SIZE_MODELS:
        return FULL_SIZE_MODELS[key].make_config()
    if key.startswith(TINY_PREFIX) and key[len(TINY_PREFIX):] in TINY_FAMILIES:
        return tiny_config(key[len(TINY_PREFIX):])
    path = Path(key)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        return _config_from_file(path)
    raise UnknownNameError("model", key, model_names(), hint="or pass a path to a transformers config.json")


def _config_from_file(path: Path) -> PretrainedConfig:
    from transformers import AutoConfig

    if not path.exists():
        raise TrexError(f"model config {path} does not exist; pass a transformers config.json or one of: {', '.join(model_names())}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise TrexError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})") from None
    model_type = data.get("model_type")
    if not model_type:
        raise TrexError(f"{path}: field 'model_type' is missing; a transformers config.json names its model_type (e.g. 'deepseek_v3')")
    try:
        return AutoConfig.for_model(**data)
    except ValueError as error:
        raise TrexError(f"{path}: transformers cannot build a config for model_type {model_type!r}: {error}") from None


# ---------------------------------------------------------------------------------------------
# Tiny configurations: every structural feature, CPU-sized.

TINY_FAMILIES = ("deepseek-v4", "deepseek-v3", "qwen3-moe")


def tiny_config(family: str, *, num_experts: int = 8, top_k: int = 2, hidden_size: int = 64, num_layers: int = 4, vocab_size: int = 128) -> PretrainedConfig:
    """A tiny random-init configuration of one of the three families trex is tested on."""
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers, num_experts_per_tok=top_k)
    if family == "deepseek-v4":
        from transformers import DeepseekV4Config

        attention = ["heavily_compressed_attention", "compressed_sparse_attention"]
        return DeepseekV4Config(
            **common,
            moe_intermediate_size=hidden_size // 2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            q_lora_rank=32,
            n_routed_experts=num_experts,
            o_groups=2,
            o_lora_rank=16,
            index_n_heads=2,
            index_head_dim=16,
            index_topk=4,
            sliding_window=8,
            hc_mult=2,
            hc_sinkhorn_iters=3,
            compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
            layer_types=[attention[i % 2] for i in range(num_layers)],
            mlp_layer_types=["hash_moe"] + ["moe"] * (num_layers - 1),
        )
    if family == "deepseek-v3":
        from transformers import DeepseekV3Config

        return DeepseekV3Config(
            **common,
            intermediate_size=hidden_size * 2,
            moe_intermediate_size=hidden_size // 2,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=num_experts,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
        )
    if family == "qwen3-moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            **common,
            intermediate_size=hidden_size * 2,
            moe_intermediate_size=hidden_size // 2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=num_experts,
            norm_topk_prob=True,
        )
    raise UnknownNameError("model family", family, TINY_FAMILIES)


def build_model(config: PretrainedConfig, *, dtype: torch.dtype | None = None, seed: int = 0, device: str | torch.device = "cpu"):
    """A causal-LM with random weights for `config`; hash-routing tables get a random (seeded) map.

    On `device="meta"` nothing is allocated: that is how full-size models are captured for planning.
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype) if dtype is not None else AutoModelForCausalLM.from_config(config)
    if str(device) != "meta":
        _randomize_hash_routing(model, seed)
    return model


def _randomize_hash_routing(model, seed: int) -> None:
    """DeepSeek-V4's hash-MoE tables default to all zeros (every token to expert 0); tests need spread."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        table = getattr(module, "tid2eid", None)
        if isinstance(table, torch.Tensor):
            vocab, top_k = table.shape
            num_experts = module.num_experts
            # distinct experts per token, like a real hash table
            choice = torch.stack([torch.randperm(num_experts, generator=generator)[:top_k] for _ in range(vocab)])
            table.copy_(choice.to(table.dtype))

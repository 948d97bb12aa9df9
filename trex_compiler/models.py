"""The model catalog: every built-in model name trex knows, in one table (`MODELS`).

Every command and module that takes a model name reads this catalog: the cost model
(`get_model_spec`), its config cache, the CLI and the tests. Three kinds of entry:

* full-size transformers models (`FULL_SIZE_MODELS`): a transformers config, never weights.
  `DeepseekV4Config()` defaults are DeepSeek-V4-Flash; the others state their source next to the
  numbers. They can be priced, planned and captured on the meta device.
* priced-only models (`PRICED_ONLY_MODELS`): published shapes the cost model is validated on (Megatron
  GPT, Llama 3, Pangu Ultra, gpt-oss) held as a config dict, with no transformers class behind them
  here; they can be estimated and planned, not captured.
* tiny models (`tiny-<family>`): every structural feature of their family (V4's hash-MoE layers,
  CSA/HCA attention and mHC streams; V3's dense first layers and MLA) at sizes that train in
  milliseconds on a CPU.

Nothing here downloads anything, and importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
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
    make_config: Callable[[], PretrainedConfig] | None = None  # a transformers config: can be captured
    config: Mapping[str, object] | None = None  # a config dict only the cost model reads (priced-only)

    @property
    def capturable(self) -> bool:
        return self.make_config is not None


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
        NamedModel(
            "deepseek-v4-flash",
            "DeepSeek-V4-Flash, ~284B total / ~13B active",
            "transformers DeepseekV4Config() defaults",
            _deepseek_v4_flash,
        ),
        NamedModel(
            "deepseek-v4-pro", "DeepSeek-V4-Pro, ~1.6T total / ~49B active", "DeepSeek-V4 report", _deepseek_v4_pro
        ),
        NamedModel(
            "deepseek-v3",
            "DeepSeek-V3, 671B total / 37B active",
            "transformers DeepseekV3Config() defaults",
            _deepseek_v3,
        ),
        NamedModel("qwen3-235b-a22b", "Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B config.json", _qwen3_235b_a22b),
    )
}


_KORTHIKANTI = "Korthikanti et al. 2022, Table 1 (Megatron GPT shapes; vocab 51200, seq 2048)"
_LLAMA3 = (
    "Llama 3 report (Dubey et al. 2024), Table 3: GQA with 8 KV heads of 128, SwiGLU, RMSNorm; vocab 128256 "
    "(the released config.json), untied"
)
_GPT_OSS = (
    "gpt-oss model card (OpenAI 2025, arXiv 2508.10925) and transformers' GptOssConfig defaults: 36 layers of hidden 2880, "
    "64 query / 8 KV heads of 64 with sinks, sliding window 128 on alternate layers, 128 experts of 2880 top-4, vocab 201088, untied"
)
_PANGU = "Pangu Ultra report (Atlas 800T A2 training): 94 layers, hidden 12288, 96 query / 8 KV heads of 128, FFN 28672, sandwich norm"


def _gpt(name: str, layers: int, hidden: int, heads: int) -> NamedModel:
    config = {
        "model_type": "gpt",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "vocab_size": 51200,
        "max_position_embeddings": 2048,
    }
    return NamedModel(
        name, f"Megatron GPT {name[4:].upper()} ({layers} layers, hidden {hidden})", _KORTHIKANTI, config=config
    )


def _llama3(name: str, description: str, *, layers: int, hidden: int, heads: int, ffn: int) -> NamedModel:
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": layers,
        "vocab_size": 128256,
        "intermediate_size": ffn,
        "tie_word_embeddings": False,
    }
    return NamedModel(name, description, _LLAMA3, config=config)


PRICED_ONLY_MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        _gpt("gpt-22b", 48, 6144, 64),
        _gpt("gpt-175b", 96, 12288, 96),
        _gpt("gpt-530b", 105, 20480, 128),
        _gpt("gpt-1t", 128, 25600, 160),
        NamedModel(
            "pangu-ultra-135b",
            "Pangu Ultra 135B (dense)",
            _PANGU,
            config={
                "model_type": "pangu",
                "hidden_size": 12288,
                "num_attention_heads": 96,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "num_hidden_layers": 94,
                "vocab_size": 153376,
                "intermediate_size": 28672,
                "tie_word_embeddings": False,
                "sandwich_norm": True,
            },
        ),
        _llama3("llama3-70b", "Llama 3 70B (dense)", layers=80, hidden=8192, heads=64, ffn=28672),
        _llama3("llama3.1-405b", "Llama 3.1 405B (dense)", layers=126, hidden=16384, heads=128, ffn=53248),
        NamedModel(
            "gpt-oss-120b",
            "gpt-oss 120B, 116.8B total / 5.13B active",
            _GPT_OSS,
            config={
                "model_type": "gpt_oss",
                "hidden_size": 2880,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "num_hidden_layers": 36,
                "vocab_size": 201088,
                "intermediate_size": 2880,
                "num_local_experts": 128,
                "num_experts_per_tok": 4,
                "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"] * 18,
                "attention_bias": True,
                "tie_word_embeddings": False,
            },
        ),
    )
}

# The one catalog: every built-in name but the tiny ones (`tiny-<family>`, built by `tiny_config`).
MODELS: dict[str, NamedModel] = {**FULL_SIZE_MODELS, **PRICED_ONLY_MODELS}

TINY_PREFIX = "tiny-"


def model_names(*, include_tiny: bool = True, capturable_only: bool = False) -> list[str]:
    """Every built-in model name, optionally only those that can be captured (transformers ones)."""
    names = sorted(n for n, m in MODELS.items() if m.capturable or not capturable_only)
    return names + [TINY_PREFIX + f for f in TINY_FAMILIES] if include_tiny else names


def load_config(name_or_path: str | Path) -> PretrainedConfig:
    """A transformers config from a built-in name (full-size, or `tiny-<family>`) or a path to a
    `config.json` (or its folder)."""
    key = str(name_or_path)
    if key in FULL_SIZE_MODELS:
        return FULL_SIZE_MODELS[key].make_config()
    if key in PRICED_ONLY_MODELS:
        raise TrexError(
            f"{key!r} is a priced-only model: the cost model knows its shapes (`trex estimate`, `trex plan` take it), but trex has "
            f"no transformers class for it, so it cannot be built or captured; models that can: "
            f"{', '.join(model_names(capturable_only=True))}"
        )
    if key.startswith(TINY_PREFIX) and key[len(TINY_PREFIX) :] in TINY_FAMILIES:
        return tiny_config(key[len(TINY_PREFIX) :])
    path = Path(key)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        return _config_from_file(path)
    raise UnknownNameError("model", key, model_names(), hint="or pass a path to a transformers config.json")


# The transformers families trex's MoE capture is tested on (tiny models, grads equal to eager); other
# transformers MoE families whose experts use transformers' experts interface are captured the same way.
TESTED_FAMILIES = {"deepseek_v4": "DeepSeek-V4", "deepseek_v3": "DeepSeek-V3", "qwen3_moe": "Qwen3-MoE"}
# Families the cost model describes from their config fields alone, with no transformers class (priced-only).
PRICED_ONLY_TYPES = ("gpt", "pangu")
EXPERT_COUNT_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts")
SIZE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "intermediate_size",
    "moe_intermediate_size",
    *EXPERT_COUNT_FIELDS,
    "num_experts_per_tok",
)


def check_config_dict(data: object, source: str) -> dict:
    """The problems a user can act on in a config.json's contents, raised before transformers sees it."""
    if not isinstance(data, dict):
        raise TrexError(
            f'{source}: a config.json holds one JSON object ({{"model_type": ..., "hidden_size": ...}}), '
            f"this holds a JSON {type(data).__name__}"
        )
    model_type = data.get("model_type")
    if not model_type or not isinstance(model_type, str):
        raise TrexError(
            f"{source}: field 'model_type' is missing; a transformers config.json names its model_type "
            f"(e.g. {', '.join(repr(t) for t in TESTED_FAMILIES)})"
        )
    for field in SIZE_FIELDS:
        if field not in data or data[field] is None:
            continue
        value = data[field]
        if isinstance(value, bool) or not isinstance(value, int):
            raise TrexError(f"{source}: field {field!r} is {value!r}; it is a size and must be a positive integer")
        if value <= 0:
            raise TrexError(f"{source}: field {field!r} is {value}; it is a size and must be a positive integer")
    return data


def is_moe_config(config: object) -> bool:
    """True when the config declares routed experts (any of the families' expert-count fields > 0)."""
    get = config.get if isinstance(config, dict) else (lambda name, default=None: getattr(config, name, default))
    return any(isinstance(get(f, None), int) and get(f, None) > 0 for f in EXPERT_COUNT_FIELDS)


def read_config_dict(path: str | Path) -> dict:
    """A config.json (or its folder) as a checked dict, without importing transformers."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise TrexError(
            f"model config {path} does not exist; pass a transformers config.json or one of: {', '.join(model_names())}"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise TrexError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TrexError(f"{path}: cannot be read as a config.json ({error})") from None
    return check_config_dict(data, str(path))


def _config_from_file(path: Path) -> PretrainedConfig:
    from transformers import AutoConfig

    data = read_config_dict(path)
    model_type = data["model_type"]
    if model_type in PRICED_ONLY_TYPES:
        raise TrexError(
            f"{path}: model_type {model_type!r} is priced by the cost model (`trex estimate`/`trex plan --model {path}`), but "
            "transformers has no class for it, so it cannot be built or captured"
        )
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise TrexError(
            f"{path}: model_type {model_type!r} is not a transformers model type; trex captures transformers MoE models "
            f"(tested: {', '.join(TESTED_FAMILIES)}; other MoE families through transformers' experts interface)"
        )
    try:
        return AutoConfig.for_model(**data)
    except (ValueError, TypeError) as error:
        raise TrexError(
            f"{path}: transformers cannot build a {model_type} config from it: {str(error).splitlines()[0][:300]}"
        ) from None


# ---------------------------------------------------------------------------------------------
# Tiny configurations: every structural feature, CPU-sized.

TINY_FAMILIES = ("deepseek-v4", "deepseek-v3", "qwen3-moe")


def tiny_config(
    family: str,
    *,
    num_experts: int = 8,
    top_k: int = 2,
    hidden_size: int = 64,
    num_layers: int = 4,
    vocab_size: int = 128,
) -> PretrainedConfig:
    """A tiny random-init configuration of one of the three families trex is tested on."""
    common = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers, num_experts_per_tok=top_k
    )
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


def build_model(
    config: PretrainedConfig, *, dtype: torch.dtype | None = None, seed: int = 0, device: str | torch.device = "cpu"
):
    """A causal-LM with random weights for `config`; hash-routing tables get a random (seeded) map.

    On `device="meta"` nothing is allocated: that is how full-size models are captured for planning.
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = (
            AutoModelForCausalLM.from_config(config, dtype=dtype)
            if dtype is not None
            else AutoModelForCausalLM.from_config(config)
        )
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

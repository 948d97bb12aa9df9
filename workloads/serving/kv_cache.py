"""KV-cache bytes per sequence, read from the cost model's `ModelSpec`, per tensor-parallel rank.

What a serving engine keeps per token differs by attention family:

* grouped-query attention: K and V for every KV head (`2 * kv_heads * head_dim`); TP splits the KV
  heads over ranks while there are at least as many heads as ranks, and replicates them after.
* MLA (DeepSeek-V2/V3): the compressed latent plus the decoupled RoPE key, `kv_lora_rank +
  qk_rope_head_dim` per token, the same on every TP rank (vLLM's MLA backend caches the latent;
  DeepSeek-V2 paper Sec. 2.1.2).
* DeepSeek-V4: one shared key/value head of `head_dim` over a sliding window, plus one compressed
  entry per `compress_rate` tokens (CSA/HCA); CSA layers also cache the lightning indexer's keys
  for each compressed entry. Beyond the window the cost per token is 1/rate of a full entry.

A sliding-window layer keeps at most `window` tokens. The total for a sequence of `context` tokens
is exact for these layouts (`bytes_for(context)`), so long contexts on windowed or compressed models
are not overcharged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trex.cost_model.model_spec import LayerSpec, ModelSpec

KV_DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp32": 4.0}


@dataclass(frozen=True)
class KVTerm:
    """Bytes one layer adds: `per_token` for each kept token (all of them, or the last `window`)
    and `per_compressed` for each of the floor(context / rate) compressed entries."""

    per_token: float
    window: int | None = None
    per_compressed: float = 0.0
    rate: int | None = None

    def bytes_for(self, context: int) -> float:
        kept = context if self.window is None else min(context, self.window)
        compressed = context // self.rate if self.rate else 0
        return self.per_token * kept + self.per_compressed * compressed


@dataclass(frozen=True)
class KVLayout:
    """The KV cache of one model on one TP rank: a term per layer, and what kind of cache it is."""

    terms: tuple[KVTerm, ...]
    kind: str  # "gqa", "mla-latent", "v4-compressed"
    dtype: str
    _merged: tuple[KVTerm, ...] = field(default=(), init=False, repr=False, compare=False)
    _linear: float | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # layers with the same window and compression rate add up: price each (window, rate) class once
        merged: dict[tuple, list[float]] = {}
        for term in self.terms:
            entry = merged.setdefault((term.window, term.rate), [0.0, 0.0])
            entry[0] += term.per_token
            entry[1] += term.per_compressed
        object.__setattr__(self, "_merged", tuple(KVTerm(v[0], w, v[1], r) for (w, r), v in merged.items()))
        plain = all(w is None and r is None for w, r in merged)  # every layer keeps every token: bytes are linear
        object.__setattr__(self, "_linear", sum(v[0] for v in merged.values()) if plain else None)

    def bytes_for(self, context: int) -> float:
        if self._linear is not None:
            return self._linear * context
        return sum(term.bytes_for(context) for term in self._merged)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "dtype": self.dtype, "terms": [vars(term) for term in self.terms]}

    @staticmethod
    def from_dict(data: dict) -> KVLayout:
        return KVLayout(tuple(KVTerm(**term) for term in data["terms"]), data["kind"], data["dtype"])

    def bytes_per_token(self, context: int) -> float:
        """Average bytes per token at this context (falls with context on windowed/compressed models)."""
        return self.bytes_for(context) / max(context, 1)


def _linear(layer: LayerSpec, name: str):
    return next((lin for lin in layer.linears if lin.name == name), None)


def _layer_term(layer: LayerSpec, tp: int, element: float) -> KVTerm | None:
    cores = [core for core in layer.attention if core.v_head_dim > 0]
    if not cores:
        return None
    core = cores[0]
    latent = _linear(layer, "kv_a_proj")
    if latent is not None:  # MLA: the latent and the RoPE key, replicated over TP
        return KVTerm(latent.out_features * element, core.window)
    shared = _linear(layer, "kv_proj")
    if shared is not None and shared.out_features == core.qk_head_dim and core.kv_heads == 1:  # V4: one shared K=V head
        per_token = core.qk_head_dim * element
        compressed = per_token if core.compress_rate else 0.0
        indexers = [c for c in layer.attention if c.v_head_dim == 0 and c.compress_rate]
        compressed += sum(c.kv_heads * c.qk_head_dim * element for c in indexers)
        return KVTerm(per_token, core.window, compressed, core.compress_rate)
    heads_per_rank = max(1, core.kv_heads // tp)
    return KVTerm(heads_per_rank * (core.qk_head_dim + core.v_head_dim) * element, core.window)


def kv_layout(spec: ModelSpec, tp: int = 1, dtype: str = "bf16") -> KVLayout:
    if dtype not in KV_DTYPE_BYTES:
        from trex.workloads.serving.errors import ServingError

        raise ServingError(f"unknown KV-cache dtype {dtype!r}; use one of {', '.join(KV_DTYPE_BYTES)}")
    element = KV_DTYPE_BYTES[dtype]
    terms = tuple(term for layer in spec.layers if (term := _layer_term(layer, tp, element)) is not None)
    if spec.family == "deepseek-v4":
        kind = "v4-compressed"
    elif any(_linear(layer, "kv_a_proj") for layer in spec.layers):
        kind = "mla-latent"
    else:
        kind = "gqa"
    return KVLayout(terms, kind, dtype)

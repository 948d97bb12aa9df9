"""Local transformers model whose forward passes run through `trex.compile`.

The model and tokenizer are loaded from a local directory only (never downloaded). With
`compile=True` (the default) the model goes through `trex.compile(model, target=..., backend=...)`,
which returns a module with the model's call signature; decoding then calls that module, so the
evaluation exercises exactly what the compiler produced. `compile=False` runs the plain model
(the reference the compiled one is compared against).

Decoding is written here rather than taken from `model.generate`, because the compiled module
has the model's forward signature, not its generation API: batched, left-padded prompts with
explicit `position_ids`, greedy (temperature 0) or temperature/top-p sampling from a seeded
generator, stopping at the tokenizer's end-of-sequence tokens or `max_new_tokens`. With
`use_cache=True` it feeds one token per step and the KV cache; with `use_cache=False` it recomputes
the whole sequence each step (slower, but needs nothing from the compiled module beyond logits).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trex.workloads.llm_clients.base import Completion, GenerationRequest
from trex.workloads.llm_clients.errors import ClientError


class TransformersClient:
    persist_generations = True

    def __init__(
        self,
        model_path: str | Path,
        *,
        compile: bool = True,
        target: str = "cpu",
        backend: str = "eager",
        device: str = "cpu",
        dtype: str = "float32",
        max_new_tokens: int = 2048,
        temperature: float = 0.0,
        top_p: float = 1.0,
        batch_size: int = 4,
        use_cache: bool = True,
        chat: bool | None = None,
        seed: int = 0,
        model: Any = None,
        tokenizer: Any = None,
    ):
        import torch

        self.model_path = str(model_path)
        self.compile, self.target, self.backend = compile, target, backend
        self.device = torch.device(device)
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.batch_size, self.use_cache, self.seed = batch_size, use_cache, seed
        if model is None or tokenizer is None:
            model, tokenizer = self._load(dtype)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        if compile:
            # trex.compile specialises its graphs to their shapes (the cost model prices concrete sizes), and a
            # KV cache grows by one token a step: every step would be a new graph. Compiled decoding therefore
            # recomputes the sequence, left-padded to a power-of-two length, so a few graphs serve every step.
            self.use_cache = False
        self.forward = self._compiled() if compile else self.model
        # transformers 5 names the KV cache `cache`; earlier versions `past_key_values`
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"

    def _load(self, dtype: str) -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not Path(self.model_path).is_dir():
            raise ClientError(f"model path {self.model_path} is not a directory (models are never downloaded)")
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                self.model_path, local_files_only=True, dtype=getattr(torch, dtype)
            )
        except (OSError, ValueError) as error:
            raise ClientError(f"cannot load a causal LM from {self.model_path}: {error}") from None
        return model, tokenizer

    def _compiled(self) -> Any:
        import torch

        import trex

        # One graph per (length bucket, batch size): 32..8192 tokens and a smaller last batch stay within it.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 24)
        compile_fn = getattr(trex, "compile", None)
        if compile_fn is None:
            raise ClientError("trex.compile is not available in this trex build; pass compile=False (--no-compile)")
        return compile_fn(self.model, target=self.target, backend=self.backend)

    def identity(self) -> dict:
        return {
            "client": "transformers",
            "model_path": self.model_path,
            "compile": self.compile,
            "target": self.target,
            "backend": self.backend,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
        }

    def render(self, prompt: str) -> str:
        if self.chat:
            messages = [{"role": "user", "content": prompt}]
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return prompt

    def generate(self, requests: Sequence[GenerationRequest]) -> Iterator[Completion]:
        for start in range(0, len(requests), self.batch_size):
            batch = requests[start : start + self.batch_size]
            texts = self.generate_texts([self.render(request.prompt) for request in batch], seed_offset=start)
            for request, text in zip(batch, texts, strict=True):
                yield Completion(key=request.key, text=text)

    def generate_texts(self, prompts: list[str], seed_offset: int = 0) -> list[str]:
        tokens = self.generate_tokens(prompts, seed_offset)
        return [self.tokenizer.decode(row, skip_special_tokens=True) for row in tokens]

    def generate_tokens(self, prompts: list[str], seed_offset: int = 0) -> list[list[int]]:
        """New token ids per prompt (without the prompt, up to and including a stop token)."""
        import torch

        self.tokenizer.padding_side = "left"
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not self.chat)
        input_ids = encoded["input_ids"].to(self.device)
        attention = encoded["attention_mask"].to(self.device)
        generator = torch.Generator(device="cpu").manual_seed(self.seed + seed_offset)
        batch = input_ids.shape[0]
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        new_tokens: list[list[int]] = [[] for _ in range(batch)]
        past = None
        step_ids = input_ids
        with torch.no_grad():
            for _ in range(self.max_new_tokens):
                positions = (attention.cumsum(-1) - 1).clamp(min=0)
                if self.use_cache and past is not None:
                    positions = positions[:, -1:]
                kwargs: dict[str, Any] = {"input_ids": step_ids, "attention_mask": attention, "position_ids": positions}
                if self.compile:
                    kwargs.update(_left_padded_to_bucket(step_ids, attention, positions, self.tokenizer.pad_token_id))
                if self.use_cache:
                    kwargs.update({self._cache_arg: past, "use_cache": True})
                else:
                    kwargs["use_cache"] = False
                output = self.forward(**kwargs)
                logits = output.logits if hasattr(output, "logits") else output[0]
                if self.use_cache:
                    past = getattr(output, self._cache_arg)
                next_token = self._choose(logits[:, -1, :].float(), generator)
                next_token = torch.where(finished, torch.full_like(next_token, self.tokenizer.pad_token_id), next_token)
                for row in range(batch):
                    if not finished[row]:
                        new_tokens[row].append(int(next_token[row]))
                finished |= torch.isin(next_token, torch.tensor(self.eos_ids, device=self.device))
                if bool(finished.all()):
                    break
                attention = torch.cat([attention, attention.new_ones((batch, 1))], dim=-1)
                step_ids = (
                    next_token.unsqueeze(-1) if self.use_cache else torch.cat([step_ids, next_token.unsqueeze(-1)], -1)
                )
        return new_tokens

    def _choose(self, logits: Any, generator: Any) -> Any:
        import torch

        if self.temperature <= 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            keep = sorted_probs.cumsum(-1) - sorted_probs < self.top_p  # always keeps the top token
            sorted_probs = sorted_probs * keep
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        sample = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1)
        return sample.to(logits.device)

    def close(self) -> None:
        pass


def _left_padded_to_bucket(ids: Any, attention: Any, positions: Any, pad_id: int, smallest: int = 32) -> dict[str, Any]:
    """The step's inputs left-padded (masked out) to the next power-of-two length: same logits at the last
    position, and a handful of distinct shapes for the compiled graph instead of one per step."""
    import torch

    length = ids.shape[1]
    bucket = max(smallest, 1 << (length - 1).bit_length())
    pad = bucket - length
    if pad == 0:
        return {"input_ids": ids, "attention_mask": attention, "position_ids": positions}
    rows = ids.shape[0]
    return {
        "input_ids": torch.cat([ids.new_full((rows, pad), pad_id), ids], dim=-1),
        "attention_mask": torch.cat([attention.new_zeros((rows, pad)), attention], dim=-1),
        "position_ids": torch.cat([positions.new_zeros((rows, pad)), positions], dim=-1),
    }


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for value in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if not ids:
        raise ClientError("the tokenizer defines no end-of-sequence token; cannot tell when generation ends")
    return sorted(ids)

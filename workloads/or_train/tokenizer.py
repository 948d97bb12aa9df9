"""The tokenizer a training run uses: a transformers tokenizer directory, or trex's built-in byte tokenizer.

Tiny random models have no tokenizer of their own, so trex ships one that needs no download and no
training: every UTF-8 byte is a token (256 ids, byte-level so any text round-trips exactly), plus
the chat's special tokens. It is a real `PreTrainedTokenizerFast` with a chat template, so it is
saved next to the exported model (`save_pretrained`) and `trex eval --client transformers` reads
both back with `AutoTokenizer` like any other checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trex.errors import TrexError

BUILTIN = "byte"
BOS, EOS, PAD = "<|begin|>", "<|end|>", "<|pad|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}

# A message is its role token, its content and the end token; the generation prompt is the assistant's role token.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def byte_tokenizer() -> Any:
    """The built-in byte-level tokenizer (256 byte tokens + 6 special tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins of the bytes
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    specials = [BOS, EOS, PAD, *ROLE_TOKENS.values()]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, additional_special_tokens=specials[3:]
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def load_tokenizer(spec: str) -> Any:
    """`spec`: "byte" (built-in) or a directory holding a transformers tokenizer (never downloaded)."""
    if spec == BUILTIN:
        return byte_tokenizer()
    path = Path(spec)
    if not path.is_dir():
        raise TrexError(
            f"--tokenizer {spec}: not a directory; pass a local transformers tokenizer directory, or "
            f"'{BUILTIN}' for trex's built-in byte-level tokenizer (tokenizers are never downloaded)"
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as error:
        raise TrexError(f"--tokenizer {spec}: cannot load a tokenizer from it: {error}") from None
    if tokenizer.eos_token_id is None:
        raise TrexError(f"--tokenizer {spec}: the tokenizer has no end-of-sequence token; documents need one")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def vocabulary_size(tokenizer: Any) -> int:
    return len(tokenizer)

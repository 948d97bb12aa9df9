"""Deterministic random streams: one `random.Random` per (run seed, sample index, purpose).

A sample is a pure function of the run seed and its index, whichever worker makes it and
whenever (resumed runs, any `--workers`). Purposes ("data", "text", "what_if", ...) get
separate streams so that drawing one more number for a statement never shifts the data of the
instance. SHA-256 is used, not `hash()`, which Python randomizes per process.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def stream(seed: int, index: int, purpose: str) -> random.Random:
    digest = hashlib.sha256(f"trex-or-data:{seed}:{index}:{purpose}".encode()).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


def balanced(seed: int, index: int, options: Sequence[T], purpose: str) -> T:
    """`options[k]` such that every block of `len(options)` consecutive indices uses each
    option once, in an order shuffled per block: balanced counts without a fixed rhythm."""
    block, position = divmod(index, len(options))
    order = list(range(len(options)))
    stream(seed, block, f"balanced:{purpose}").shuffle(order)
    return options[order[position]]

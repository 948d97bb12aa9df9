"""Exact and near-duplicate removal.

Exact duplicates: the SHA-256 of the text with case and whitespace normalized.

Near duplicates: MinHash over word 5-gram shingles (Broder 1997) with 128 hash functions,
indexed by locality-sensitive hashing in 32 bands of 4 rows; a text whose estimated Jaccard
similarity with an already kept text is at least `threshold` (default 0.8) is a near duplicate.
A pair at similarity 0.8 shares a band with probability 1 - (1 - 0.8^4)^32 > 0.9999, so misses
come only from the estimate's spread (standard deviation about 0.035 at 128 hashes).

The index keeps the first text of a group; feeding texts in sample order makes the result
deterministic.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

SHINGLE = 5
HASHES = 128
BANDS = 32
ROWS = HASHES // BANDS
_PRIME = (1 << 31) - 1  # Mersenne prime: a * x + b < 2^62 fits in uint64
_WORD = re.compile(r"\w+")


def normalized(text: str) -> str:
    return " ".join(text.lower().split())


def exact_key(text: str) -> str:
    return hashlib.sha256(normalized(text).encode()).hexdigest()


def _shingles(text: str) -> np.ndarray:
    """The distinct shingles' 8-byte BLAKE2b digests (big-endian) mod 2^31 - 1, hashed in one pass
    and reduced by numpy."""
    tokens = _WORD.findall(text.lower())
    grams = {" ".join(tokens[i : i + SHINGLE]) for i in range(max(1, len(tokens) - SHINGLE + 1))}
    blake2b = hashlib.blake2b
    digests = b"".join([blake2b(gram.encode(), digest_size=8).digest() for gram in grams])
    return np.frombuffer(digests, dtype=">u8").astype(np.uint64) % np.uint64(_PRIME)


_generator = np.random.default_rng(20240521)  # fixed: signatures must be comparable across runs
_A = _generator.integers(1, _PRIME, size=HASHES, dtype=np.uint64)
_B = _generator.integers(0, _PRIME, size=HASHES, dtype=np.uint64)


def minhash(text: str) -> np.ndarray:
    """128 MinHash values of the text's word 5-gram shingles, by universal hashing
    `(a * x + b) mod (2^31 - 1)`."""
    x = _shingles(text)[:, None]
    return ((x * _A[None, :] + _B[None, :]) % np.uint64(_PRIME)).min(axis=0)


@dataclass
class NearDuplicateIndex:
    threshold: float = 0.8
    signatures: list[np.ndarray] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    buckets: dict[tuple[int, bytes], list[int]] = field(default_factory=dict)

    def find(self, signature: np.ndarray) -> tuple[str, float] | None:
        """The first kept text this signature nearly duplicates, with the estimated similarity."""
        seen: set[int] = set()
        for band in range(BANDS):
            key = (band, signature[band * ROWS : (band + 1) * ROWS].tobytes())
            for position in self.buckets.get(key, ()):
                if position in seen:
                    continue
                seen.add(position)
                similarity = float(np.mean(self.signatures[position] == signature))
                if similarity >= self.threshold:
                    return self.ids[position], similarity
        return None

    def add(self, item_id: str, signature: np.ndarray) -> None:
        position = len(self.signatures)
        self.signatures.append(signature)
        self.ids.append(item_id)
        for band in range(BANDS):
            self.buckets.setdefault((band, signature[band * ROWS : (band + 1) * ROWS].tobytes()), []).append(position)

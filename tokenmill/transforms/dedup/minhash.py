"""MinHash signatures (datasketch's scheme, computed in blocks) and the Jaccard estimates."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import xxhash

from tokenmill.transforms.dedup.text import token_bytes, utf8

# Shingles go through the permutations in slices whose (slice x num_perm) uint32 block is at
# most this big: under glibc's 128 KiB mmap threshold (tokenmill.memory), so a long document's
# block is neither mmapped nor faulted in afresh, and it stays in cache.
_BLOCK_BYTES = 96 * 1024


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer, as datasketch applies it before its affine32 permutations."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's affine32 permutations h -> a * h + b (mod 2^32), a odd: its own draw,
    repeated here because importing datasketch (it loads scipy) cost every worker 0.4 s;
    tests/test_dedup.py checks the signatures against datasketch's MinHash bit for bit."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


class MinHasher:
    """MinHash signatures as bytes (``num_perm`` little uint32): datasketch's ``MinHash`` with
    xxh32 (several times faster than its default sha1) and its affine32 scheme, bit for bit.

    The permutations are datasketch's affine32 ones, drawn as its ``MinHash._init_permutations``
    draws them (``permutations``); the arithmetic is done here, faster than
    ``MinHash.update_batch`` per document (bench/MEASUREMENTS.md: MinHash arithmetic): no MinHash
    object per document, shingle hashes gathered in one pass, fixed-size slices.
    """

    def __init__(self, num_perm: int, seed: int = 1):
        self.num_perm = num_perm
        self._a, self._b = permutations(num_perm, seed)
        self._slice = max(1, _BLOCK_BYTES // (4 * num_perm))

    def signature(self, shingle_list: list[str] | list[bytes]) -> bytes | None:
        """None for no shingles: an empty text has no near-duplicates (only exact ones)."""
        if not shingle_list:
            return None
        if isinstance(shingle_list[0], str):
            shingle_list = [utf8(s) for s in shingle_list]
        hv = _fmix32(np.fromiter(map(xxhash.xxh32_intdigest, shingle_list), np.uint32, len(shingle_list)))
        sig = np.full(self.num_perm, np.iinfo(np.uint32).max, dtype=np.uint32)
        scratch = np.empty((min(len(hv), self._slice), self.num_perm), dtype=np.uint32)
        for i in range(0, len(hv), self._slice):
            part = hv[i : i + self._slice]
            block = scratch[: len(part)]
            np.multiply.outer(part, self._a, out=block)  # uint32 arithmetic wraps, as in datasketch
            block += self._b
            np.minimum(sig, block.min(axis=0), out=sig)
        return sig.astype("<u4", copy=False).tobytes()

    def text_signature(self, text: str | None, n: int) -> bytes | None:
        """``signature(shingles(tokens(text), n))``, faster: the shingles are built as bytes
        (same bytes, same signature)."""
        return self.lower_text_signature((text or "").lower(), n)

    def lower_text_signature(self, low: str, n: int) -> bytes | None:
        btoks = token_bytes(low)
        if not btoks:
            return None
        if len(btoks) < n:
            return self.signature([b" ".join(btoks)])
        return self.signature(list(map(b" ".join, zip(*(btoks[i:] for i in range(n))))))


def jaccard_estimate(sig_a: bytes, sig_b: bytes) -> float:
    """Fraction of equal MinHash values: an unbiased estimate of the shingle-set Jaccard."""
    a = np.frombuffer(sig_a, dtype="<u4")
    b = np.frombuffer(sig_b, dtype="<u4")
    return float(np.count_nonzero(a == b)) / len(a)


def exact_jaccard(a: Iterable[str], b: Iterable[str]) -> float:
    sa, sb = set(a), set(b)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)

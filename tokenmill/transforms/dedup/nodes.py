"""The small record a document leaves for dedup: its node key and MinHash signature. Dedup
decides on these alone; the document itself waits in the candidate files (pipelines/buckets)."""

from __future__ import annotations

from typing import Any, NamedTuple

from tokenmill.config import DedupConfig
from tokenmill.transforms.dedup.minhash import MinHasher
from tokenmill.transforms.dedup.survivor import node_key
from tokenmill.transforms.dedup.text import exact_hash_lower


class Node(NamedTuple):
    key: bytes  # survivor order, ending in the exact hash h (survivor.node_key)
    sig: bytes | None  # None: near-duplicate detection is off, or the text has no word


def takes_part(doc: dict[str, Any]) -> bool:
    # A document dropped by an earlier stage takes no part, and neither does a text with
    # nothing but whitespace, which has no content to duplicate (calling a run of empty pages
    # "exact duplicates" would hide that they are empty; the quality filters drop them for
    # what they are).
    return not doc.get("dropped_by") and bool((doc.get("text") or "").strip())


class Recorder:
    """doc -> its ``Node`` (or None when it takes no part); one per worker (it holds the
    MinHash permutations)."""

    def __init__(self, cfg: DedupConfig):
        self._cfg = cfg
        self._hasher: MinHasher | None = None  # made on first use: refilter reuses stored signatures

    def _signature(self, low: str) -> bytes:
        if self._hasher is None:
            self._hasher = MinHasher(self._cfg.bands * self._cfg.rows, self._cfg.seed)
        return self._hasher.lower_text_signature(low, self._cfg.ngram)

    def __call__(self, doc: dict[str, Any]) -> Node | None:
        if not self._cfg.enabled or not takes_part(doc):
            return None
        low = doc["text"].lower()
        key = node_key(doc, exact_hash_lower(low), self._cfg.survivor, self._cfg.quality_field)
        # Every document is a node, exact copies too: copies share a signature, so LSH puts them
        # in one component, and the join by h sorts out which of them is exact. That spares a
        # shuffle of every node by h before LSH; the text is at hand here anyway.
        sig = None
        if self._cfg.near:
            sig = doc.get("minhash") or self._signature(low)  # stored by a tag-mode run (refilter)
        return Node(key, sig)

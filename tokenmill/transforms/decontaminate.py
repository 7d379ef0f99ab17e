"""Decontamination: documents that hold a word n-gram of an evaluation item (GPT-3's 13-gram
overlap) are dropped as ``decontaminate:overlap``, or, with ``mode: cut``, lose the overlapping
words. The user brings the evaluation files; nothing is downloaded.

Words are dedup's tokens (``\\w+`` runs, lower-cased, digits folded to 0), so punctuation,
case and numbers do not hide a copy. An item shorter than ``n`` words is matched whole, as in
GPT-3, if it has at least ``min_words``. The items' n-grams become 64-bit polynomial hashes
in a sorted array, each with a bit per evaluation file: a few MB for a benchmark suite, the same
on every worker, and a document is checked with one vectorised search per gram length.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.config import DecontaminateConfig
from tokenmill.errors import UserError
from tokenmill.transforms.dedup.text import has_tokens
from tokenmill.transforms.dedup.text import token_spans as words
from tokenmill.transforms.doc import drop
from tokenmill.transforms.stage_base import Stage, StageFn, check, count
from tokenmill.transforms.userfiles import texts

STAGE = "decontaminate"
_P = np.uint64(0x100000001B3)  # FNV's 64-bit prime: the polynomial's base (odd, so no bits are lost)
_M1, _M2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)  # murmur3's finaliser


def _word_hashes(toks: list[str]) -> np.ndarray:
    import xxhash

    return np.fromiter((xxhash.xxh3_64_intdigest(t.encode("utf-8", "surrogatepass")) for t in toks),
                       dtype=np.uint64, count=len(toks))


def gram_hashes(word_hashes: np.ndarray, k: int) -> np.ndarray:
    """One 64-bit hash per window of ``k`` consecutive words (none when there are fewer)."""
    m = len(word_hashes) - k + 1
    if m <= 0:
        return np.empty(0, dtype=np.uint64)
    with np.errstate(over="ignore"):
        acc = np.zeros(m, dtype=np.uint64)
        for j in range(k):  # sum of word_hash[i + j] * P^(k-1-j), mod 2^64
            acc = acc * _P + word_hashes[j : j + m]
        acc ^= acc >> np.uint64(33)
        acc *= _M1
        acc ^= acc >> np.uint64(33)
        acc *= _M2
        return acc ^ (acc >> np.uint64(33))


class EvalGrams:
    """The evaluation items' grams per length: sorted hashes and, for each, a bit mask of the
    files it came from (``names[i]`` is bit i)."""

    def __init__(self, names: list[str], n: int):
        self.names, self.n = names, n
        self.by_length: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.items = [0] * len(names)

    @classmethod
    def build(cls, items_per_file: list[tuple[str, list[str]]], n: int, min_words: int) -> EvalGrams:
        grams = cls([name for name, _ in items_per_file], n)
        parts: dict[int, list[tuple[np.ndarray, int]]] = {}
        for i, (_, items) in enumerate(items_per_file):
            for item in items:
                toks, _ = words(item)
                k = n if len(toks) >= n else len(toks)
                if k < min(min_words, n):
                    continue
                grams.items[i] += 1
                parts.setdefault(k, []).append((gram_hashes(_word_hashes(toks), k), i))
        for k, chunks in parts.items():
            hashes = np.concatenate([h for h, _ in chunks])
            masks = np.concatenate([np.full(len(h), 1 << i, dtype=np.uint64) for h, i in chunks])
            order = np.argsort(hashes, kind="stable")
            hashes, masks = hashes[order], masks[order]
            # One entry per hash, with the files of all its copies.
            starts = np.flatnonzero(np.r_[True, hashes[1:] != hashes[:-1]])
            grams.by_length[k] = (hashes[starts], np.bitwise_or.reduceat(masks, starts))
        return grams

    def matches(self, toks: list[str]) -> tuple[list[tuple[int, int]], int]:
        """The matched word ranges [start, end) of a document, and the mask of files they hit."""
        ranges: list[tuple[int, int]] = []
        mask = 0
        if not self.by_length:
            return ranges, mask
        wh = _word_hashes(toks)
        for k, (hashes, masks) in self.by_length.items():
            g = gram_hashes(wh, k)
            if not len(g):
                continue
            pos = np.minimum(np.searchsorted(hashes, g), len(hashes) - 1)
            hit = np.flatnonzero(hashes[pos] == g)
            if len(hit):
                ranges.extend((int(i), int(i) + k) for i in hit)
                mask |= int(np.bitwise_or.reduce(masks[pos[hit]]))
        return ranges, mask

    def files(self, mask: int) -> list[str]:
        return [name for i, name in enumerate(self.names) if mask >> i & 1]


def load(cfg: DecontaminateConfig) -> EvalGrams:
    """The grams of every file in ``cfg.files`` (named by their base names, made unique)."""
    names: list[str] = []
    per_file = []
    for path in cfg.files:
        name = os.path.basename(path.rstrip("/")) or path
        while name in names:
            name += "'"
        names.append(name)
        per_file.append((name, list(texts(path, cfg.fields, "decontaminate.files"))))
    return EvalGrams.build(per_file, cfg.n, cfg.min_words)


def cut(text: str, spans: list[tuple[int, int]], ranges: list[tuple[int, int]]) -> str:
    """``text`` without the characters of the matched word ranges (from a range's first word to
    its last); overlapping ranges are merged, and each cut leaves one space."""
    out, at = [], 0
    merged: list[list[int]] = []
    for start, end in sorted((spans[a][0], spans[b - 1][1]) for a, b in ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    for start, end in merged:
        out += [text[at:start], " "]
        at = end
    out.append(text[at:])
    return "".join(out)


def decontaminate(doc: dict[str, Any], grams: EvalGrams, mode: str, deadline: float | None = None) -> dict[str, Any]:
    """The pure core: marks, cuts or drops ``doc``; ``decontaminated`` lists the files it hit.
    ``deadline`` (time.monotonic()) is checked between the passes: past it, ``deadline.Timeout``."""
    toks, spans = words(doc.get("text") or "")
    check(deadline)
    ranges, mask = grams.matches(toks)
    if not ranges:
        return doc
    check(deadline)
    doc["decontaminated"] = grams.files(mask)
    if mode == "drop":
        return drop(doc, STAGE, "overlap")
    doc["text"] = cut(doc["text"], spans, ranges)
    count(f"{STAGE}.cut_words", len({w for a, b in ranges for w in range(a, b)}))
    return drop(doc, STAGE, "overlap") if not has_tokens(doc["text"]) else doc


class DecontaminateFn(StageFn):
    stage = STAGE

    def setup(self):
        self._grams = load(self.cfg)

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        doc = decontaminate(doc, self._grams, self.cfg.mode, self.deadline)
        for name in doc.get("decontaminated") or ():
            count(f"{STAGE}.file.{name}")
        return doc


def _check(cfg: DecontaminateConfig, job) -> None:
    if not any(load(cfg).items):
        raise UserError(f"decontaminate.files: no item of {cfg.min_words}+ words in fields "
                        f"{', '.join(cfg.fields)} of {', '.join(cfg.files)}")


def _refilter_check(new: dict, old: dict, src: str) -> None:
    if old["enabled"] and old["mode"] == "cut":
        raise UserError(f"refilter: {src}'s texts had evaluation overlaps cut; refilter a run with mode drop")


# refilter runs it again on the stored text, which is the text it runs on (after PII redaction).
SPEC = Stage(STAGE, "decontaminate", DecontaminateFn, fields=lambda cfg: [pa.field("decontaminated", pa.list_(pa.string()))],
             check=_check, refilter="rerun", derived=("decontaminated",), refilter_check=_refilter_check,
             reads=lambda cfg: {"decontaminate.files": cfg.files})

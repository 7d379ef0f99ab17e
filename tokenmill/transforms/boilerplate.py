"""Boilerplate lines across documents: a line (normalised) found in at least ``min_docs``
documents of the corpus, or ``min_docs_domain`` of one domain, is cut from every document
(cookie banners, "All rights reserved", navigation that extraction left in).

Counting is one pass in the clean phase into a count-min sketch of fixed size: each document
adds the hashes of its distinct lines (and of its domain + line), and the workers' sketches are
summed. The finish phase reads the sketch as a side input and cuts lines whose estimate
reaches the threshold. Memory is the sketch (``depth`` x ``width`` uint32), whatever the corpus;
the price is over-counting: a cell also counts the lines that collide with it, so a rare line
can look common once the corpus has many more line occurrences than the sketch has cells
(the expected excess is occurrences / 2**sketch_bits per row, the minimum of four rows is
taken); size ``sketch_bits`` to the corpus. Copies of one page would make all its lines look
common, so a document's own duplicates (its ``dup_cluster_size`` - 1) are not counted for it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import apache_beam as beam
import numpy as np
import pyarrow as pa
import xxhash

from tokenmill.config import BoilerplateConfig
from tokenmill.errors import UserError
from tokenmill.transforms.stage_base import Stage, Stash

STAGE = "boilerplate"
LINES = "lines"  # the clean phase's output of line keys (pipelines/phases.StashFn)
DEPTH = 4
# Odd 64-bit multipliers, one per row (multiply-shift hashing of the 64-bit line hash).
_MULT = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93],
                 dtype=np.uint64)


def _norm(line: str) -> str:
    return " ".join(line.lower().split())


def _domain(url: str | None) -> str:
    try:
        host = (urlsplit(url).hostname or "") if url and "://" in url else ""
    except ValueError:  # a malformed URL (an unclosed IPv6 bracket, ...) has no domain to count
        return ""
    return host[4:] if host.startswith("www.") else host


def _keys(lines: list[str], domain: str) -> tuple[np.ndarray, np.ndarray]:
    """The sketch keys of normalised lines: corpus-wide, and within ``domain`` (none without one).
    Counting (line_keys) and cutting (strip) both derive them here, so they always agree."""
    enc = [line.encode("utf-8", "surrogatepass") for line in lines]
    corpus = np.array([xxhash.xxh3_64_intdigest(e) for e in enc], dtype=np.uint64)
    prefix = domain.encode("utf-8", "surrogatepass") + b"\x00"
    in_domain = np.array([xxhash.xxh3_64_intdigest(prefix + e) for e in enc] if domain else [], dtype=np.uint64)
    return corpus, in_domain


def line_keys(doc: dict[str, Any], min_chars: int) -> np.ndarray:
    """The sketch keys of a document: each distinct line of ``min_chars``+ characters, and the
    same line within the document's domain (when it has a URL)."""
    lines = sorted({n for line in (doc.get("text") or "").split("\n") if len(n := _norm(line)) >= min_chars})
    if not lines:
        return np.empty(0, dtype=np.uint64)
    return np.concatenate(_keys(lines, _domain(doc.get("url"))))


def _cells(keys: np.ndarray, bits: int) -> np.ndarray:
    """(DEPTH, n) cell indices of the keys, one row per hash function."""
    with np.errstate(over="ignore"):
        return ((keys[None, :] * _MULT[:, None]) >> np.uint64(64 - bits)).astype(np.int64)


class Sketch:
    """A count-min sketch of ``2**bits`` cells per row. Plain updates (cells add counts), not
    conservative ones: sums of partial sketches then equal the sketch of the whole corpus, so
    the result does not depend on how a runner bundles and merges."""

    def __init__(self, bits: int, table: np.ndarray | None = None, added: int = 0):
        self.bits = bits
        self.table = table if table is not None else np.zeros((DEPTH, 1 << bits), dtype=np.uint32)
        self.added = added

    def add(self, keys: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Counts the keys (each once, or ``counts`` times); never under-counts."""
        if not len(keys):
            return
        counts = np.ones(len(keys), dtype=np.int64) if counts is None else counts
        cells = _cells(keys, self.bits)
        for r in range(DEPTH):
            self.table[r] += np.bincount(cells[r], weights=counts, minlength=len(self.table[r])).astype(np.uint32)
        self.added += int(counts.sum())

    def estimate(self, keys: np.ndarray) -> np.ndarray:
        if not len(keys):
            return np.zeros(0, dtype=np.uint32)
        return self.table[np.arange(DEPTH)[:, None], _cells(keys, self.bits)].min(axis=0)

    def merge(self, other: Sketch) -> None:
        self.table += other.table
        self.added += other.added


def _weighted(keys: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys and their summed counts."""
    if not keys:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    uniq, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    return uniq, np.bincount(inverse, weights=np.concatenate(counts), minlength=len(uniq)).astype(np.int64)


class SketchFn(beam.CombineFn):
    """Every document's line keys -> one Sketch. An accumulator stays sparse (distinct keys and
    their counts, the size of what a bundle saw) until it would outgrow the dense table: a
    bundle's partial result is not 64 MB, and the final merge holds one table."""

    def __init__(self, bits: int):
        self._bits = bits
        self._sparse_max = (DEPTH << bits) // 3  # keys + counts (16 B) vs 4 x 4 B cells

    def create_accumulator(self):
        return [np.empty(0, np.uint64), np.empty(0, np.int64), []]  # keys, counts, pending key arrays

    def _sparse(self, acc):
        if acc[2]:
            pending = np.concatenate(acc[2])
            acc[:] = [*_weighted([acc[0], pending], [acc[1], np.ones(len(pending), np.int64)]), []]
        return acc

    def add_input(self, acc, keys):
        if isinstance(acc, Sketch):
            acc.add(keys)
            return acc
        acc[2].append(keys)
        if sum(map(len, acc[2])) >= 1 << 16:
            self._sparse(acc)
            if len(acc[0]) > self._sparse_max:
                return self._dense(acc)
        return acc

    def _dense(self, acc) -> Sketch:
        if isinstance(acc, Sketch):
            return acc
        sketch = Sketch(self._bits)
        self._sparse(acc)
        sketch.add(acc[0], acc[1])
        return sketch

    def merge_accumulators(self, accs):
        out = None
        for acc in accs:
            if not isinstance(acc, Sketch):
                self._sparse(acc)
            if out is None:
                out = acc
            elif isinstance(out, Sketch) or isinstance(acc, Sketch) or len(out[0]) + len(acc[0]) > self._sparse_max:
                out = self._dense(out)
                if isinstance(acc, Sketch):
                    out.merge(acc)
                else:
                    out.add(acc[0], acc[1])
            else:
                out[:] = [*_weighted([out[0], acc[0]], [out[1], acc[1]]), []]
        return out if out is not None else self.create_accumulator()

    def compact(self, acc):
        return acc if isinstance(acc, Sketch) else self._sparse(acc)

    def extract_output(self, acc):
        return self._dense(acc)


def strip(doc: dict[str, Any], sketch: Sketch, cfg: BoilerplateConfig) -> tuple[int, int]:
    """Cuts the document's boilerplate lines in place; returns (lines, characters) cut. The
    copies of the document that dedup found (``dup_cluster_size`` - 1) are taken off each count:
    they hold its lines too, and they were counted before dedup ran."""
    copies = max(0, (doc.get("dup_cluster_size") or 1) - 1)
    text = doc.get("text") or ""
    lines = text.split("\n")
    norms = [_norm(line) for line in lines]
    candidates = sorted({n for n in norms if len(n) >= cfg.min_chars})
    if not candidates:
        return 0, 0
    corpus, in_domain = _keys(candidates, _domain(doc.get("url")) if cfg.min_docs_domain else "")
    common = {n for n, c in zip(candidates, sketch.estimate(corpus).tolist()) if c - copies >= cfg.min_docs}
    if len(in_domain):
        common |= {n for n, c in zip(candidates, sketch.estimate(in_domain).tolist()) if c - copies >= cfg.min_docs_domain}
    if not common:
        return 0, 0
    kept = [line for line, n in zip(lines, norms) if n not in common]
    cut = [line for line, n in zip(lines, norms) if n in common]
    doc["text"] = "\n".join(kept).strip("\n")
    return len(cut), sum(map(len, cut))


class LineStash(Stash):
    """The clean phase's last step: a live document's sketch keys (line_keys), for the sketch."""

    tag = LINES

    def __init__(self, cfg: BoilerplateConfig):
        self._min_chars = cfg.min_chars

    def take(self, doc: dict[str, Any]) -> np.ndarray | None:
        keys = line_keys(doc, self._min_chars)
        return keys if len(keys) else None


def _refilter_check(new: dict, old: dict, src: str) -> None:
    if old["enabled"]:  # the lines are gone from the stored text
        raise UserError(f"refilter: {src} had its boilerplate lines cut; refilter a run without boilerplate.enabled")


SPEC = Stage(STAGE, "boilerplate", phase="later", fields=lambda cfg: [pa.field("boilerplate_chars", pa.int32())],
             stash=lambda cfg, job: LineStash(cfg), refilter="rerun", derived=("boilerplate_chars",),
             refilter_check=_refilter_check)

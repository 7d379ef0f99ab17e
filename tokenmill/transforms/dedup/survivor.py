"""Who survives: node keys that sort in survivor order, the verdicts of one exact group, and
applying verdicts to documents.

A node key is bytes that sort in survivor order (quality desc, length desc, id asc, then a
content hash and the exact hash ``h`` so the order is total): the smallest key of a cluster is
its survivor, and its id can be read back from the key, so no join is needed to name it.
"""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import xxhash

from tokenmill.transforms.dedup.text import exact_hash, utf8

STAGE = "dedup"
EXACT = f"{STAGE}:exact_duplicate"
NEAR = f"{STAGE}:near_duplicate"

# Survivor order as bytes. Prefix length per mode, so the id can be read back from a key.
_PREFIX_LEN = {"quality": 17, "longest": 8, "first_id": 0}
_TAIL = 8 + 16  # content tie-break hash + h


def _f64_asc(x: float) -> bytes:
    """8 bytes whose byte order is the numeric order of ``x`` (IEEE sign/bits trick)."""
    (u,) = struct.unpack(">Q", struct.pack(">d", x + 0.0))  # + 0.0: -0.0 sorts as 0.0
    u = u ^ 0xFFFFFFFFFFFFFFFF if u >> 63 else u | (1 << 63)
    return struct.pack(">Q", u)


def _quality(doc: dict[str, Any], field: str) -> float | None:
    q = doc.get(field)
    if isinstance(q, bool) or not isinstance(q, numbers.Real):  # numpy floats are Real too
        return None
    q = float(q)
    return q if math.isfinite(q) else None


def doc_id(doc: dict[str, Any]) -> str:
    i = doc.get("id")
    return "" if i is None else str(i)


def node_key(doc: dict[str, Any], h: bytes, mode: str = "quality", quality_field: str = "quality_score") -> bytes:
    """Bytes that sort in survivor order: the smallest key of a cluster is its survivor.

    quality: docs with a score first, higher first; then longer text; then smaller id.
    longest: longer text, then smaller id. first_id: smaller id. Then a hash of
    (text, url, source) and ``h``, so two different documents never tie.
    The id is escaped (NUL -> NUL 0xFF) and NUL NUL-terminated: byte order = string order.
    """
    text = doc.get("text") or ""
    length = struct.pack(">Q", (1 << 63) - 1 - min(len(text), (1 << 63) - 1))
    if mode == "quality":
        q = _quality(doc, quality_field)
        prefix = (b"\x00" + _f64_asc(-q) if q is not None else b"\x01" + b"\x00" * 8) + length
    elif mode == "longest":
        prefix = length
    elif mode == "first_id":
        prefix = b""
    else:
        raise ValueError(f"unknown survivor mode {mode!r}")
    ident = utf8(doc_id(doc)).replace(b"\x00", b"\x00\xff") + b"\x00\x00"
    tie = xxhash.xxh3_64_digest(b"\x1f".join(utf8(str(doc.get(k) or "")) for k in ("text", "url", "source")))
    return prefix + ident + tie + h


def node_id(key: bytes, mode: str = "quality") -> str:
    """The document id inside a node key."""
    raw = key[_PREFIX_LEN[mode] : -_TAIL - 2]
    return raw.replace(b"\x00\xff", b"\x00").decode("utf-8", "surrogatepass")


def node_hash(key: bytes) -> bytes:
    """The exact-group hash ``h`` a node key ends with."""
    return key[-16:]


def choose_survivor(
    docs: Iterable[dict[str, Any]], mode: str = "quality", quality_field: str = "quality_score"
) -> dict[str, Any]:
    """The survivor of a cluster under the same order the pipeline uses."""
    return min(docs, key=lambda d: node_key(d, exact_hash(d.get("text")), mode, quality_field))


class Verdict(NamedTuple):
    """What dedup decided about one document (one occurrence of a node key): its cluster (the
    survivor's id), ``dropped_by`` (None for the survivor) and the cluster's size (0 until
    counted)."""

    key: bytes
    cluster: str
    reason: str | None
    size: int = 0
    label: bytes = b""  # the survivor's node key: names the cluster even where ids repeat


def rehydrated(size: int, repeats: dict[int, int]) -> int:
    """How many times a survivor of a cluster of ``size`` goes into the shards: the repeats of
    the largest size step it reaches (``repeats``: min cluster size -> copies), else 1."""
    return next((r for s, r in sorted(repeats.items(), reverse=True) if size >= s), 1)


def exact_verdicts(items: Iterable[tuple[bytes, tuple[int, bytes]]], mode: str) -> Iterator[Verdict]:
    """The verdicts of exact groups, from their records in any order: (h, (0, node key)) per
    document and (h, (2, label)) for a group in a near-duplicate component (the component's
    smallest node). ``items`` is read twice, never held (a spilled partition is read again):
    first each h's count, smallest key and label, then a verdict per document. A lone document
    in no component gets none: it is unique.

    A group's representative is its smallest key; it survives when it is its component's label
    (or there is none), else it is a near duplicate. Every other member, also a second record
    with the very same key, is an exact duplicate.
    """
    groups: dict[bytes, list] = {}  # h -> [count, smallest key, label, representative's verdict given]
    for h, (t, v) in items:
        g = groups.get(h)
        if g is None:
            g = groups[h] = [0, None, None, False]
        if t == 2:
            g[2] = v  # every node of a group is in the same component: any label is the group's
        else:
            g[0] += 1
            if g[1] is None or v < g[1]:
                g[1] = v
    for h, (t, k) in items:
        if t == 2:
            continue
        g = groups[h]
        count, rep, label, rep_given = g
        if count == 1 and label is None:
            continue
        survivor = label if label is not None else rep
        cluster = node_id(survivor, mode)
        if not rep_given and k == rep:
            g[3] = True
            yield Verdict(k, cluster, NEAR if label is not None and label != rep else None, label=survivor)
        else:
            yield Verdict(k, cluster, EXACT, label=survivor)


def sized(verdicts: Iterable[Verdict]) -> Iterator[Verdict]:
    """The verdicts again, each with its cluster's size (``verdicts`` is read twice: first the
    count per cluster label). The label stays: the cluster statistics tell apart two clusters
    whose survivors share an id by it."""
    sizes: dict[bytes, int] = {}
    for v in verdicts:
        sizes[v.label] = sizes.get(v.label, 0) + 1
    for v in verdicts:
        yield v._replace(size=sizes[v.label])


# The survivor or near-duplicate verdict of a key goes to its first record, exact ones after.
_RANK = {None: 0, NEAR: 1, EXACT: 2}


class VerdictBook:
    """The verdicts of one bucket, applied to its documents in their final order."""

    def __init__(self, verdicts: Iterable[Verdict]):
        self._by_key: dict[bytes, list[Verdict]] = {}
        for v in verdicts:
            self._by_key.setdefault(v.key, []).append(v)
        for vs in self._by_key.values():
            vs.sort(key=lambda v: _RANK[v.reason], reverse=True)  # popped from the end

    def apply(self, doc: dict[str, Any], key: bytes | None) -> dict[str, Any]:
        """Sets ``dup_cluster``, ``dup_cluster_size`` and ``dropped_by`` on ``doc`` (node key
        ``key``; None: it took no part); a document without a verdict is unique (size 1)."""
        if key is not None:
            doc["dup_cluster_size"] = 1
        vs = self._by_key.get(key) if key is not None else None
        if vs:
            v = vs.pop()
            doc["dup_cluster"] = v.cluster
            doc["dup_cluster_size"] = v.size or None
            if v.reason and not doc.get("dropped_by"):
                doc["dropped_by"] = v.reason
        return doc

"""Exact and near-duplicate removal that runs entirely inside Beam (issue #4).

Stages, each a distributed Beam step (no step gathers all signatures or all edges on one key,
but for a job small enough for one LSH partition: 2^19 / bands signatures at most, ~17 MB at
the default 14 x 8):

1. Exact: every active document is keyed by ``h`` = xxh3-128 of its lower-cased,
   whitespace-collapsed text, and becomes a node of the near-duplicate graph under its *node
   key* (below). Copies of one text share a signature, so LSH puts them in one component:
   copies that meet in one batch are merged first (the smallest key stays), the others link
   to their smallest node in every bucket and do not count towards its all-pairs limit, so
   verdicts do not depend on where batches are cut. The final join by ``h`` finds each
   group's representative (its smallest node key) and tells the exact copies from the near
   ones. No shuffle by ``h`` before LSH.
2. MinHash (datasketch's affine32 scheme, bit for bit, with xxh32 instead of sha1) over word
   n-grams of the normalised text (lower-cased, ``\\w+`` tokens, digits folded to 0).
3. LSH, on packed blocks rather than one Beam element per (band, node): batches of 8,192
   nodes get a 64-bit key per band (numpy, over the signature matrix) and leave as one blob per
   LSH partition (key % partitions, about 2^19 band keys each, sized from the node count). A
   partition's group sorts its keys; a bucket with more than one node gives candidate edges:
   all pairs when small, a star to its smallest node when big. Candidates are verified by the
   signatures' Jaccard estimate in two joins keyed by a node's home group (hash % groups of
   about 2^17 nodes): join 1 by the edge's first node attaches its signature, join 2 by the
   second compares. Signatures and edges travel as blobs too, each signature once per join
   (carried in the band blobs they would travel up to 14 times). Each join-2 group hands its
   kept edges on as a star forest (node -> its component's minimum within the group), so a
   job with one group arrives at step 4 converged. A job whose LSH has one partition (up to
   2^19 / bands nodes, ~37,000 at the default 14 bands) needs no join: the band blobs' group
   gets the batches' signatures beside the band keys, verifies, and labels the nodes itself.
   Limits: a partition's group is sorted in memory by one worker, so one bucket of millions
   of nodes (near-identical boilerplate pages, or one text copied that often) needs ~100 B per
   member there; and as partitions grow with the corpus while a batch stays 8,192 nodes, a
   band blob holds ~4e9 / nodes keys (430 at 1e7 nodes, a handful at 1e9: back to about one
   element per key, as an element-per-bucket design has throughout).
4. Connected components: alternating large-star / small-star (Kiveris et al., "Connected
   Components in MapReduce and Beyond", 2014), ``max_rounds`` rounds unrolled in the graph;
   then a local check labels every node with the smallest node of its neighbourhood and
   finds the edges whose endpoints still disagree. Those residual edges (none once converged)
   go through a union-find, whose mapping reaches every node as a side input, so the result is
   exact whatever ``max_rounds`` is. Counters report the changes per round and the residual.
5. Survivor: node keys are bytes that sort in survivor order (quality desc, length desc, id
   asc, then a content hash and ``h`` so the order is total), so the component minimum *is*
   the survivor and its id can be read from the key: no further join is needed. A last join
   by ``h`` brings the verdicts back to the documents (the only time full documents move).

Documents that arrive dropped, and documents whose text is empty or only whitespace (there is
nothing to duplicate; the quality filters drop them as what they are), pass straight through
and take no part. Members of a cluster (two or more
documents, exact or near) get ``dup_cluster`` = the survivor's id; every member but the
survivor gets ``dropped_by`` = ``dedup:exact_duplicate`` (same normalised text as a kept or
near-dropped document) or ``dedup:near_duplicate``. A document in no cluster keeps
``dup_cluster`` = None.
"""

from __future__ import annotations

import math
import numbers
import re
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import xxhash
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsSingleton, TaggedOutput

from tokenmill.config import DedupConfig
from tokenmill.transforms.doc import drop, is_dropped, pack, unpack

STAGE = "dedup"
EXACT_REASON = "exact_duplicate"
NEAR_REASON = "near_duplicate"
_NS = "dedup"

# A node's neighbours are de-duplicated in a set only up to this many; past it they are
# streamed (duplicate edges are harmless, only slower), so a hub of millions never sits in memory.
_DEDUPE_CAP = 200_000

# --------------------------------------------------------------------------- pure cores

_WORD = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")


def normalise_exact(text: str | None) -> str:
    """Text for the exact hash: lower-cased, whitespace runs collapsed to one space, stripped."""
    # str.split() splits on exactly the characters re's \s matches (str.isspace), 4x faster.
    return " ".join((text or "").lower().split())


def _utf8(s: str) -> bytes:
    # surrogatepass: a lone surrogate (from a lossy decode upstream) must not crash the stage.
    return s.encode("utf-8", "surrogatepass")


def exact_hash(text: str | None) -> bytes:
    """16-byte xxh3-128 of ``normalise_exact(text)`` (128 bits: no accidental merges at 1e10 docs)."""
    return _exact_hash_lower((text or "").lower())


def _exact_hash_lower(low: str) -> bytes:
    # exact_hash of an already lower-cased text: dedup lower-cases each text once, for both hashes.
    return xxhash.xxh3_128_digest(_utf8(" ".join(low.split())))


def tokens(text: str | None) -> list[str]:
    """Near-dup tokens: lower-cased ``\\w+`` runs (punctuation dropped), every digit folded to 0."""
    return _lower_tokens((text or "").lower())


def _lower_tokens(low: str) -> list[str]:
    return _WORD.findall(_DIGIT.sub("0", low))


_WORD_ASCII = re.compile(rb"\w+")
_DIGITS_TO_0 = bytes.maketrans(b"123456789", b"000000000")


def _token_bytes(low: str) -> list[bytes]:
    """``tokens`` of a lower-cased text as UTF-8 bytes. An ASCII text takes a faster road with
    the same result: bytes.translate folds the digits, and on ASCII ``\\w`` is [A-Za-z0-9_]
    for bytes and str patterns alike."""
    if low.isascii():
        return _WORD_ASCII.findall(low.encode("ascii").translate(_DIGITS_TO_0))
    toks = _lower_tokens(low)
    # Encoded in one go, not token by token (same bytes).
    return _utf8(" ".join(toks)).split(b" ") if toks else []


def shingles(toks: list[str], n: int) -> list[str]:
    """Space-joined word n-grams; fewer than ``n`` tokens make one shingle; none make none."""
    if not toks:
        return []
    if len(toks) < n:
        return [" ".join(toks)]
    return [" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)]


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


class MinHasher:
    """MinHash signatures as bytes (``num_perm`` little uint32): datasketch's ``MinHash`` with
    xxh32 (several times faster than its default sha1) and its affine32 scheme, bit for bit.

    datasketch draws the permutations (once per DoFn instance, in ``setup``); the arithmetic is
    done here, 1.4x faster than ``MinHash.update_batch`` per document: no MinHash object per
    document, shingle hashes gathered in one pass, fixed-size slices.
    """

    def __init__(self, num_perm: int, seed: int = 1):
        from datasketch import MinHash

        self.num_perm = num_perm
        # The scheme named, not defaulted: the arithmetic below is affine32's.
        proto = MinHash(num_perm=num_perm, seed=seed, hashfunc=xxhash.xxh32_intdigest, scheme="affine32")
        a, b = proto.permutations
        if a.dtype != np.uint32 or b.dtype != np.uint32:
            raise RuntimeError(f"datasketch's affine32 permutations are {a.dtype}, expected uint32")
        self._a, self._b = a, b
        self._slice = max(1, _BLOCK_BYTES // (4 * num_perm))

    def signature(self, shingle_list: list[str] | list[bytes]) -> bytes | None:
        """None for no shingles: an empty text has no near-duplicates (only exact ones)."""
        if not shingle_list:
            return None
        if isinstance(shingle_list[0], str):
            shingle_list = [_utf8(s) for s in shingle_list]
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
        return self._lower_text_signature((text or "").lower(), n)

    def _lower_text_signature(self, low: str, n: int) -> bytes | None:
        btoks = _token_bytes(low)
        if not btoks:
            return None
        if len(btoks) < n:
            return self.signature([b" ".join(btoks)])
        return self.signature(list(map(b" ".join, zip(*(btoks[i:] for i in range(n))))))


# Band keys and buckets are computed on packed numpy blocks, not one Python element per
# (band, node): 14 Beam elements per document through a GroupByKey cost ~6 us each, more
# than the MinHash itself. The constants are xxh64's primes; any good 64-bit mix will do, as
# a false collision (2^-64 per pair and band) only adds a candidate that verification rejects.
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_U64 = np.uint64


def band_hashes(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands * rows) uint32 signatures -> (n, bands) uint64 bucket keys, one per band.

    Seeded by the band index, so equal rows in two different bands do not share a bucket.
    """
    n = sigs.shape[0]
    v = sigs.reshape(n, bands, rows).astype(np.uint64)
    h = np.empty((n, bands), dtype=np.uint64)
    h[:] = (np.arange(bands, dtype=np.uint64) + _U64(1)) * _P3
    for r in range(rows):  # an xxh64-style round per value: bijective in h for a given value
        h ^= v[:, :, r] * _P2
        h = ((h << _U64(31)) | (h >> _U64(33))) * _P1
    h ^= h >> _U64(33)  # xxh64's avalanche
    h *= _P2
    h ^= h >> _U64(29)
    h *= _P3
    return h ^ (h >> _U64(32))


def lsh_partitions(nodes: int, bands: int) -> int:
    """How many groups the band records are spread over: about ``_PARTITION_RECORDS`` each, as
    one worker sorts a group in memory (6 MB of band keys and indices, plus at most one node key
    per band key: ~50 MB); a small job is one group. A sized count of groups, not one group per
    bucket: see band_blobs."""
    return max(1, -(-nodes * bands // _PARTITION_RECORDS))


def join_partitions(nodes: int) -> int:
    """How many groups the signature table is spread over for the verification joins: about
    ``_JOIN_NODES`` signatures each (~64 MB with their keys at 112 permutations)."""
    return max(1, -(-nodes // _JOIN_NODES))


_PARTITION_RECORDS = 1 << 19
_JOIN_NODES = 1 << 17
_EDGE_BLOB = 1 << 16  # edges per blob in the joins: ~30 MB with their first end's signatures
# Nodes per band_blobs call: ~4 MB of signatures, and few blobs per partition in a small job.
_BATCH_NODES = 8192


def _pack_keys(keys: list[bytes]) -> tuple[bytes, bytes]:
    """Variable-length keys as (joined bytes, uint64 offsets): one bytes pair for any number."""
    offs = np.zeros(len(keys) + 1, dtype=np.uint64)
    np.cumsum([len(k) for k in keys], out=offs[1:])
    return b"".join(keys), offs.tobytes()


def _unpack_keys(cat: bytes, offs: bytes) -> list[bytes]:
    o = np.frombuffer(offs, dtype=np.uint64).tolist()
    return [cat[o[i] : o[i + 1]] for i in range(len(o) - 1)]


def home(key: bytes, partitions: int) -> int:
    """The verification-join group of a node key."""
    return xxhash.xxh3_64_intdigest(key) % partitions


def _by_home(keys: list[bytes], partitions: int) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(home(k, partitions) if partitions > 1 else 0, []).append(i)
    return groups


def _runs(sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each run of equal values in a sorted array."""
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    return starts, np.diff(np.r_[starts, len(sorted_values)])


def band_blobs(
    keys: list[bytes], sigs: list[bytes], bands: int, rows: int, partitions: int
) -> Iterator[tuple[int, tuple[bytes, bytes, bytes, bytes, bytes]]]:
    """A batch of nodes -> one blob per LSH partition that any of their band keys falls in.

    A blob is (BAND_BLOB, band keys uint64, node index per band key uint32, the nodes' keys
    packed): a node of the batch appears once in each blob it has a key in. Signatures stay out
    (a node would travel with up to ``bands`` copies of its signature); the joins below bring
    them, or, with one partition, a signature blob beside the band blobs.
    """
    n = len(keys)
    if n == 0:
        return
    sig = np.frombuffer(b"".join(sigs), dtype="<u4").reshape(n, bands * rows)
    h = band_hashes(sig, bands, rows).ravel()  # record i belongs to node i // bands
    node = np.repeat(np.arange(n, dtype=np.uint32), bands)
    if partitions == 1:
        yield 0, (BAND_BLOB, h.tobytes(), node.tobytes(), *_pack_keys(keys))
        return
    part = h % _U64(partitions)
    order = np.argsort(part, kind="stable")
    ps = part[order]
    starts, lengths = _runs(ps)
    for s, ln in zip(starts.tolist(), lengths.tolist()):
        sel = order[s : s + ln]
        here = np.unique(node[sel])
        local = np.searchsorted(here, node[sel]).astype(np.uint32)
        yield int(ps[s]), (BAND_BLOB, h[sel].tobytes(), local.tobytes(), *_pack_keys([keys[i] for i in here.tolist()]))


def bucket_edges(blobs: Iterable[tuple], all_pairs_max: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """The band blobs of one LSH partition (others are skipped) -> (candidate edges (a, b) with
    a < b, big buckets).

    A bucket (equal band key) of more than one node gives candidates: all pairs when it has at
    most ``all_pairs_max`` distinct texts, else a star to its smallest node; copies of a text
    link to its smallest node. A pair found in several bands is listed once.
    """
    hashes, nodes, keys = [], [], []
    for blob in blobs:
        if blob[0] != BAND_BLOB:
            continue
        _, bh, idx, cat, offs = blob
        hashes.append(np.frombuffer(bh, dtype=np.uint64))
        nodes.append(np.frombuffer(idx, dtype=np.uint32).astype(np.int64) + len(keys))
        keys.extend(_unpack_keys(cat, offs))
    if not hashes:
        return [], 0
    h = np.concatenate(hashes)
    node = np.concatenate(nodes)
    order = np.argsort(h, kind="stable")
    starts, lengths = _runs(h[order])
    pairs: set[tuple[int, int]] = set()
    big = 0
    for s, ln in zip(starts[lengths > 1].tolist(), lengths[lengths > 1].tolist()):
        # A node has one key per band and the band index is in the key, so a bucket's nodes
        # differ, unless two of one node's keys collide in 64 bits, or one record was read twice
        # (two batches, one key): one member per key.
        members = sorted({keys[i]: i for i in node[order[s : s + ln]].tolist()}.values(), key=keys.__getitem__)
        # Copies of one text (same h, from different batches) attach to their smallest node and
        # do not count: all pairs or a star is decided over distinct texts, as if the copies
        # had met in one batch, so a verdict does not depend on where batches are cut.
        first: dict[bytes, int] = {}
        reps = []
        for m in members:
            r = first.setdefault(node_hash(keys[m]), m)
            if r == m:
                reps.append(m)
            else:
                pairs.add((r, m))
        ln = len(reps)
        if ln < 2:
            continue
        if ln <= all_pairs_max:
            pairs.update((a, b) for i, a in enumerate(reps) for b in reps[i + 1 :])
        else:
            big += 1
            pairs.update((reps[0], b) for b in reps[1:])
    # By key, not index: a record read twice is two indices with one key.
    return sorted({(keys[a], keys[b]) for a, b in pairs}), big


# Blobs are tagged by their first field: band keys (LSH), and the verification's signatures
# and edges (in the joins keyed by home(node), or beside the band keys in a one-partition LSH).
BAND_BLOB, SIG_BLOB, EDGE_BLOB = b"B", b"S", b"E"


def signature_blobs(keys: list[bytes], sigs: list[bytes], partitions: int) -> Iterator[tuple[int, tuple]]:
    """A batch of (node, signature) -> (group, (SIG_BLOB, keys packed, signatures)) by home."""
    for q, idx in _by_home(keys, partitions).items():
        yield q, (SIG_BLOB, *_pack_keys([keys[i] for i in idx]), b"".join(sigs[i] for i in idx))


def edge_blobs(
    edges: list[tuple[bytes, bytes]], partitions: int, to_end: int, sig_a: np.ndarray | None = None
) -> Iterator[tuple[int, tuple]]:
    """Edges (with ``a``'s signatures, in join 2) -> (group, (EDGE_BLOB, a packed, b packed,
    sig_a bytes)), grouped by the home of end ``to_end`` (0: a, 1: b)."""
    ends = [e[to_end] for e in edges]
    for q, group in _by_home(ends, partitions).items():
        # In blobs of at most _EDGE_BLOB edges: a big bucket's star (every edge from one hub
        # goes to one home) must not become a single element of gigabytes.
        for i in range(0, len(group), _EDGE_BLOB):
            idx = group[i : i + _EDGE_BLOB]
            yield (
                q,
                (
                    EDGE_BLOB,
                    *_pack_keys([edges[j][0] for j in idx]),
                    *_pack_keys([edges[j][1] for j in idx]),
                    sig_a[idx].tobytes() if sig_a is not None else b"",
                ),
            )


def _read_join_group(blobs, num_perm: int):
    """One join group -> ({node: row}, signature matrix, [(a keys, b keys, sig_a bytes)])."""
    keys: list[bytes] = []
    sig_parts, edge_parts = [], []
    for blob in blobs:
        if blob[0] == SIG_BLOB:
            keys.extend(_unpack_keys(blob[1], blob[2]))
            sig_parts.append(blob[3])
        elif blob[0] == EDGE_BLOB:
            edge_parts.append((_unpack_keys(blob[1], blob[2]), _unpack_keys(blob[3], blob[4]), blob[5]))
    sig = np.frombuffer(b"".join(sig_parts), dtype="<u4").reshape(len(keys), num_perm)
    return {k: i for i, k in enumerate(keys)}, sig, edge_parts


def attach_signature(blobs, num_perm: int, partitions: int) -> Iterator[tuple[int, tuple]]:
    """Join 1, a group keyed by home(a): each edge picks up a's signature and moves to home(b)."""
    row, sig, edge_parts = _read_join_group(blobs, num_perm)
    for a_keys, b_keys, _ in edge_parts:
        found = [i for i, a in enumerate(a_keys) if a in row]  # a node without a signature: no edge
        edges = [(a_keys[i], b_keys[i]) for i in found]
        yield from edge_blobs(edges, partitions, 1, sig[[row[a_keys[i]] for i in found]])


def verify_edges(blobs, num_perm: int, threshold: float) -> tuple[list[tuple[bytes, bytes]], int]:
    """Join 2, a group keyed by home(b): the edges whose signatures' Jaccard estimate reaches
    ``threshold`` (computed as ``jaccard_estimate``), and how many were rejected."""
    row, sig, edge_parts = _read_join_group(blobs, num_perm)
    kept: list[tuple[bytes, bytes]] = []
    rejected = 0
    for a_keys, b_keys, sig_a in edge_parts:
        found = [i for i, b in enumerate(b_keys) if b in row]
        sa = np.frombuffer(sig_a, dtype="<u4").reshape(len(a_keys), num_perm)[found]
        sb = sig[[row[b_keys[i]] for i in found]]
        rejected += _keep_similar([(a_keys[i], b_keys[i]) for i in found], sa, sb, threshold, kept)
    return kept, rejected


def verify_local(blobs, edges: list[tuple[bytes, bytes]], num_perm: int, threshold: float):
    """``verify_edges`` for a one-partition LSH, whose group holds every signature beside the
    band keys: (kept edges, rejected count)."""
    row, sig, _ = _read_join_group(blobs, num_perm)
    kept: list[tuple[bytes, bytes]] = []
    sa = sig[[row[a] for a, _ in edges]]
    sb = sig[[row[b] for _, b in edges]]
    return kept, _keep_similar(edges, sa, sb, threshold, kept)


def _keep_similar(edges, sa: np.ndarray, sb: np.ndarray, threshold: float, kept: list) -> int:
    """Appends to ``kept`` the edges whose signature rows (sa[i], sb[i]) agree in a fraction
    >= threshold of places (as ``jaccard_estimate``); returns how many it rejected."""
    ok = (np.count_nonzero(sa == sb, axis=1) / sa.shape[1] >= threshold).tolist()
    kept.extend(e for e, k in zip(edges, ok) if k)
    return len(ok) - sum(ok)


def star_forest(edges: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The same connectivity as ``edges`` in fewest edges: each node to its component's minimum.
    Applied per group before the components, so one group (a small job) hands them over
    already converged."""
    return [(v, r) for v, r in union_find_components(edges).items() if v != r]


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


def _doc_id(doc: dict[str, Any]) -> str:
    i = doc.get("id")
    return "" if i is None else str(i)


def node_key(
    doc: dict[str, Any], h: bytes, mode: str = "quality", quality_field: str = "quality_score"
) -> bytes:
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
    ident = _utf8(_doc_id(doc)).replace(b"\x00", b"\x00\xff") + b"\x00\x00"
    tie = xxhash.xxh3_64_digest(b"\x1f".join(_utf8(str(doc.get(k) or "")) for k in ("text", "url", "source")))
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


def union_find_components(edges: Iterable[tuple[Any, Any]]) -> dict[Any, Any]:
    """Reference: node -> smallest node of its component (for every node on an edge)."""
    parent: dict[Any, Any] = {}

    def find(x):
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    for a, b in edges:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        ra, rb = find(a), find(b)
        if ra != rb:
            # The smaller root wins, so every root is its component's minimum.
            if rb < ra:
                ra, rb = rb, ra
            parent[rb] = ra
    return {x: find(x) for x in parent}


def size_bucket(n: int) -> str:
    """Histogram bucket of a cluster size: 2, 3-4, 5-8, 9-16, ..."""
    if n <= 2:
        return str(n)
    lo = 1 << ((n - 1).bit_length() - 1)
    return f"{lo + 1}-{lo * 2}"


# --------------------------------------------------------------------------- Beam helpers


def _first_of_tag(values: Iterable[tuple[int, Any]], tag: int) -> Any:
    for t, v in values:
        if t == tag:
            return v
    return None


def _both_directions(edge):
    """(u, v) -> (u, v) and (v, u); a self-loop -> nothing."""
    u, v = edge
    if u != v:
        yield (u, v)
        yield (v, u)


def _iter_distinct(values: Iterable[Any]) -> Iterator[Any]:
    seen: set[Any] = set()
    for v in values:
        if v in seen:
            continue
        if len(seen) < _DEDUPE_CAP:
            seen.add(v)
        yield v


# --------------------------------------------------------------------------- components


class _LargeStar(beam.DoFn):
    """Per node u: connect every larger neighbour to m(u) = min(u and its neighbours)."""

    def __init__(self, rnd: int):
        self._rnd = rnd

    def setup(self):
        self._changed = Metrics.counter(_NS, f"cc_round{self._rnd}_large_star_changed")

    def process(self, kv):
        u, nbrs = kv
        m = u
        for v in nbrs:  # first pass: the minimum (the iterable is re-iterable)
            if v < m:
                m = v
        changed = 0
        for v in _iter_distinct(nbrs):
            if v > u:
                yield (v, m)  # keyed by its larger end (v > u >= m), as small-star groups
                changed += m != u
        if changed:
            self._changed.inc(changed)


class _SmallStar(beam.DoFn):
    """Per node u with its smaller neighbours N: connect N and u to m = min(N).

    Emits every new edge in both directions, as the next large-star (or the labelling) groups
    by either end.
    """

    def __init__(self, rnd: int):
        self._rnd = rnd

    def setup(self):
        self._changed = Metrics.counter(_NS, f"cc_round{self._rnd}_small_star_changed")

    def process(self, kv):
        u, smaller = kv
        m = min(smaller)
        changed = 0
        for v in _iter_distinct(smaller):
            if v != m:
                yield (v, m)
                yield (m, v)
                changed += 1
        yield (u, m)
        yield (m, u)
        if changed:
            self._changed.inc(changed)


class _LocalLabel(beam.DoFn):
    """p(u) = min(u and its neighbours); sent to u itself (tag 0) and its larger neighbours (1)."""

    def process(self, kv):
        u, nbrs = kv
        p = u
        for v in nbrs:
            if v < p:
                p = v
        yield (u, (0, p))
        for v in _iter_distinct(nbrs):
            if v > u:
                yield (v, (1, p))


class _CheckLabels(beam.DoFn):
    """Keeps p(v); an edge whose endpoints disagree on p is a residual edge between labels.

    Once large-star/small-star has converged the graph is a forest of stars around each
    component minimum, so p is the component minimum everywhere and there is no residual.
    """

    RESIDUAL = "residual"

    def setup(self):
        self._residual = Metrics.counter(_NS, "cc_residual_edges")

    def process(self, kv):
        v, items = kv
        p = _first_of_tag(items, 0)
        yield (v, p)
        for t, q in items:
            if t == 1 and q != p:
                self._residual.inc()
                yield TaggedOutput(self.RESIDUAL, (p, q))


class _UnionFindFn(beam.CombineFn):
    """Union-find over the residual label edges: label -> smallest label of its set.

    This is the only single-worker step, and it sees only the residual, which is empty once
    the rounds converged and small when they nearly did (combiner lifting also reduces each
    worker's share to a forest before it is shipped).
    """

    def create_accumulator(self):
        return {}

    def add_input(self, acc, edge):
        _uf_union(acc, *edge)
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        out = next(accs, None) or {}
        for acc in accs:
            for x, px in acc.items():
                _uf_union(out, x, px)
        return out

    def extract_output(self, acc):
        return {x: r for x in list(acc) if (r := _uf_find(acc, x)) != x}


def _uf_find(parent: dict, x):
    root = parent.setdefault(x, x)
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:
        parent[x], x = root, parent[x]
    return root


def _uf_union(parent: dict, a, b) -> None:
    ra, rb = _uf_find(parent, a), _uf_find(parent, b)
    if ra != rb:
        if rb < ra:
            ra, rb = rb, ra
        parent[rb] = ra  # the smaller root wins: a root is the minimum of its set


def _final_label(kv, fallback: dict):
    v, p = kv
    return v, fallback.get(p, p)


class ConnectedComponents(beam.PTransform):
    """Edges (u, v) of comparable node ids -> (node, smallest node of its component).

    Every node on an edge comes out exactly once. Duplicate edges are fine; self-loops are
    ignored (a node whose only edge is a self-loop does not come out; Dedup never makes one).

    Rounds: each is a large-star and a small-star step, each one GroupByKey by node (large-star
    and small-star never increase the edge count and keep connectivity; together they converge
    to one star per component around its minimum in O(log^2 n) rounds, a handful in practice).
    The number of rounds is fixed when the graph is built, so convergence cannot stop the
    loop; instead counters ``cc_round{i}_{large,small}_star_changed`` show when it converged,
    and whatever has not converged after ``max_rounds`` is finished exactly: every node takes
    p = min of its closed neighbourhood, the edges whose endpoints disagree on p (counter
    ``cc_residual_edges``) are merged by a union-find over labels, and its mapping (empty when
    converged) is applied to every node through a side input. Any p is a node of the same
    component and p agrees along every non-residual edge, so the labels are the component
    minima whatever the number of rounds.
    """

    def __init__(self, max_rounds: int = 6, label: str | None = None):
        super().__init__(label)
        self._max_rounds = max_rounds

    def expand(self, edges):
        e = edges | "BothDirections" >> beam.FlatMap(_both_directions)
        for i in range(self._max_rounds):
            e = (
                e
                | f"Round{i}LargeStarGroup" >> beam.GroupByKey()
                | f"Round{i}LargeStar" >> beam.ParDo(_LargeStar(i))
                | f"Round{i}SmallStarGroup" >> beam.GroupByKey()
                | f"Round{i}SmallStar" >> beam.ParDo(_SmallStar(i))
            )
        checked = (
            e
            | "LabelGroup" >> beam.GroupByKey()
            | "LocalLabel" >> beam.ParDo(_LocalLabel())
            | "CheckGroup" >> beam.GroupByKey()
            | "CheckLabels"
            >> beam.ParDo(_CheckLabels())
            .with_output_types(tuple[Any, Any])
            .with_outputs(_CheckLabels.RESIDUAL, main="labels")
        )
        # Without defaults (an empty residual gives no element, hence the side input's default):
        # the default's machinery would add half a dozen transforms to every job.
        fallback = (
            checked[_CheckLabels.RESIDUAL]
            | "ResidualUnionFind" >> beam.CombineGlobally(_UnionFindFn()).without_defaults()
        )
        return checked.labels | "ApplyResidual" >> beam.Map(
            _final_label, AsSingleton(fallback, default_value={})
        )


# --------------------------------------------------------------------------- dedup DoFns


def _takes_part(doc) -> bool:
    # A document dropped by an earlier stage passes through untouched, and so does a text with
    # nothing but whitespace, which has no content to duplicate (calling a run of empty pages
    # "exact duplicates" would hide that they are empty; the quality filters drop them for
    # what they are).
    return not is_dropped(doc) and bool((doc.get("text") or "").strip())


def _pass_key(packed: bytes) -> bytes:
    """Join key of a document that passes through: 17 bytes, so never an exact hash (16), and a
    hash of the whole packed document, so documents without ids do not gather on one key. It
    meets no verdict and leaves unchanged."""
    return b"p" + xxhash.xxh3_128_digest(packed)


class _Prepare(beam.DoFn):
    """Doc -> (h, (0, packed doc)) for the final join and, with near-duplicate detection and a
    signature, (node key, signature) to 'node'; a doc that takes no part only goes to the join,
    under its own key."""

    NODE = "node"

    def __init__(self, cfg: DedupConfig):
        self._near = cfg.near
        self._n = cfg.ngram
        self._num_perm = cfg.bands * cfg.rows
        self._seed = cfg.seed
        self._mode = cfg.survivor
        self._qfield = cfg.quality_field

    def setup(self):
        self._hasher = MinHasher(self._num_perm, self._seed) if self._near else None

    def process(self, doc):
        if not _takes_part(doc):
            packed = pack(doc)
            yield (_pass_key(packed), (0, packed))
            return
        low = doc["text"].lower()
        h = _exact_hash_lower(low)
        yield (h, (0, pack(doc)))  # packed: the join shuffles every document
        if self._hasher is not None:
            # Every document is a node, exact copies too: copies share a signature, so LSH puts
            # them in one component, and the join by h sorts out which of them is exact. That
            # spares a shuffle of every node by h before LSH (exact_reps merges the copies that
            # meet in one batch); the text is needed here anyway, for the signature.
            sig = self._hasher._lower_text_signature(low, self._n)
            if sig is not None:
                yield TaggedOutput(self.NODE, (node_key(doc, h, self._mode, self._qfield), sig))


def exact_reps(nodes: Iterable[tuple[bytes, Any]]) -> list[tuple[bytes, Any]]:
    """(node key, signature) pairs -> one per exact group (``node_hash``): its smallest key.
    Copies of one text have one signature, so the others would only add edges to it."""
    best: dict[bytes, tuple[bytes, Any]] = {}
    for node in nodes:
        h = node_hash(node[0])
        if h not in best or node[0] < best[h][0]:
            best[h] = node
    return list(best.values())


class _BandBlobs(beam.DoFn):
    """A batch of (node key, signature) -> band blobs (main) and, to verify, signature blobs:
    beside the band blobs when the LSH has one partition (its group verifies), else to the
    joins ('sigs')."""

    SIGS = "sigs"

    def __init__(self, bands: int, rows: int, verify: bool):
        self._bands = bands
        self._rows = rows
        self._verify = verify

    def process(self, batch, nodes):
        batch = exact_reps(batch)
        keys = [k for k, _ in batch]
        sigs = [s for _, s in batch]
        partitions = lsh_partitions(nodes, self._bands)
        yield from band_blobs(keys, sigs, self._bands, self._rows, partitions)
        if self._verify and partitions == 1:
            yield from signature_blobs(keys, sigs, 1)
        elif self._verify:
            for kv in signature_blobs(keys, sigs, join_partitions(nodes)):
                yield TaggedOutput(self.SIGS, kv)


class _EdgeSink(beam.DoFn):
    """Where edges are known to be kept: a group that saw every edge labels the nodes itself
    ('labels', ready for the final join) and the components get nothing to do; any other group
    hands its edges on to the components as a star forest."""

    LABELS = "labels"

    def setup(self):
        self._kept = Metrics.counter(_NS, "verify_kept_edges")
        self._rejected = Metrics.counter(_NS, "verify_rejected_edges")

    def _emit(self, kept, whole: bool):
        if whole:
            for label in union_find_components(kept).items():
                yield TaggedOutput(self.LABELS, _label_for_join(label))
        else:
            yield from star_forest(kept)

    def _verified(self, kept, rejected: int, whole: bool):
        self._kept.inc(len(kept))
        self._rejected.inc(rejected)
        return self._emit(kept, whole)


class _BucketEdges(_EdgeSink):
    """One LSH partition -> its candidate edges. Verified here when the LSH has one partition
    (the signatures came along), else sent to the joins as edge blobs by home(a); unverified,
    they go on as they are."""

    def __init__(self, cfg: DedupConfig):
        self._max = cfg.bucket_all_pairs_max
        self._verify = cfg.verify
        self._bands = cfg.bands
        self._num_perm = cfg.bands * cfg.rows
        self._threshold = cfg.verify_threshold

    def setup(self):
        super().setup()
        self._candidates = Metrics.counter(_NS, "lsh_candidate_edges")
        self._big = Metrics.counter(_NS, "lsh_big_buckets")

    def process(self, kv, nodes):
        edges, big = bucket_edges(kv[1], self._max)
        self._candidates.inc(len(edges))
        if big:
            self._big.inc(big)
        whole = lsh_partitions(nodes, self._bands) == 1
        if not self._verify:
            yield from self._emit(edges, whole)
        elif whole:
            yield from self._verified(*verify_local(kv[1], edges, self._num_perm, self._threshold), True)
        else:
            yield from edge_blobs(edges, join_partitions(nodes), 0)


class _AttachSignature(beam.DoFn):
    """Join 1 (see attach_signature)."""

    def __init__(self, num_perm: int):
        self._num_perm = num_perm

    def process(self, kv, nodes):
        yield from attach_signature(kv[1], self._num_perm, join_partitions(nodes))


class _VerifyEdges(_EdgeSink):
    """Join 2 (see verify_edges)."""

    def __init__(self, num_perm: int, threshold: float):
        self._num_perm = num_perm
        self._threshold = threshold

    def process(self, kv, nodes):
        kept, rejected = verify_edges(kv[1], self._num_perm, self._threshold)
        yield from self._verified(kept, rejected, join_partitions(nodes) == 1)


def _label_for_join(kv):
    node, label = kv
    return node_hash(node), (2, label)


class _Assign(beam.DoFn):
    """Per exact group h: the documents (tag 0) and, when the group is in a near-duplicate
    component, its nodes' component labels (tag 2). Every node of the group that took
    part in LSH is in one component (copies share a signature), so any message's label is the
    group's. The group's representative, its smallest node key, is found here."""

    def __init__(self, cfg: DedupConfig):
        self._mode = cfg.survivor
        self._qfield = cfg.quality_field

    def setup(self):
        self._exact = Metrics.counter(_NS, "exact_duplicates")
        self._near = Metrics.counter(_NS, "near_duplicates")
        self._kept = Metrics.counter(_NS, "cluster_survivors")

    def process(self, kv):
        h, items = kv
        label, count, first = None, 0, None
        for t, v in items:  # first pass: count the documents (unpacked only if needed), one label
            if t == 0:
                count += 1
                first = first or v
            else:
                label = v
        if count == 1 and label is None:
            yield unpack(first)
            return
        if count == 1:
            docs = [unpack(first)]
            rep = node_key(docs[0], h, self._mode, self._qfield)
        else:  # an exact group: unpacked twice rather than held (a group may be huge)
            docs = (unpack(v) for t, v in items if t == 0)
            rep = min(node_key(doc, h, self._mode, self._qfield) for doc in docs)
            docs = (unpack(v) for t, v in items if t == 0)
        cluster_id = node_id(label if label is not None else rep, self._mode)
        rep_seen = False
        for doc in docs:
            doc["dup_cluster"] = cluster_id
            if not rep_seen and (count == 1 or node_key(doc, h, self._mode, self._qfield) == rep):
                rep_seen = True
                if label is not None and label != rep:
                    drop(doc, STAGE, NEAR_REASON)
                    self._near.inc()
                else:
                    self._kept.inc()
            else:
                drop(doc, STAGE, EXACT_REASON)
                self._exact.inc()
            yield doc


class Dedup(beam.PTransform):
    """PCollection[doc dict] -> PCollection[doc dict]: every input doc comes out exactly once."""

    def __init__(self, cfg: DedupConfig | None = None, label: str | None = None):
        super().__init__(label)
        self._cfg = cfg or DedupConfig()

    def expand(self, docs):
        cfg = self._cfg
        if not cfg.enabled:
            return docs
        # Every document, also one that takes no part, goes through the join: merging a side
        # branch back with a Flatten would cost local runners a copy of every document.
        prepared = docs | "Prepare" >> (
            beam.ParDo(_Prepare(cfg))
            # Without this, Beam infers the main output as "tuple or TaggedOutput" and the
            # GroupByKey downstream refuses it.
            .with_output_types(tuple[bytes, tuple[int, Any]])
            .with_outputs(_Prepare.NODE, main="docs")
        )
        labels = []  # (h, (2, label)) for the join
        if cfg.near:
            sigs = prepared[_Prepare.NODE]
            count = (
                sigs
                | "CountNodes" >> beam.CombineGlobally(beam.combiners.CountCombineFn()).without_defaults()
            )
            nodes = AsSingleton(count, default_value=0)
            blobs = (
                sigs
                | "BatchNodes" >> beam.BatchElements(min_batch_size=_BATCH_NODES, max_batch_size=_BATCH_NODES)
                | "BandBlobs"
                >> beam.ParDo(_BandBlobs(cfg.bands, cfg.rows, cfg.verify), nodes)
                .with_output_types(tuple[int, Any])
                .with_outputs(_BandBlobs.SIGS, main="bands")
            )
            buckets = (
                blobs.bands
                | "Buckets" >> beam.GroupByKey()
                | "BucketEdges"
                >> beam.ParDo(_BucketEdges(cfg), nodes)
                .with_output_types(tuple[Any, Any])
                .with_outputs(_EdgeSink.LABELS, main="edges")
            )
            labels.append(buckets.labels)
            edges = buckets.edges
            if cfg.verify:
                num_perm = cfg.bands * cfg.rows
                attached = (
                    (blobs.sigs, edges)
                    | "SigAFlatten" >> beam.Flatten()
                    | "SigAGroup" >> beam.GroupByKey()
                    | "AttachSignature" >> beam.ParDo(_AttachSignature(num_perm), nodes)
                )
                verified = (
                    (blobs.sigs, attached)
                    | "SigBFlatten" >> beam.Flatten()
                    | "SigBGroup" >> beam.GroupByKey()
                    | "Verify"
                    >> beam.ParDo(_VerifyEdges(num_perm, cfg.verify_threshold), nodes)
                    .with_output_types(tuple[Any, Any])
                    .with_outputs(_EdgeSink.LABELS, main="edges")
                )
                edges = verified.edges
                labels.append(verified.labels)
            components = edges | "Components" >> ConnectedComponents(cfg.max_rounds)
            labels.append(components | "LabelForJoin" >> beam.Map(_label_for_join))
        docs_by_h = prepared.docs  # already (h, (0, doc))
        grouped = (
            [docs_by_h, *labels]
            | "JoinFlatten" >> beam.Flatten()
            | "JoinGroup" >> beam.GroupByKey()
        )
        return grouped | "Assign" >> beam.ParDo(_Assign(cfg))


# --------------------------------------------------------------------------- statistics


def _member_of_cluster(doc) -> bool:
    # Only dedup's own clusters: a doc dropped by an earlier stage never took part.
    reason = doc.get("dropped_by")
    return doc.get("dup_cluster") is not None and (not reason or reason.startswith(STAGE + ":"))


def _cluster_member(doc):
    return doc["dup_cluster"], (_doc_id(doc), doc.get("dropped_by"))


class _ClusterFn(beam.CombineFn):
    """Per cluster: (size, exact-dropped, near-dropped, the smallest few member ids)."""

    def __init__(self, sample_ids: int):
        self._k = sample_ids

    def create_accumulator(self):
        return (0, 0, 0, [])

    def add_input(self, acc, item):
        ident, reason = item
        n, ex, nr, ids = acc
        ids = sorted(ids + [ident])[: self._k]
        return (
            n + 1,
            ex + (reason == f"{STAGE}:{EXACT_REASON}"),
            nr + (reason == f"{STAGE}:{NEAR_REASON}"),
            ids,
        )

    def merge_accumulators(self, accs):
        n = ex = nr = 0
        ids: list[str] = []
        for a, b, c, d in accs:
            n, ex, nr = n + a, ex + b, nr + c
            ids = sorted(ids + d)[: self._k]
        return (n, ex, nr, ids)

    def extract_output(self, acc):
        return acc


def _cluster_summary(kv):
    cid, (n, ex, nr, ids) = kv
    return (cid, n, ex, nr, ids)


class _StatsFn(beam.CombineFn):
    """All clusters -> one dict; keeps only counters, a histogram and the top-k clusters."""

    def __init__(self, top_k: int):
        self._k = top_k

    def create_accumulator(self):
        return {"clusters": 0, "members": 0, "exact": 0, "near": 0, "hist": {}, "top": []}

    def _trim(self, top):
        top.sort(key=lambda c: (-c[1], c[0]))
        del top[self._k :]

    def add_input(self, acc, c):
        cid, n, ex, nr, _ids = c
        acc["clusters"] += 1
        acc["members"] += n
        acc["exact"] += ex
        acc["near"] += nr
        b = size_bucket(n)
        acc["hist"][b] = acc["hist"].get(b, 0) + 1
        if self._k:
            acc["top"].append(c)
            if len(acc["top"]) > 2 * self._k:
                self._trim(acc["top"])
        return acc

    def merge_accumulators(self, accs):
        out = self.create_accumulator()
        for a in accs:
            for k in ("clusters", "members", "exact", "near"):
                out[k] += a[k]
            for b, v in a["hist"].items():
                out["hist"][b] = out["hist"].get(b, 0) + v
            out["top"].extend(a["top"])
            self._trim(out["top"])
        return out

    def extract_output(self, acc):
        top = list(acc["top"])
        self._trim(top)
        hist = dict(sorted(acc["hist"].items(), key=lambda kv: int(kv[0].split("-")[0])))
        return {
            "clusters": acc["clusters"],
            "members": acc["members"],
            "removed_exact": acc["exact"],
            "removed_near": acc["near"],
            "size_histogram": hist,
            "largest": [
                {"cluster": cid, "size": n, "exact": ex, "near": nr, "member_ids": ids}
                for cid, n, ex, nr, ids in top
            ],
        }


def cluster_stats(
    docs,
    cfg: DedupConfig | None = None,
    *,
    top_k: int | None = None,
    member_ids: int | None = None,
    label: str = "DedupClusterStats",
):
    """PCollection[doc] (Dedup's output) -> a one-element PCollection with the cluster statistics.

    ``top_k`` / ``member_ids`` default to the config's ``stats_top_clusters`` / ``stats_member_ids``.

    ``clusters`` (count of clusters of 2+ docs), ``members`` (docs in them), ``removed_exact`` /
    ``removed_near``, ``size_histogram`` ({"2": n, "3-4": n, "5-8": n, ...}) and ``largest``:
    the ``top_k`` biggest clusters with their ``member_ids`` smallest member ids. Per-cluster
    counts are a lifted combine; the global combine keeps only O(top_k) clusters.
    """
    cfg = cfg or DedupConfig()
    top_k = cfg.stats_top_clusters if top_k is None else top_k
    member_ids = cfg.stats_member_ids if member_ids is None else member_ids
    return (
        docs
        | f"{label}Members" >> beam.Filter(_member_of_cluster)
        | f"{label}Key" >> beam.Map(_cluster_member)
        | f"{label}PerCluster" >> beam.CombinePerKey(_ClusterFn(member_ids))
        | f"{label}Summary" >> beam.Map(_cluster_summary)
        | f"{label}Global" >> beam.CombineGlobally(_StatsFn(top_k))
    )

"""LSH on packed blocks: band keys per node, blobs per LSH partition, candidate edges per bucket.

Band keys and buckets are computed on packed numpy blocks, not one Python element per
(band, node): a Beam element per band and document through a GroupByKey would cost more than
the MinHash itself (bench/MEASUREMENTS.md: band keys on packed blocks). As partitions grow
with the corpus while a batch stays ``batch_nodes``, a band blob holds ~4e9 / nodes keys (430
at 1e7 nodes, a handful at 1e9: back to about one element per key, as an element-per-bucket
design has throughout). A partition's group is
sorted in memory by one worker, so one bucket of millions of nodes (near-identical
boilerplate pages) needs ~100 B per member there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from tokenmill.transforms.dedup.edges import Edges
from tokenmill.transforms.dedup.survivor import node_hash

# Blobs are tagged by their first field: band keys (LSH), and the verification's signatures
# and edges (in the joins keyed by a node's home, or beside the band keys in a one-partition
# LSH): candidate edges as handle pairs, and edges carrying their first end's key and signature.


# The blobs that travel between the dedup steps: a batch of nodes or edges as packed arrays
# (numpy buffers), node keys as (cat, offs) from pack_keys.
class BandBlob(NamedTuple):
    hashes: bytes  # band keys, uint64
    nodes: bytes  # node index (into keys) per band key, uint32
    keys_cat: bytes
    keys_offs: bytes


class SigBlob(NamedTuple):
    keys_cat: bytes
    keys_offs: bytes
    sigs: bytes  # one signature per node, uint32 x num_perm


class EdgeBlob(NamedTuple):
    a: bytes  # handles of the first ends
    b: bytes  # handles of the second ends


class AttachedBlob(NamedTuple):
    a_keys_cat: bytes  # the distinct first ends, with their signatures
    a_keys_offs: bytes
    a_sigs: bytes
    a_index: bytes  # per edge: its first end's index among them, uint32
    b: bytes  # per edge: the second end's handle

# The constants are xxh64's primes; any good 64-bit mix will do, as a false collision
# (2^-64 per pair and band) only adds a candidate that verification rejects.
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


def pack_keys(keys: list[bytes]) -> tuple[bytes, bytes]:
    """Variable-length keys as (joined bytes, uint64 offsets): one bytes pair for any number."""
    offs = np.zeros(len(keys) + 1, dtype=np.uint64)
    np.cumsum([len(k) for k in keys], out=offs[1:])
    return b"".join(keys), offs.tobytes()


def unpack_keys(cat: bytes, offs: bytes) -> list[bytes]:
    o = np.frombuffer(offs, dtype=np.uint64).tolist()
    return [cat[o[i] : o[i + 1]] for i in range(len(o) - 1)]


def _runs(sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each run of equal values in a sorted array."""
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    return starts, np.diff(np.r_[starts, len(sorted_values)])


def exact_reps(nodes: Iterable[tuple[bytes, Any]]) -> list[tuple[bytes, Any]]:
    """(node key, signature) pairs -> one per exact group (``node_hash``): its smallest key.
    Copies of one text have one signature, so the others would only add edges to it."""
    best: dict[bytes, tuple[bytes, Any]] = {}
    for node in nodes:
        h = node_hash(node[0])
        if h not in best or node[0] < best[h][0]:
            best[h] = node
    return list(best.values())


def band_blobs(
    keys: list[bytes], sigs: list[bytes], bands: int, rows: int, partitions: int
) -> Iterator[tuple[int, BandBlob]]:
    """A batch of nodes -> one blob per LSH partition that any of their band keys falls in.

    A ``BandBlob`` holds band keys, the node index per band key and the nodes' keys: a node of the batch appears once in each blob it has a key in. Signatures stay out
    (a node would travel with up to ``bands`` copies of its signature); the joins bring them,
    or, with one partition, a signature blob beside the band blobs.
    """
    n = len(keys)
    if n == 0:
        return
    sig = np.frombuffer(b"".join(sigs), dtype="<u4").reshape(n, bands * rows)
    h = band_hashes(sig, bands, rows).ravel()  # record i belongs to node i // bands
    node = np.repeat(np.arange(n, dtype=np.uint32), bands)
    if partitions == 1:
        yield 0, BandBlob(h.tobytes(), node.tobytes(), *pack_keys(keys))
        return
    part = h % _U64(partitions)
    order = np.argsort(part, kind="stable")
    ps = part[order]
    starts, lengths = _runs(ps)
    for s, ln in zip(starts.tolist(), lengths.tolist()):
        sel = order[s : s + ln]
        here = np.unique(node[sel])
        local = np.searchsorted(here, node[sel]).astype(np.uint32)
        yield int(ps[s]), BandBlob(h[sel].tobytes(), local.tobytes(), *pack_keys([keys[i] for i in here.tolist()]))


def bucket_edges(blobs: Iterable[tuple], all_pairs_max: int) -> tuple[Edges, int]:
    """The band blobs of one LSH partition (others are skipped) -> (candidate edges (a, b) with
    a < b, big buckets).

    A bucket (equal band key) of more than one node gives candidates: all pairs when it has at
    most ``all_pairs_max`` distinct texts, else a star to its smallest node; copies of a text
    link to its smallest node. A pair found in several bands is listed once.
    """
    hashes, nodes, keys = [], [], []
    for blob in blobs:
        if not isinstance(blob, BandBlob):
            continue
        hashes.append(np.frombuffer(blob.hashes, dtype=np.uint64))
        nodes.append(np.frombuffer(blob.nodes, dtype=np.uint32).astype(np.int64) + len(keys))
        keys.extend(unpack_keys(blob.keys_cat, blob.keys_offs))
    if not hashes:
        return Edges([], np.empty((0, 2), np.int64)), 0
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
    return Edges.from_rows(keys, np.array(list(pairs), dtype=np.int64)), big

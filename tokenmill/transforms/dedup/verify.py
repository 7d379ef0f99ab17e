"""Verification of candidate edges by the signatures' Jaccard estimate, in two joins keyed by a
node's home group (hash % groups): join 1 by the edge's first node attaches its signature, join 2
by the second compares. Signatures and edges travel as blobs, each signature once per join. A
job whose LSH has one partition needs no join: that partition's group holds every signature."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import xxhash

from tokenmill.transforms.dedup.lsh import EDGE_BLOB, SIG_BLOB, pack_keys, unpack_keys


def home(key: bytes, partitions: int) -> int:
    """The verification-join group of a node key."""
    return xxhash.xxh3_64_intdigest(key) % partitions


def _by_home(keys: list[bytes], partitions: int) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(home(k, partitions) if partitions > 1 else 0, []).append(i)
    return groups


def signature_blobs(keys: list[bytes], sigs: list[bytes], partitions: int) -> Iterator[tuple[int, tuple]]:
    """A batch of (node, signature) -> (group, (SIG_BLOB, keys packed, signatures)) by home."""
    for q, idx in _by_home(keys, partitions).items():
        yield q, (SIG_BLOB, *pack_keys([keys[i] for i in idx]), b"".join(sigs[i] for i in idx))


def edge_blobs(
    edges: list[tuple[bytes, bytes]], partitions: int, to_end: int, sig_a: np.ndarray | None = None,
    blob_edges: int = 1 << 16,
) -> Iterator[tuple[int, tuple]]:
    """Edges (with ``a``'s signatures, in join 2) -> (group, (EDGE_BLOB, a packed, b packed,
    sig_a bytes)), grouped by the home of end ``to_end`` (0: a, 1: b)."""
    ends = [e[to_end] for e in edges]
    for q, group in _by_home(ends, partitions).items():
        # In blobs of at most blob_edges edges: a big bucket's star (every edge from one hub
        # goes to one home) must not become a single element of gigabytes.
        for i in range(0, len(group), blob_edges):
            idx = group[i : i + blob_edges]
            yield q, (
                EDGE_BLOB,
                *pack_keys([edges[j][0] for j in idx]),
                *pack_keys([edges[j][1] for j in idx]),
                sig_a[idx].tobytes() if sig_a is not None else b"",
            )


def _read_join_group(blobs, num_perm: int):
    """One join group -> ({node: row}, signature matrix, [(a keys, b keys, sig_a bytes)])."""
    keys: list[bytes] = []
    sig_parts, edge_parts = [], []
    for blob in blobs:
        if blob[0] == SIG_BLOB:
            keys.extend(unpack_keys(blob[1], blob[2]))
            sig_parts.append(blob[3])
        elif blob[0] == EDGE_BLOB:
            edge_parts.append((unpack_keys(blob[1], blob[2]), unpack_keys(blob[3], blob[4]), blob[5]))
    sig = np.frombuffer(b"".join(sig_parts), dtype="<u4").reshape(len(keys), num_perm)
    return {k: i for i, k in enumerate(keys)}, sig, edge_parts


def attach_signature(blobs, num_perm: int, partitions: int, blob_edges: int = 1 << 16) -> Iterator[tuple[int, tuple]]:
    """Join 1, a group keyed by home(a): each edge picks up a's signature and moves to home(b)."""
    row, sig, edge_parts = _read_join_group(blobs, num_perm)
    for a_keys, b_keys, _ in edge_parts:
        found = [i for i, a in enumerate(a_keys) if a in row]  # a node without a signature: no edge
        edges = [(a_keys[i], b_keys[i]) for i in found]
        yield from edge_blobs(edges, partitions, 1, sig[[row[a_keys[i]] for i in found]], blob_edges)


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
    return _verify_by_rows(edges, row, sig, threshold)


def verify_in_group(blobs, num_perm: int, threshold: float) -> tuple[list[tuple[bytes, bytes]], int]:
    """Join 1 when the signature table is one group: that group holds both ends' signatures, so
    it verifies the edges itself (no second join, and no signature copied onto every edge:
    at 49k nodes and 261k candidate edges that copy alone was 117 MB)."""
    row, sig, edge_parts = _read_join_group(blobs, num_perm)
    edges = [(a, b) for a_keys, b_keys, _ in edge_parts for a, b in zip(a_keys, b_keys) if a in row and b in row]
    return _verify_by_rows(edges, row, sig, threshold)


def _verify_by_rows(edges, row: dict, sig: np.ndarray, threshold: float, chunk: int = 1 << 15):
    kept: list[tuple[bytes, bytes]] = []
    rejected = 0
    for i in range(0, len(edges), chunk):  # in chunks: two signature rows per edge add up
        part = edges[i : i + chunk]
        rejected += _keep_similar(part, sig[[row[a] for a, _ in part]], sig[[row[b] for _, b in part]], threshold, kept)
    return kept, rejected


def _keep_similar(edges, sa: np.ndarray, sb: np.ndarray, threshold: float, kept: list) -> int:
    """Appends to ``kept`` the edges whose signature rows (sa[i], sb[i]) agree in a fraction
    >= threshold of places (as ``jaccard_estimate``); returns how many it rejected."""
    ok = (np.count_nonzero(sa == sb, axis=1) / sa.shape[1] >= threshold).tolist()
    kept.extend(e for e, k in zip(edges, ok) if k)
    return len(ok) - sum(ok)

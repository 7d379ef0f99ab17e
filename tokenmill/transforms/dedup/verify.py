"""Verification of candidate edges by the signatures' Jaccard estimate, in two joins keyed by a
node's home group (its handle's hash % groups): join 1 by the edge's first node attaches its key
and signature, join 2 by the second compares. Candidate edges travel as handle pairs; signatures
travel as blobs, each once per join (join 1 sends a first end's signature once per blob, not
once per edge). A job whose LSH has one partition needs no join: that partition's group holds
every signature, and so does a job whose signatures fit one join group."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from tokenmill.transforms.dedup.edges import HANDLE, Edges, HandleTable, handles, homes
from tokenmill.transforms.dedup.lsh import AttachedBlob, EdgeBlob, SigBlob, pack_keys, unpack_keys


def _by_home(hs: np.ndarray, partitions: int) -> Iterator[tuple[int, np.ndarray]]:
    """(group, indices of ``hs`` homed there), groups in ascending order."""
    q = homes(hs, partitions)
    order = np.argsort(q, kind="stable")
    starts = np.flatnonzero(np.r_[True, q[order][1:] != q[order][:-1]]) if len(q) else np.empty(0, np.int64)
    for s, e in zip(starts.tolist(), [*starts[1:].tolist(), len(q)]):
        yield int(q[order[s]]), order[s:e]


def signature_blobs(keys: list[bytes], sigs: list[bytes], partitions: int) -> Iterator[tuple[int, tuple]]:
    """A batch of (node, signature) -> (group, SigBlob) by home."""
    for q, idx in _by_home(handles(keys), partitions):
        idx = idx.tolist()
        yield q, SigBlob(*pack_keys([keys[i] for i in idx]), b"".join(sigs[i] for i in idx))


def edge_blobs(edges: Edges, partitions: int, blob_edges: int = 1 << 16) -> Iterator[tuple[int, tuple]]:
    """Candidate edges -> (group, EdgeBlob) by the home of a."""
    ha, hb = edges.end_handles()
    for q, idx in _by_home(ha, partitions):
        # In blobs of at most blob_edges edges: a big bucket's star (every edge from one hub
        # goes to one home) must not become a single element of gigabytes.
        for i in range(0, len(idx), blob_edges):
            part = idx[i : i + blob_edges]
            yield q, EdgeBlob(ha[part].tobytes(), hb[part].tobytes())


class _JoinGroup:
    """One join group's signatures (its nodes' keys, their signature matrix, rows by handle) and
    the edge blobs that came to it."""

    def __init__(self, blobs, num_perm: int):
        self.keys: list[bytes] = []
        sig_parts, self.edges, self.attached = [], [], []
        for blob in blobs:
            if isinstance(blob, SigBlob):
                self.keys.extend(unpack_keys(blob.keys_cat, blob.keys_offs))
                sig_parts.append(blob.sigs)
            elif isinstance(blob, EdgeBlob):
                self.edges.append((_handles(blob.a), _handles(blob.b)))
            elif isinstance(blob, AttachedBlob):
                self.attached.append(blob)
        self.sig = np.frombuffer(b"".join(sig_parts), dtype="<u4").reshape(len(self.keys), num_perm)
        self.table = HandleTable(self.keys)


def _handles(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=f"S{HANDLE}")


def attach_signature(blobs, num_perm: int, partitions: int, blob_edges: int = 1 << 16) -> Iterator[tuple[int, tuple]]:
    """Join 1, a group keyed by home(a): each edge picks up a's key and signature and moves to
    home(b), as an ``AttachedBlob``."""
    g = _JoinGroup(blobs, num_perm)
    for ha, hb in g.edges:
        ra = g.table.rows(ha)
        found = ra >= 0  # a node without a signature: no edge
        ra, hb = ra[found], hb[found]
        for q, idx in _by_home(hb, partitions):
            for i in range(0, len(idx), blob_edges):
                part = idx[i : i + blob_edges]
                distinct, local = np.unique(ra[part], return_inverse=True)
                yield q, AttachedBlob(*pack_keys([g.keys[r] for r in distinct.tolist()]),
                          g.sig[distinct].tobytes(), local.astype(np.uint32).tobytes(), hb[part].tobytes())


def verify_edges(blobs, num_perm: int, threshold: float) -> tuple[list[tuple[bytes, bytes]], int]:
    """Join 2, a group keyed by home(b): the edges (a, b) whose signatures' Jaccard estimate
    reaches ``threshold`` (computed as ``jaccard_estimate``), and how many were rejected."""
    g = _JoinGroup(blobs, num_perm)
    kept: list[tuple[bytes, bytes]] = []
    rejected = 0
    for a_cat, a_offs, a_sigs, a_idx, hb in g.attached:
        a_keys = unpack_keys(a_cat, a_offs)
        rb = g.table.rows(_handles(hb))
        found = rb >= 0
        ia = np.frombuffer(a_idx, dtype=np.uint32)[found]
        rb = rb[found]
        sa = np.frombuffer(a_sigs, dtype="<u4").reshape(len(a_keys), num_perm)
        ok = _similar(sa[ia], g.sig[rb], threshold)
        kept.extend((a_keys[a], g.keys[b]) for a, b in zip(ia[ok].tolist(), rb[ok].tolist()))
        rejected += int(len(ok) - ok.sum())
    return kept, rejected


def verify_local(blobs, edges: Edges, num_perm: int, threshold: float) -> tuple[Edges, int]:
    """``verify_edges`` for a one-partition LSH, whose group holds every signature beside the
    band keys: (kept edges, rejected count)."""
    g = _JoinGroup(blobs, num_perm)
    rows = g.table.rows(handles(edges.keys))[edges.index] if len(edges) else np.empty((0, 2), np.int64)
    ok = _verify_rows(rows, g.sig, threshold)
    return edges.select(ok), int(len(ok) - ok.sum())


def verify_in_group(blobs, num_perm: int, threshold: float) -> tuple[Edges, int]:
    """Join 1 when the signature table is one group: that group holds both ends' signatures, so
    it verifies the edges itself (no second join, and no signature copied onto an edge)."""
    g = _JoinGroup(blobs, num_perm)
    rows = [np.stack([g.table.rows(ha), g.table.rows(hb)], axis=1) for ha, hb in g.edges]
    rows = np.concatenate(rows) if rows else np.empty((0, 2), np.int64)
    rows = rows[(rows >= 0).all(axis=1)]
    ok = _verify_rows(rows, g.sig, threshold)
    return Edges.from_rows(g.keys, rows[ok]), int(len(ok) - ok.sum())


def _verify_rows(rows: np.ndarray, sig: np.ndarray, threshold: float, chunk: int = 1 << 15) -> np.ndarray:
    """Which edges (rows of ``sig`` per end) are similar, in chunks: two signature rows per
    edge add up."""
    ok = np.zeros(len(rows), dtype=bool)
    for i in range(0, len(rows), chunk):
        part = rows[i : i + chunk]
        ok[i : i + chunk] = _similar(sig[part[:, 0]], sig[part[:, 1]], threshold)
    return ok


def _similar(sa: np.ndarray, sb: np.ndarray, threshold: float) -> np.ndarray:
    """Whether signature rows (sa[i], sb[i]) agree in a fraction >= threshold of places (as
    ``jaccard_estimate``)."""
    if not len(sa):
        return np.zeros(0, dtype=bool)
    return np.count_nonzero(sa == sb, axis=1) / sa.shape[1] >= threshold

"""Edges between nodes, compact: the distinct node keys once, sorted, and the edges as pairs of
indices into them; and node handles, 16 bytes standing for a ~150-byte node key where an edge
leaves its group.

A node key embeds the document id, so that keys sort in survivor order, and ids can be long
paths: an edge as two keys costs hundreds of bytes (bench/MEASUREMENTS.md: edges as index
pairs). As index pairs edges are 16 bytes in a group, and as handle pairs 32 bytes between
groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import xxhash

from tokenmill.transforms.dedup.unionfind import union_find_components

HANDLE = 16  # bytes: xxh3-128 of the node key; a false match is a 2^-128 event per pair


def handles(keys: Iterable[bytes]) -> np.ndarray:
    """The node keys' handles, as a numpy array of 16-byte strings (``S16``: sortable,
    searchable)."""
    return np.frombuffer(b"".join(xxhash.xxh3_128_digest(k) for k in keys), dtype=f"S{HANDLE}")


def homes(hs: np.ndarray, partitions: int) -> np.ndarray:
    """The join group of each handle: its first 8 bytes modulo ``partitions``."""
    if partitions == 1 or not len(hs):
        return np.zeros(len(hs), dtype=np.int64)
    first = np.frombuffer(hs.tobytes(), dtype="<u8")[::2]
    return (first % np.uint64(partitions)).astype(np.int64)


class HandleTable:
    """Rows by handle, for the nodes whose keys a join group holds."""

    def __init__(self, keys: list[bytes]):
        hs = handles(keys)
        self._order = np.argsort(hs, kind="stable")
        self._sorted = hs[self._order]

    def rows(self, query: np.ndarray) -> np.ndarray:
        """The row of each queried handle, -1 where the group does not hold it."""
        if not len(self._sorted) or not len(query):
            return np.full(len(query), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._sorted, query), len(self._sorted) - 1)
        return np.where(self._sorted[pos] == query, self._order[pos], -1)


class Edges:
    """Edges (a, b), a < b, between ``keys`` (sorted and distinct, so index order is key order):
    ``index`` is an (m, 2) int64 array of unique pairs, sorted."""

    __slots__ = ("keys", "index")

    def __init__(self, keys: list[bytes], index: np.ndarray):
        self.keys = keys
        self.index = index

    @classmethod
    def from_rows(cls, keys: list[bytes], rows: np.ndarray) -> Edges:
        """Edges given as (m, 2) rows into ``keys`` (any order, repeats and duplicates allowed)."""
        uniq = sorted(set(keys))
        if len(uniq) == len(keys) and all(keys[i] < keys[i + 1] for i in range(len(keys) - 1)):
            rank = np.arange(len(keys), dtype=np.int64)
        else:
            pos = {k: i for i, k in enumerate(uniq)}
            rank = np.fromiter((pos[k] for k in keys), dtype=np.int64, count=len(keys))
        index = np.sort(rank[rows.reshape(-1, 2)], axis=1) if len(rows) else np.empty((0, 2), np.int64)
        index = index[index[:, 0] != index[:, 1]]
        return cls(uniq, np.unique(index, axis=0) if len(index) else index)

    @classmethod
    def from_pairs(cls, pairs: list[tuple[bytes, bytes]]) -> Edges:
        keys = [k for pair in pairs for k in pair]
        return cls.from_rows(keys, np.arange(len(keys), dtype=np.int64).reshape(-1, 2))

    def __len__(self) -> int:
        return len(self.index)

    def select(self, mask: np.ndarray) -> Edges:
        return Edges(self.keys, self.index[mask])

    def key_pairs(self) -> list[tuple[bytes, bytes]]:
        keys = self.keys
        return [(keys[a], keys[b]) for a, b in self.index.tolist()]

    def end_handles(self) -> tuple[np.ndarray, np.ndarray]:
        hs = handles(self.keys)
        return hs[self.index[:, 0]], hs[self.index[:, 1]]

    def labels(self) -> Iterator[tuple[bytes, bytes]]:
        """(node key, smallest key of its component) for every node on an edge."""
        keys = self.keys
        for v, r in union_find_components(map(tuple, self.index.tolist())).items():
            yield keys[v], keys[r]

    def star_forest(self) -> list[tuple[bytes, bytes]]:
        """The same connectivity in fewest edges, as key pairs: each node to its component's
        minimum."""
        return [(v, r) for v, r in self.labels() if v != r]

"""The size limits of dedup's distributed steps, as one object passed down (tests shrink them
to drive a small corpus through a big job's paths)."""

from __future__ import annotations

from typing import NamedTuple


class Limits(NamedTuple):
    # Band records per LSH partition: one worker sorts a partition in memory (6 MB of band keys
    # and indices, plus at most one node key per band key: ~50 MB). A small job is one partition.
    partition_records: int = 1 << 19
    # Signatures per verification-join group (~64 MB with their keys at 112 permutations).
    join_nodes: int = 1 << 17
    # Edges per blob in the joins: 2 MB of handle pairs, and at most as many first ends with their
    # signatures (~30 MB) in join 2.
    edge_blob: int = 1 << 16
    # Nodes per band_blobs call: ~4 MB of signatures, and few blobs per partition in a small job.
    batch_nodes: int = 8192
    # A node's neighbours are de-duplicated in a set only up to this many; past it they are
    # streamed (duplicate edges are harmless, only slower), so a hub of millions never sits in memory.
    dedupe_cap: int = 200_000

    def lsh_partitions(self, nodes: int, bands: int) -> int:
        """How many groups the band records are spread over (a sized count of groups, not one
        group per bucket: see lsh.band_blobs)."""
        return max(1, -(-nodes * bands // self.partition_records))

    def join_partitions(self, nodes: int) -> int:
        """How many groups the signature table is spread over for the verification joins."""
        return max(1, -(-nodes // self.join_nodes))

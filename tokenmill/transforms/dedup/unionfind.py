"""The one union-find of dedup (components' residual step, a group's own labelling, the
star forests), on any comparable node ids: the root of a set is its minimum."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def uf_find(parent: dict, x):
    root = parent.setdefault(x, x)
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:  # path compression
        parent[x], x = root, parent[x]
    return root


def uf_union(parent: dict, a, b) -> None:
    ra, rb = uf_find(parent, a), uf_find(parent, b)
    if ra != rb:
        if rb < ra:
            ra, rb = rb, ra
        parent[rb] = ra  # the smaller root wins: a root is the minimum of its set


def union_find_components(edges: Iterable[tuple[Any, Any]]) -> dict[Any, Any]:
    """Node -> smallest node of its component, for every node on an edge."""
    parent: dict[Any, Any] = {}
    for a, b in edges:
        uf_union(parent, a, b)
    return {x: uf_find(parent, x) for x in list(parent)}


def star_forest(edges: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The same connectivity as ``edges`` in fewest edges: each node to its component's minimum.
    Applied per group before the components, so one group (a small job) hands them over
    already converged."""
    return [(v, r) for v, r in union_find_components(edges).items() if v != r]

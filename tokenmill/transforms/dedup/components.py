"""Connected components of the verified edges, and the one union-find they share.

Alternating large-star / small-star (Kiveris et al., "Connected Components in MapReduce and
Beyond", 2014), ``max_rounds`` rounds unrolled in the graph; then a local check labels every
node with the smallest node of its neighbourhood and finds the edges whose endpoints still
disagree. Those residual edges (none once converged) go through a union-find, whose mapping
reaches every node as a side input, so the result is exact whatever ``max_rounds`` is.
Counters report the changes per round and the residual.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsSingleton, TaggedOutput

from tokenmill.transforms.dedup.limits import Limits
from tokenmill.transforms.dedup.unionfind import uf_find, uf_union

NS = "dedup"


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


def _iter_distinct(values: Iterable[Any], cap: int) -> Iterator[Any]:
    seen: set[Any] = set()
    for v in values:
        if v in seen:
            continue
        if len(seen) < cap:
            seen.add(v)
        yield v


class _StarStep(beam.DoFn):
    """One step of round ``rnd``; counts the edges it changes as cc_round{rnd}_{STEP}_changed."""

    STEP = ""

    def __init__(self, rnd: int, cap: int):
        self._rnd = rnd
        self._cap = cap

    def setup(self):
        self._changed = Metrics.counter(NS, f"cc_round{self._rnd}_{self.STEP}_changed")


class _LargeStar(_StarStep):
    """Per node u: connect every larger neighbour to m(u) = min(u and its neighbours)."""

    STEP = "large_star"

    def process(self, kv):
        u, nbrs = kv
        m = u
        for v in nbrs:  # first pass: the minimum (the iterable is re-iterable)
            if v < m:
                m = v
        changed = 0
        for v in _iter_distinct(nbrs, self._cap):
            if v > u:
                yield (v, m)  # keyed by its larger end (v > u >= m), as small-star groups
                changed += m != u
        if changed:
            self._changed.inc(changed)


class _SmallStar(_StarStep):
    """Per node u with its smaller neighbours N: connect N and u to m = min(N).

    Emits every new edge in both directions, as the next large-star (or the labelling) groups
    by either end.
    """

    STEP = "small_star"

    def process(self, kv):
        u, smaller = kv
        m = min(smaller)
        changed = 0
        for v in _iter_distinct(smaller, self._cap):
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

    def __init__(self, cap: int):
        self._cap = cap

    def process(self, kv):
        u, nbrs = kv
        p = u
        for v in nbrs:
            if v < p:
                p = v
        yield (u, (0, p))
        for v in _iter_distinct(nbrs, self._cap):
            if v > u:
                yield (v, (1, p))


class _CheckLabels(beam.DoFn):
    """Keeps p(v); an edge whose endpoints disagree on p is a residual edge between labels.

    Once large-star/small-star has converged the graph is a forest of stars around each
    component minimum, so p is the component minimum everywhere and there is no residual.
    """

    RESIDUAL = "residual"

    def setup(self):
        self._residual = Metrics.counter(NS, "cc_residual_edges")

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
        uf_union(acc, *edge)
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        out = next(accs, None) or {}
        for acc in accs:
            for x, px in acc.items():
                uf_union(out, x, px)
        return out

    def extract_output(self, acc):
        return {x: r for x in list(acc) if (r := uf_find(acc, x)) != x}


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

    def __init__(self, max_rounds: int = 6, limits: Limits = Limits(), label: str | None = None):
        super().__init__(label)
        self._max_rounds = max_rounds
        self._cap = limits.dedupe_cap

    def expand(self, edges):
        e = edges | "BothDirections" >> beam.FlatMap(_both_directions)
        for i in range(self._max_rounds):
            e = (
                e
                | f"Round{i}LargeStarGroup" >> beam.GroupByKey()
                | f"Round{i}LargeStar" >> beam.ParDo(_LargeStar(i, self._cap))
                | f"Round{i}SmallStarGroup" >> beam.GroupByKey()
                | f"Round{i}SmallStar" >> beam.ParDo(_SmallStar(i, self._cap))
            )
        checked = (
            e
            | "LabelGroup" >> beam.GroupByKey()
            | "LocalLabel" >> beam.ParDo(_LocalLabel(self._cap))
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

"""Dedup as Beam steps: node records in, verdicts out.

1. Exact: every document that takes part is a node under its node key, which ends in ``h``
   (xxh3-128 of its lower-cased, whitespace-collapsed text). Copies share a signature, so LSH
   puts them in one component: copies that meet in one batch are merged first (the smallest
   key stays), the others link to their smallest node in every bucket. The last join by ``h``
   finds each group's representative and tells exact copies from near ones.
2. MinHash signatures come with the records (records.Recorder).
3. LSH on packed blocks (lsh), verification in two joins (verify), or, for a job whose LSH has
   one partition, in that partition's group, which then labels the nodes itself.
4. Connected components (components).
5. Survivor: the component minimum is the survivor (survivor.node_key); the join by ``h`` gives
   every member of a cluster its ``Verdict``.

Only keys, signatures, edges and verdicts move: never a document.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsSingleton, TaggedOutput

from tokenmill.config import DedupConfig
from tokenmill.transforms.dedup import verify
from tokenmill.transforms.dedup.components import NS, ConnectedComponents
from tokenmill.transforms.dedup.edges import Edges
from tokenmill.transforms.dedup.limits import Limits
from tokenmill.transforms.dedup.lsh import band_blobs, bucket_edges, exact_reps
from tokenmill.transforms.dedup.records import Recorder
from tokenmill.transforms.dedup.survivor import group_verdicts, node_hash
from tokenmill.transforms.dedup.unionfind import star_forest, union_find_components


class NodesFn(beam.DoFn):
    """Docs -> their dedup nodes (those that take part), for running Dedup on documents outside
    ``prepare`` (whose Stash step makes the nodes as it stores the documents)."""

    def __init__(self, cfg: DedupConfig):
        self._cfg = cfg

    def setup(self):
        self._recorder = Recorder(self._cfg)

    def process(self, doc):
        node = self._recorder(doc)
        if node is not None:
            yield node


def _join_records(node):
    """A node -> its join record by h (every node), and its LSH record (those with a signature)."""
    key, sig = node
    yield (node_hash(key), (0, key))
    if sig is not None:
        yield TaggedOutput(_LSH, (key, sig))


_LSH = "lsh"


class _BandBlobs(beam.DoFn):
    """A batch of (node key, signature) -> band blobs (main) and, to verify, signature blobs:
    beside the band blobs when the LSH has one partition (its group verifies), else to the
    joins ('sigs')."""

    SIGS = "sigs"

    def __init__(self, bands: int, rows: int, verifying: bool, limits: Limits):
        self._bands = bands
        self._rows = rows
        self._verify = verifying
        self._limits = limits

    def process(self, batch, nodes):
        batch = exact_reps(batch)
        keys = [k for k, _ in batch]
        sigs = [s for _, s in batch]
        partitions = self._limits.lsh_partitions(nodes, self._bands)
        yield from band_blobs(keys, sigs, self._bands, self._rows, partitions)
        if self._verify and partitions == 1:
            yield from verify.signature_blobs(keys, sigs, 1)
        elif self._verify:
            for kv in verify.signature_blobs(keys, sigs, self._limits.join_partitions(nodes)):
                yield TaggedOutput(self.SIGS, kv)


class _EdgeSink(beam.DoFn):
    """Where edges are known to be kept: a group that saw every edge labels the nodes itself
    ('labels', ready for the final join) and the components get nothing to do; any other group
    hands its edges on to the components as a star forest."""

    LABELS = "labels"

    def setup(self):
        self._kept = Metrics.counter(NS, "verify_kept_edges")
        self._rejected = Metrics.counter(NS, "verify_rejected_edges")

    def _emit(self, kept: Edges | list[tuple[bytes, bytes]], whole: bool):
        if whole:
            labels = kept.labels() if isinstance(kept, Edges) else union_find_components(kept).items()
            for label in labels:
                yield TaggedOutput(self.LABELS, _label_for_join(label))
        else:
            yield from kept.star_forest() if isinstance(kept, Edges) else star_forest(kept)

    def _verified(self, kept, rejected: int, whole: bool):
        self._kept.inc(len(kept))
        self._rejected.inc(rejected)
        return self._emit(kept, whole)


class _BucketEdges(_EdgeSink):
    """One LSH partition -> its candidate edges. Verified here when the LSH has one partition
    (the signatures came along), else sent to the joins as handle pairs by home(a); unverified,
    they go on as they are."""

    def __init__(self, cfg: DedupConfig, limits: Limits):
        self._limits = limits
        self._max = cfg.bucket_all_pairs_max
        self._verify = cfg.verify
        self._bands = cfg.bands
        self._num_perm = cfg.bands * cfg.rows
        self._threshold = cfg.verify_threshold

    def setup(self):
        super().setup()
        self._candidates = Metrics.counter(NS, "lsh_candidate_edges")
        self._big = Metrics.counter(NS, "lsh_big_buckets")

    def process(self, kv, nodes):
        edges, big = bucket_edges(kv[1], self._max)
        self._candidates.inc(len(edges))
        if big:
            self._big.inc(big)
        whole = self._limits.lsh_partitions(nodes, self._bands) == 1
        if not self._verify:
            yield from self._emit(edges, whole)
        elif whole:
            yield from self._verified(*verify.verify_local(kv[1], edges, self._num_perm, self._threshold), True)
        else:
            yield from verify.edge_blobs(edges, self._limits.join_partitions(nodes), self._limits.edge_blob)


class _JoinSink(_EdgeSink):
    """A verification join's group: signatures of ``num_perm`` values, edges kept at ``threshold``."""

    def __init__(self, num_perm: int, threshold: float, limits: Limits):
        self._num_perm = num_perm
        self._threshold = threshold
        self._limits = limits


class _AttachSignature(_JoinSink):
    """Join 1 (see attach_signature); with one join group, it verifies (verify_in_group)."""

    def process(self, kv, nodes):
        partitions = self._limits.join_partitions(nodes)
        if partitions == 1:
            yield from self._verified(*verify.verify_in_group(kv[1], self._num_perm, self._threshold), True)
        else:
            yield from verify.attach_signature(kv[1], self._num_perm, partitions, self._limits.edge_blob)


class _VerifyEdges(_JoinSink):
    """Join 2 (see verify_edges)."""

    def process(self, kv, nodes):
        kept, rejected = verify.verify_edges(kv[1], self._num_perm, self._threshold)
        yield from self._verified(kept, rejected, self._limits.join_partitions(nodes) == 1)


def _label_for_join(kv):
    node, label = kv
    return node_hash(node), (2, label)


class _Keys:
    """An exact group's node keys, iterable twice without a list: one group may hold millions
    of copies (group_verdicts reads it twice)."""

    def __init__(self, items):
        self._items = items

    def __iter__(self):
        return (k for t, k in self._items if t == 0)


class _Assign(beam.DoFn):
    """Per exact group h: its node keys (tag 0) and, when the group is in a near-duplicate
    component, its nodes' component labels (tag 2). Every node of the group that took part in
    LSH is in one component (copies share a signature), so any message's label is the group's."""

    def __init__(self, cfg: DedupConfig):
        self._mode = cfg.survivor

    def setup(self):
        self._counts = {r: Metrics.counter(NS, n) for r, n in
                        ((None, "cluster_survivors"), ("dedup:exact_duplicate", "exact_duplicates"),
                         ("dedup:near_duplicate", "near_duplicates"))}

    def process(self, kv):
        _h, items = kv
        label = next((v for t, v in items if t == 2), None)
        for v in group_verdicts(_Keys(items), label, self._mode):
            self._counts[v.reason].inc()
            yield v


class _Sized(beam.DoFn):
    """Per cluster: its verdicts again, each with the cluster's size (counted first: the group
    is iterated twice, never copied into a list)."""

    def process(self, kv):
        _cluster, verdicts = kv
        size = sum(1 for _ in verdicts)
        for v in verdicts:
            yield v._replace(size=size, label=b"")  # the label's job is done: lighter on the way to buckets


class Dedup(beam.PTransform):
    """PCollection[Node] -> PCollection[Verdict]: one verdict per document in a cluster (exact
    or near), with the cluster's size; a document with no verdict is unique."""

    def __init__(self, cfg: DedupConfig | None = None, limits: Limits = Limits(), label: str | None = None):
        super().__init__(label)
        self._cfg = cfg or DedupConfig()
        self._limits = limits

    def expand(self, nodes):
        cfg, limits = self._cfg, self._limits
        prepared = nodes | "Prepare" >> (
            beam.FlatMap(_join_records)
            # Without this, Beam infers the main output as "tuple or TaggedOutput" and the
            # GroupByKey downstream refuses it.
            .with_output_types(tuple[bytes, tuple[int, Any]])
            .with_outputs(_LSH, main="join")
        )
        labels = []  # (h, (2, label)) for the join
        if cfg.near:
            sigs = prepared[_LSH]
            count = sigs | "CountNodes" >> beam.CombineGlobally(beam.combiners.CountCombineFn()).without_defaults()
            n_nodes = AsSingleton(count, default_value=0)
            blobs = (
                sigs
                | "BatchNodes" >> beam.BatchElements(min_batch_size=limits.batch_nodes,
                                                     max_batch_size=limits.batch_nodes)
                | "BandBlobs"
                >> beam.ParDo(_BandBlobs(cfg.bands, cfg.rows, cfg.verify, limits), n_nodes)
                .with_output_types(tuple[int, Any])
                .with_outputs(_BandBlobs.SIGS, main="bands")
            )
            buckets = (
                blobs.bands
                | "Buckets" >> beam.GroupByKey()
                | "BucketEdges"
                >> beam.ParDo(_BucketEdges(cfg, limits), n_nodes)
                .with_output_types(tuple[Any, Any])
                .with_outputs(_EdgeSink.LABELS, main="edges")
            )
            labels.append(buckets.labels)
            edges = buckets.edges
            if cfg.verify:
                num_perm = cfg.bands * cfg.rows

                def join(edges, group: str, step: str, fn):  # the signatures meet the edges by home
                    return ((blobs.sigs, edges)
                            | f"{group}Flatten" >> beam.Flatten()
                            | f"{group}Group" >> beam.GroupByKey()
                            | step >> beam.ParDo(fn(num_perm, cfg.verify_threshold, limits), n_nodes)
                            .with_output_types(tuple[Any, Any])
                            .with_outputs(_EdgeSink.LABELS, main="edges"))

                attached = join(edges, "SigA", "AttachSignature", _AttachSignature)
                labels.append(attached.labels)
                verified = join(attached.edges, "SigB", "Verify", _VerifyEdges)
                edges = verified.edges
                labels.append(verified.labels)
            components = edges | "Components" >> ConnectedComponents(cfg.max_rounds, limits)
            labels.append(components | "LabelForJoin" >> beam.Map(_label_for_join))
        return (
            [prepared.join, *labels]
            | "JoinFlatten" >> beam.Flatten()
            | "JoinGroup" >> beam.GroupByKey()
            | "Assign" >> beam.ParDo(_Assign(cfg))
            # Every member learns its cluster's size (dup_cluster_size, and rehydration).
            | "ByCluster" >> beam.Map(lambda v: (v.label, v))
            | "ClusterGroup" >> beam.GroupByKey()
            | "Sized" >> beam.ParDo(_Sized())
        )

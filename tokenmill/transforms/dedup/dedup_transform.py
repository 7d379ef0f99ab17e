"""Dedup as Beam steps: node records in, verdicts out.

1. Exact: every document that takes part is a node under its node key, which ends in ``h``
   (xxh3-128 of its lower-cased, whitespace-collapsed text). Copies share a signature, so LSH
   puts them in one component: copies that meet in one batch are merged first (the smallest
   key stays), the others link to their smallest node in every bucket. The last join by ``h``
   finds each group's representative and tells exact copies from near ones.
2. MinHash signatures come with the records (nodes.Recorder).
3. LSH on packed blocks (lsh), verification in two joins (verify), or, for a job whose LSH has
   one partition, in that partition's group, which then labels the nodes itself.
4. Connected components (components).
5. Survivor: the component minimum is the survivor (survivor.node_key); the join by ``h`` gives
   every member of a cluster its ``Verdict``, and a count by cluster its cluster's size.

Only keys, edges and refs to spilled records (spill) move: never a document. Per node, only
refs are grouped (its join record by ``h``, its signature and band keys, its verdict); edges
and component labels, which only nodes in clusters have, are grouped as they are until the
join by ``h``.
"""

from __future__ import annotations

import functools
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
from tokenmill.transforms.dedup.nodes import Recorder
from tokenmill.transforms.dedup.survivor import exact_verdicts, node_hash, sized
from tokenmill.transforms.dedup.unionfind import star_forest, union_find_components
from tokenmill.transforms.spill import Spiller, SpillFn, Unspilled, emit_refs, read_spill


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


_LSH = "lsh"


def join_group(key: bytes, groups: int) -> int:
    """The group of the join by ``h`` that a node key (or ``h`` itself, or a cluster's label)
    goes to: its ``h``'s first 8 bytes modulo ``groups``."""
    return int.from_bytes(node_hash(key)[:8], "little") % groups


def _label_group(kv, groups: int) -> int:
    return join_group(kv[0], groups)


def _cluster_group(v, groups: int) -> int:
    return join_group(v.label, groups)


class _Prepare(beam.DoFn):
    """A node -> its join record by h, (h, (0, key)), and, when it has a signature, its (key,
    signature), each into the bundle's spill files: the join records by join group (refs on the
    main output), the signatures as one run ('lsh'), so that the nodes wait in files, not in the
    runner, while they are counted and grouped."""

    def __init__(self, folder: str, groups: int):
        self._folder = folder
        self._groups = groups

    def start_bundle(self):
        # A Spiller opens its file at its first flush: one that gets nothing costs nothing.
        self._join, self._spill = Spiller(self._folder), Spiller(self._folder)

    def process(self, node):
        key, sig = node
        h = node_hash(key)
        self._join.add(join_group(h, self._groups), (h, (0, key)))
        if sig is not None:
            self._spill.add(0, (key, sig))

    def finish_bundle(self):
        yield from emit_refs(self._join)
        yield from emit_refs(self._spill, _LSH)


class _BandBlobs(beam.DoFn):
    """A spilled run of (node key, signature), read in batches of ``batch_nodes`` -> band blobs
    by LSH partition (main), spilled too: only their refs go on. Without verification; see
    _BandAndSignatureBlobs for the signatures verification needs."""

    SIGS = "sigs"

    def __init__(self, bands: int, rows: int, limits: Limits, folder: str):
        self._bands = bands
        self._rows = rows
        self._limits = limits
        self._folder = folder

    def start_bundle(self):
        self._band_spill, self._sig_spill = Spiller(self._folder), Spiller(self._folder)

    def process(self, kv, nodes):
        batch = []
        for node in read_spill(kv[1]):
            batch.append(node)
            if len(batch) >= self._limits.batch_nodes:
                self._spill(batch, nodes)
                batch = []
        if batch:
            self._spill(batch, nodes)

    def _spill(self, batch, nodes: int) -> None:
        batch = exact_reps(batch)
        keys = [k for k, _ in batch]
        sigs = [s for _, s in batch]
        partitions = self._limits.lsh_partitions(nodes, self._bands)
        for q, blob in band_blobs(keys, sigs, self._bands, self._rows, partitions):
            self._band_spill.add(q, blob)
        self._signatures(keys, sigs, partitions, nodes)

    def _signatures(self, keys: list[bytes], sigs: list[bytes], partitions: int, nodes: int) -> None:
        """Unverified edges need no signatures."""

    def finish_bundle(self):
        yield from emit_refs(self._band_spill)
        yield from emit_refs(self._sig_spill, self.SIGS)


class _BandAndSignatureBlobs(_BandBlobs):
    """_BandBlobs, and, to verify, signature blobs: beside the band blobs when the LSH has one
    partition (its group verifies), else by join group ('sigs')."""

    def _signatures(self, keys: list[bytes], sigs: list[bytes], partitions: int, nodes: int) -> None:
        joins = 1 if partitions == 1 else self._limits.join_partitions(nodes)
        spill = self._band_spill if partitions == 1 else self._sig_spill
        for q, blob in verify.signature_blobs(keys, sigs, joins):
            spill.add(q, blob)


class _EdgeSink(beam.DoFn):
    """Where edges are known to be kept: a group that saw every edge labels the nodes itself
    ('labels', ready for the final join) and the components get nothing to do; any other group
    hands its edges on to the components as a star forest. Blobs bound for a verification join
    go through the bundle's spill file (``_to_join``): join 2's carry first ends' signatures, and
    held in the runner's group buffers they would grow the runner with the corpus
    (bench/MEASUREMENTS.md: join blobs spilled)."""

    LABELS = "labels"

    def __init__(self, folder: str):
        self._folder = folder

    def setup(self):
        self._kept = Metrics.counter(NS, "verify_kept_edges")
        self._rejected = Metrics.counter(NS, "verify_rejected_edges")

    def start_bundle(self):
        self._spill = Spiller(self._folder)

    def _to_join(self, blobs) -> None:
        for q, blob in blobs:
            self._spill.add(q, blob)

    def finish_bundle(self):
        yield from emit_refs(self._spill)

    def _emit(self, kept: Edges, whole: bool):
        """The kept edges on: as labels from a group that saw them all, else as a star forest."""
        if whole:
            yield from self._labelled(kept.labels())
        else:
            yield from kept.star_forest()

    def _labelled(self, labels):
        for label in labels:
            yield TaggedOutput(self.LABELS, _label_for_join(label))

    def _verified(self, kept, rejected: int, whole: bool):
        self._kept.inc(len(kept))
        self._rejected.inc(rejected)
        return self._emit(kept, whole)


class _BucketEdges(_EdgeSink):
    """One LSH partition -> its candidate edges, on as they are (no verification; see
    _VerifiedBucketEdges)."""

    def __init__(self, cfg: DedupConfig, limits: Limits, folder: str):
        super().__init__(folder)
        self._limits = limits
        self._max = cfg.bucket_all_pairs_max
        self._bands = cfg.bands

    def setup(self):
        super().setup()
        self._candidates = Metrics.counter(NS, "lsh_candidate_edges")
        self._big = Metrics.counter(NS, "lsh_big_buckets")

    def _candidate_edges(self, blobs) -> Edges:
        edges, big = bucket_edges(blobs, self._max)
        self._candidates.inc(len(edges))
        if big:
            self._big.inc(big)
        return edges

    def process(self, kv, nodes):
        edges = self._candidate_edges(Unspilled(kv[1]))
        yield from self._emit(edges, self._limits.lsh_partitions(nodes, self._bands) == 1)


class _VerifiedBucketEdges(_BucketEdges):
    """One LSH partition -> its candidate edges, verified here when the LSH has one partition
    (the signatures came along), else sent to the joins as handle pairs by home(a)."""

    def __init__(self, cfg: DedupConfig, limits: Limits, folder: str):
        super().__init__(cfg, limits, folder)
        self._num_perm = cfg.bands * cfg.rows
        self._threshold = cfg.verify_threshold

    def process(self, kv, nodes):
        blobs = Unspilled(kv[1])
        edges = self._candidate_edges(blobs)
        if self._limits.lsh_partitions(nodes, self._bands) == 1:
            yield from self._verified(*verify.verify_local(blobs, edges, self._num_perm, self._threshold), True)
        else:
            self._to_join(verify.edge_blobs(edges, self._limits.join_partitions(nodes), self._limits.edge_blob))


class _JoinSink(_EdgeSink):
    """A verification join's group: signatures of ``num_perm`` values, edges kept at ``threshold``."""

    def __init__(self, num_perm: int, threshold: float, limits: Limits, folder: str):
        super().__init__(folder)
        self._num_perm = num_perm
        self._threshold = threshold
        self._limits = limits


class _AttachSignature(_JoinSink):
    """Join 1 (see attach_signature); with one join group, it verifies (verify_in_group)."""

    def process(self, kv, nodes):
        partitions = self._limits.join_partitions(nodes)
        if partitions == 1:
            yield from self._verified(*verify.verify_in_group(Unspilled(kv[1]), self._num_perm, self._threshold), True)
        else:
            self._to_join(verify.attach_signature(Unspilled(kv[1]), self._num_perm, partitions, self._limits.edge_blob))


class _VerifyEdges(_JoinSink):
    """Join 2 (see verify_edges)."""

    def process(self, kv, nodes):
        kept, rejected = verify.verify_edges(Unspilled(kv[1]), self._num_perm, self._threshold)
        yield from self._verified(kept, rejected, self._limits.join_partitions(nodes) == 1)

    def _emit(self, kept: list[tuple[bytes, bytes]], whole: bool):
        """As _EdgeSink._emit, for edges as key pairs (what join 2 keeps)."""
        if whole:
            yield from self._labelled(union_find_components(kept).items())
        else:
            yield from star_forest(kept)


def _label_for_join(kv):
    node, label = kv
    return node_hash(node), (2, label)


class _Assign(beam.DoFn):
    """A join group: the records of its exact groups (spilled), node keys (tag 0) and, for a
    group in a near-duplicate component, its nodes' component labels (tag 2) -> their verdicts
    (exact_verdicts). The group holds per h a count and two keys, not the records."""

    def __init__(self, cfg: DedupConfig):
        self._mode = cfg.survivor

    def setup(self):
        self._counts = {r: Metrics.counter(NS, n) for r, n in
                        ((None, "cluster_survivors"), ("dedup:exact_duplicate", "exact_duplicates"),
                         ("dedup:near_duplicate", "near_duplicates"))}

    def process(self, kv):
        for v in exact_verdicts(Unspilled(kv[1]), self._mode):
            self._counts[v.reason].inc()
            yield v


def _sized(kv):
    """A group of clusters' verdicts (spilled) -> each with its cluster's size (sized)."""
    return sized(Unspilled(kv[1]))


class Dedup(beam.PTransform):
    """PCollection[Node] -> PCollection[Verdict]: one verdict per document in a cluster (exact
    or near), with the cluster's size; a document with no verdict is unique. Signatures and
    band keys are spilled to files under ``tmp`` (spill), and so are the records of the join by
    ``h`` and the verdicts counted by cluster, each spread over ``groups`` groups (prepare gives
    its bucket count, so a group holds about a bucket's nodes): only refs, edges and keys are
    grouped. The caller removes ``tmp`` after the job."""

    def __init__(self, cfg: DedupConfig | None = None, limits: Limits = Limits(), label: str | None = None,
                 tmp: str = "", groups: int = 1):
        super().__init__(label)
        self._cfg = cfg or DedupConfig()
        self._limits = limits
        if not tmp:
            raise ValueError("Dedup needs a temporary folder (tmp) for its spill files")
        self._tmp = tmp
        self._groups = groups

    def expand(self, nodes):
        prepared = nodes | "Prepare" >> (
            beam.ParDo(_Prepare(self._tmp, self._groups))
            # Without this, Beam infers the main output as "tuple or TaggedOutput" and the
            # GroupByKey downstream refuses it.
            .with_output_types(tuple[int, Any])
            .with_outputs(_LSH, main="join")
        )
        # (step, (h, (2, label))) for the join; exact only: none, the join by h does it all
        labels = self._near_labels(prepared[_LSH]) if self._cfg.near else []
        spill = functools.partial(SpillFn, self._tmp)
        # Each labels PCollection is spilled by its producer: spilled after a Flatten, the labels
        # would wait in the runner's Flatten buffer.
        label_refs = [pc | f"{step}LabelSpill" >> beam.ParDo(spill(functools.partial(_label_group, groups=self._groups)))
                      for step, pc in labels]
        return (
            [prepared.join, *label_refs]
            | "JoinFlatten" >> beam.Flatten()
            | "JoinGroup" >> beam.GroupByKey()
            | "Assign" >> beam.ParDo(_Assign(self._cfg))
            # Every member learns its cluster's size (dup_cluster_size, and rehydration).
            | "ClusterSpill" >> beam.ParDo(spill(functools.partial(_cluster_group, groups=self._groups)))
            | "ClusterGroup" >> beam.GroupByKey()
            | "Sized" >> beam.FlatMap(_sized)
        )

    def _near_labels(self, spilled) -> list[tuple[str, Any]]:
        """The spilled signatures -> LSH, verification (when on), connected components: the
        component labels of the nodes in near-duplicate clusters, by the step that found them.
        With or without verification, each step is its own DoFn, chosen here."""
        cfg, limits = self._cfg, self._limits
        count = (spilled
                 | "NodeCounts" >> beam.Map(lambda kv: kv[1].records)
                 | "CountNodes" >> beam.CombineGlobally(sum).without_defaults())
        n_nodes = AsSingleton(count, default_value=0)
        band_fn = _BandAndSignatureBlobs if cfg.verify else _BandBlobs
        blobs = (
            spilled
            | "BandBlobs"
            >> beam.ParDo(band_fn(cfg.bands, cfg.rows, limits, self._tmp), n_nodes)
            .with_output_types(tuple[int, Any])
            .with_outputs(_BandBlobs.SIGS, main="bands")
        )
        edges_fn = _VerifiedBucketEdges if cfg.verify else _BucketEdges
        buckets = (
            blobs.bands
            | "Buckets" >> beam.GroupByKey()
            | "BucketEdges"
            >> beam.ParDo(edges_fn(cfg, limits, self._tmp), n_nodes)
            .with_output_types(tuple[Any, Any])
            .with_outputs(_EdgeSink.LABELS, main="edges")
        )
        labels = [("Bucket", buckets.labels)]
        edges = buckets.edges
        if cfg.verify:
            edges = self._verify_joins(blobs.sigs, edges, n_nodes, labels)
        components = edges | "Components" >> ConnectedComponents(cfg.max_rounds, limits)
        labels.append(("Components", components | "LabelForJoin" >> beam.Map(_label_for_join)))
        return labels

    def _verify_joins(self, sigs, edges, n_nodes, labels: list):
        """Join 1 (_AttachSignature) and join 2 (_VerifyEdges), where the signatures meet the
        edges by home: each appends the labels of a group that verified every edge to
        ``labels``; returns the kept edges the components still have to join."""
        cfg, limits = self._cfg, self._limits
        num_perm = cfg.bands * cfg.rows

        def join(edges, group: str, step: str, fn):
            return ((sigs, edges)
                    | f"{group}Flatten" >> beam.Flatten()
                    | f"{group}Group" >> beam.GroupByKey()
                    | step >> beam.ParDo(fn(num_perm, cfg.verify_threshold, limits, self._tmp), n_nodes)
                    .with_output_types(tuple[Any, Any])
                    .with_outputs(_EdgeSink.LABELS, main="edges"))

        attached = join(edges, "SigA", "AttachSignature", _AttachSignature)
        labels.append(("Attach", attached.labels))
        verified = join(attached.edges, "SigB", "Verify", _VerifyEdges)
        labels.append(("Verify", verified.labels))
        return verified.edges

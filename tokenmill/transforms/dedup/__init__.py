"""Exact and near-duplicate removal on small records: one module per step.

text (normalised text, exact hash, shingles) -> minhash (signatures) -> nodes (a document's
node) -> lsh (candidate edges, held as edges: sorted keys + index pairs, and 16-byte handles
between groups) -> verify (Jaccard estimate) -> components (connected components; unionfind
is the one union-find) -> survivor (survivor order, verdicts) -> stats (report figures);
dedup_transform wires them into Beam, limits sizes its groups.

The pure steps import no Beam; the Beam-bound names (components, dedup_transform, stats) load on
first use, and so does ``SPEC``, dedup's entry in the stage list (transforms/stages.py). Other
packages use the names in ``__all__``.
"""

from tokenmill.transforms.dedup.edges import Edges, HandleTable, handles
from tokenmill.transforms.dedup.limits import Limits
from tokenmill.transforms.dedup.lsh import band_blobs, band_hashes, bucket_edges, exact_reps
from tokenmill.transforms.dedup.minhash import MinHasher, exact_jaccard, jaccard_estimate
from tokenmill.transforms.dedup.nodes import Node, Recorder, takes_part
from tokenmill.transforms.dedup.survivor import (
    EXACT,
    NEAR,
    Verdict,
    VerdictBook,
    choose_survivor,
    exact_verdicts,
    node_hash,
    node_id,
    node_key,
    rehydrated,
    sized,
)
from tokenmill.transforms.dedup.text import exact_hash, has_tokens, normalise_exact, shingles, tokens
from tokenmill.transforms.dedup.unionfind import star_forest, union_find_components
from tokenmill.transforms.dedup.verify import (
    attach_signature,
    edge_blobs,
    signature_blobs,
    verify_edges,
    verify_in_group,
    verify_local,
)

__all__ = [
    "EXACT", "NEAR", "ConnectedComponents", "Dedup", "Edges", "HandleTable", "handles", "Limits", "MinHasher", "Node", "NodesFn", "Recorder", "Verdict",
    "VerdictBook", "attach_signature", "band_blobs", "band_hashes", "bucket_edges", "choose_survivor",
    "cluster_stats", "edge_blobs", "exact_hash", "exact_jaccard", "exact_reps", "exact_verdicts", "has_tokens",
    "jaccard_estimate", "node_hash", "node_id", "node_key", "normalise_exact", "rehydrated", "shingles", "signature_blobs", "sized",
    "size_bucket", "star_forest", "takes_part", "tokens", "union_find_components", "verify_edges", "verify_in_group",
    "verify_local",
]

_BEAM = {"ConnectedComponents": "components", "Dedup": "dedup_transform", "NodesFn": "dedup_transform",
         "cluster_stats": "stats", "size_bucket": "stats"}


NODES = "nodes"  # the clean phase's output of dedup nodes (pipelines/phases.StashFn)
# The settings a MinHash signature depends on: with the same ones, refilter reuses those a
# quality.mode=tag run stored.
SIGNATURE_KEYS = ("near", "ngram", "bands", "rows", "seed")


class NodeStash:
    """The clean phase's last step (a ``stage_base.Stash``): a live document's node (Recorder), its
    key on the Locator. A quality.mode=tag run also stores the signature with the document, for
    refilter, which then does not compute it again."""

    tag = NODES

    def __init__(self, cfg, store_signature: bool):
        self._recorder, self._store = Recorder(cfg), store_signature

    def take(self, doc: dict) -> Node | None:
        node = self._recorder(doc)
        if node is not None and self._store:
            doc["minhash"] = node.sig
        return node

    def key(self, node: Node | None) -> bytes | None:
        return node.key if node is not None else None

    def place(self, node: Node | None, doc: dict, loc) -> Node | None:
        return node


def _spec():
    from tokenmill.transforms.stage_base import Stage  # Beam: not for the pure steps

    return Stage("dedup", "dedup", phase="later", report={"dup_cluster": None},
                 stash=lambda cfg, job: NodeStash(cfg, job.quality.mode == "tag"),
                 refilter="rerun", derived=("dup_cluster", "dup_cluster_size", "minhash"),
                 reusable=lambda new, old: ("minhash",) if all(new[k] == old[k] for k in SIGNATURE_KEYS) else ())


def __getattr__(name: str):
    if name == "SPEC":
        spec = globals()["SPEC"] = _spec()
        return spec
    if name in _BEAM:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_BEAM[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

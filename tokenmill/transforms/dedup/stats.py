"""Cluster statistics for the report, from dedup's verdicts (one per member of a cluster)."""

from __future__ import annotations

import apache_beam as beam

from tokenmill.config import DedupConfig
from tokenmill.transforms.dedup.survivor import EXACT, NEAR, Verdict, node_id
from tokenmill.transforms.stage_base import CombineOnce


def size_bucket(n: int) -> str:
    """Histogram bucket of a cluster size: 2, 3-4, 5-8, 9-16, ..."""
    if n <= 2:
        return str(n)
    lo = 1 << ((n - 1).bit_length() - 1)
    return f"{lo + 1}-{lo * 2}"


class _ClusterFn(beam.CombineFn):
    """Per cluster: (size, exact-dropped, near-dropped, the smallest few member ids)."""

    def __init__(self, sample_ids: int):
        self._k = sample_ids

    def create_accumulator(self):
        return (0, 0, 0, [])

    def add_input(self, acc, item):
        ident, reason = item
        n, ex, nr, ids = acc
        ids = sorted(ids + [ident])[: self._k]
        return (
            n + 1,
            ex + (reason == EXACT),
            nr + (reason == NEAR),
            ids,
        )

    def merge_accumulators(self, accs):
        n = ex = nr = 0
        ids: list[str] = []
        for a, b, c, d in accs:
            n, ex, nr = n + a, ex + b, nr + c
            ids = sorted(ids + d)[: self._k]
        return (n, ex, nr, ids)

    def extract_output(self, acc):
        return acc


def _cluster_summary(kv, mode: str):
    """(survivor id, size, exact, near, member ids) of a cluster, keyed by its label (the
    survivor's node key) or, in verdicts without one, by the survivor's id."""
    label, (n, ex, nr, ids) = kv
    return (node_id(label, mode) if isinstance(label, bytes) else label, n, ex, nr, ids)


class _StatsFn(beam.CombineFn):
    """All clusters -> one dict; keeps only counters, a histogram and the top-k clusters."""

    def __init__(self, top_k: int):
        self._k = top_k

    def create_accumulator(self):
        return {"clusters": 0, "members": 0, "exact": 0, "near": 0, "hist": {}, "top": []}

    def _trim(self, top):
        top.sort(key=lambda c: (-c[1], c[0], c[4]))  # two clusters' survivors may share an id
        del top[self._k :]

    def add_input(self, acc, c):
        cid, n, ex, nr, _ids = c
        acc["clusters"] += 1
        acc["members"] += n
        acc["exact"] += ex
        acc["near"] += nr
        b = size_bucket(n)
        acc["hist"][b] = acc["hist"].get(b, 0) + 1
        if self._k:
            acc["top"].append(c)
            if len(acc["top"]) > 2 * self._k:
                self._trim(acc["top"])
        return acc

    def merge_accumulators(self, accs):
        out = self.create_accumulator()
        for a in accs:
            for k in ("clusters", "members", "exact", "near"):
                out[k] += a[k]
            for b, v in a["hist"].items():
                out["hist"][b] = out["hist"].get(b, 0) + v
            out["top"].extend(a["top"])
            self._trim(out["top"])
        return out

    def extract_output(self, acc):
        top = list(acc["top"])
        self._trim(top)
        hist = dict(sorted(acc["hist"].items(), key=lambda kv: int(kv[0].split("-")[0])))
        return {
            "clusters": acc["clusters"],
            "members": acc["members"],
            "removed_exact": acc["exact"],
            "removed_near": acc["near"],
            "size_histogram": hist,
            "largest": [
                {"cluster": cid, "size": n, "exact": ex, "near": nr, "member_ids": ids}
                for cid, n, ex, nr, ids in top
            ],
        }


def cluster_stats(verdicts, cfg: DedupConfig | None = None, *, label: str = "DedupClusterStats"):
    """PCollection[Verdict] -> a one-element PCollection with the cluster statistics.

    ``clusters`` (count of clusters of 2+ docs), ``members`` (docs in them), ``removed_exact`` /
    ``removed_near``, ``size_histogram`` ({"2": n, "3-4": n, "5-8": n, ...}) and ``largest``:
    the config's ``stats_top_clusters`` biggest clusters with their ``stats_member_ids``
    smallest member ids. Per-cluster counts are a lifted combine; the global combine keeps only
    O(top_k) clusters.
    """
    cfg = cfg or DedupConfig()
    mode = cfg.survivor

    def member(v: Verdict):
        # By the cluster's label where the verdict has it: ids are not unique across inputs, and
        # two clusters whose survivors share an id are two clusters.
        return v.label or v.cluster, (node_id(v.key, mode), v.reason)

    return (
        verdicts
        | f"{label}Key" >> beam.Map(member)
        | f"{label}PerCluster" >> beam.CombinePerKey(_ClusterFn(cfg.stats_member_ids))
        | f"{label}Summary" >> beam.Map(_cluster_summary, mode)
        | f"{label}Global" >> CombineOnce(_StatsFn(cfg.stats_top_clusters))
    )

"""Benchmark tokenmill's Beam near-duplicate removal (``tokenmill.transforms.dedup.Dedup``).

Usage::

    python bench/dedup.py                       # license texts + synthetic 100k
    python bench/dedup.py --license             # only the license texts
    python bench/dedup.py --synthetic 20000     # only the synthetic corpus, 20k documents
    python bench/dedup.py --license --set verify=false --set verify_threshold=0.6

(a) License texts (``near_duplicates/license_texts`` of the shared data folder, SOURCES.md
section 4): 392 SPDX and 1,173 ScanCode texts (YAML front matter stripped), through Dedup on
the DirectRunner with the default config. Against the exact word-5-gram Jaccard of
``DERIVED_pairs_exact_jaccard_word5_ge0.3.tsv``:

* recall: of the pairs with exact Jaccard >= 0.85, the fraction where not both documents
  survive (one was removed as a duplicate, of the other or of a third);
* precision: of the removed documents, the fraction whose cluster survivor has exact
  Jaccard >= 0.5 with them (pairs under 0.3 are absent from the file, so they count as misses).

(b) ``--synthetic N``: N documents of 200-400 words drawn from a Zipf vocabulary; 10% of the
base documents get 1-3 copies with small edits (0.5-2% of the words replaced, inserted or
deleted) and 2% an exact copy (case and whitespace changed). The documents are generated inside
the pipeline (no driver-side list), run through Dedup, and the script prints the wall time,
docs/s, peak RSS (this process and its children) and the planted-pair recall, plus how many
documents were removed that were not planted copies (false removals).

The shared data folder is ``$TOKENMILL_SHARED_DATA`` or ``../shared/data`` relative to the repo
root; when it is absent the license benchmark prints a message and is skipped.
"""

from __future__ import annotations

import os
import sys

# Python puts this script's folder first on sys.path, where bench/tokenize.py would shadow the
# standard library's tokenize (imported by logging, linecache, ...): take the folder off.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

from tokenmill.config import DedupConfig, parse_set  # noqa: E402
from tokenmill.transforms.dedup import Dedup, NodesFn, cluster_stats, exact_jaccard, node_id, shingles  # noqa: E402
from tokenmill.transforms.doc import new_doc  # noqa: E402


def shared_data_dir() -> Path:
    env = os.environ.get("TOKENMILL_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def make_config(sets: list[str]) -> DedupConfig:
    data: dict = {}
    for item in sets:
        keys, value = parse_set(item)
        data[keys[-1]] = value
    return DedupConfig.model_validate(data)


def _small_record(doc: dict) -> str:
    keys = ("id", "dup_cluster", "dropped_by", "planted_jaccard")
    return json.dumps({k: doc.get(k) for k in keys})


def run_dedup(make_docs, cfg: DedupConfig, workdir: str) -> tuple[list[dict], dict, float, object]:
    """Run Dedup on the DirectRunner; return (small output records, cluster stats, seconds, metrics)."""
    opts = PipelineOptions(["--runner=DirectRunner"])
    t0 = time.perf_counter()
    p = beam.Pipeline(options=opts)
    docs = make_docs(p)
    verdicts = docs | "Nodes" >> beam.ParDo(NodesFn(cfg)) | Dedup(cfg, tmp=f"{workdir}/spill")
    docs | "Small" >> beam.Map(_small_record) | "WriteOut" >> beam.io.WriteToText(f"{workdir}/out")
    _ = (verdicts
         | "VerdictJson" >> beam.Map(lambda v: json.dumps([node_id(v.key, cfg.survivor), v.cluster, v.reason]))
         | "WriteVerdicts" >> beam.io.WriteToText(f"{workdir}/verdicts"))
    (
        cluster_stats(verdicts, cfg.model_copy(update={"stats_top_clusters": 5}))
        | "StatsJson" >> beam.Map(json.dumps)
        | "WriteStats" >> beam.io.WriteToText(f"{workdir}/stats")
    )
    result = p.run()
    result.wait_until_finish()
    secs = time.perf_counter() - t0

    def lines(name):
        return [json.loads(line) for f in sorted(glob.glob(f"{workdir}/{name}*")) for line in open(f, encoding="utf-8")]

    records = lines("out")
    verdict_of = {i: (c, r) for i, c, r in lines("verdicts")}  # ids are unique in these corpora
    for r in records:
        r["dup_cluster"], r["dropped_by"] = verdict_of.get(r["id"], (None, None))
    stats = json.loads(open(glob.glob(f"{workdir}/stats*")[0], encoding="utf-8").read())
    return records, stats, secs, result.metrics()


def print_counters(metrics) -> None:
    rows = []
    for c in metrics.query()["counters"]:
        if c.key.metric.namespace == "dedup":
            rows.append((c.key.metric.name, c.committed if c.committed is not None else c.attempted))
    agg: dict[str, int] = {}
    for name, v in rows:
        agg[name] = agg.get(name, 0) + (v or 0)
    print("  counters: " + ", ".join(f"{k}={v}" for k, v in sorted(agg.items())))


def peak_rss_mib() -> float:
    # ru_maxrss is KiB on Linux; children covers any worker processes a runner may start.
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 1024


# --------------------------------------------------------------------------- (a) license texts


def strip_front_matter(text: str) -> str:
    if text.startswith("---"):
        end = text.find("\n---", 3)
        if end != -1:
            nl = text.find("\n", end + 4)
            return text[nl + 1 :] if nl != -1 else ""
    return text


def read_tsv(path: Path) -> list[dict[str, str]]:
    # Split on "\n" and tabs only: two license names hold a bare "\r", which csv (and
    # str.splitlines) would take for a line break.
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=False)) for line in lines[1:] if line]


def load_license_docs(root: Path) -> list[dict]:
    docs = []
    for row in read_tsv(root / "docs.tsv"):
        text = (root / row["path"]).read_text(encoding="utf-8", errors="replace")
        if row["source"] == "scancode":
            text = strip_front_matter(text)
        docs.append(new_doc(row["doc_id"], row["source"], text=text))
    return docs


def load_pairs(root: Path) -> dict[frozenset, float]:
    pairs = {}
    for row in read_tsv(root / "DERIVED_pairs_exact_jaccard_word5_ge0.3.tsv"):
        pairs[frozenset((row["doc_a"], row["doc_b"]))] = float(row["jaccard_word5"])
    return pairs


def bench_license(cfg: DedupConfig) -> None:
    root = shared_data_dir() / "near_duplicates" / "license_texts"
    if not (root / "docs.tsv").is_file():
        print(f"license texts: {root} not found, skipped (set TOKENMILL_SHARED_DATA)")
        return
    docs = load_license_docs(root)
    pairs = load_pairs(root)
    with tempfile.TemporaryDirectory() as tmp:
        records, stats, secs, metrics = run_dedup(lambda p: p | beam.Create(docs), cfg, tmp)
    assert len(records) == len(docs), (len(records), len(docs))
    by_id = {r["id"]: r for r in records}
    alive = {i for i, r in by_id.items() if not r["dropped_by"]}
    removed = [r for r in records if r["dropped_by"]]

    high = [p for p, j in pairs.items() if j >= 0.85]
    hit = sum(1 for p in high if not all(i in alive for i in p))
    recall = hit / len(high) if high else 1.0

    good = sum(1 for r in removed if pairs.get(frozenset((r["id"], r["dup_cluster"])), 0.0) >= 0.5)
    precision = good / len(removed) if removed else 1.0
    n_exact = sum(1 for r in removed if r["dropped_by"] == "dedup:exact_duplicate")
    print(f"license texts: {len(docs)} docs in {secs:.1f}s; removed {len(removed)} ({n_exact} exact)")
    print(f"  recall    {recall:.4f}  ({hit}/{len(high)} pairs with exact J >= 0.85 not both kept)")
    print(
        f"  precision {precision:.4f}  ({good}/{len(removed)} removed docs with J >= 0.5 to their survivor)"
    )
    print(f"  clusters {stats['clusters']}, members {stats['members']}, sizes {stats['size_histogram']}")
    print_counters(metrics)


# --------------------------------------------------------------------------- (b) synthetic


class _GenerateShard(beam.DoFn):
    """(shard, count) -> ``count`` documents, deterministic from (seed, shard), made on the worker.

    Base document ids are ``s<shard>-<i>``; a planted copy of one is ``<base id>~<k>``.
    """

    def __init__(self, seed: int):
        self._seed = seed

    def setup(self):
        import numpy as np

        rng = np.random.default_rng(self._seed)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        vocab: set[str] = set()
        while len(vocab) < 50_000:
            vocab.add("".join(rng.choice(letters, int(rng.integers(2, 11)))))
        self._vocab = np.array(sorted(vocab))
        w = 1.0 / np.arange(1, len(self._vocab) + 1) ** 1.05  # Zipf-like word frequencies
        self._cdf = np.cumsum(w / w.sum())

    def _word(self, rng) -> str:
        return str(self._vocab[rng.integers(len(self._vocab))])

    def process(self, item):
        import numpy as np

        shard, count = item
        rng = np.random.default_rng((self._seed, shard))
        made = i = 0
        while made < count:
            idx = np.searchsorted(self._cdf, rng.random(int(rng.integers(200, 401))) * self._cdf[-1])
            words = self._vocab[np.minimum(idx, len(self._vocab) - 1)].tolist()
            base = f"s{shard}-{i}"
            i += 1
            yield new_doc(base, "synthetic", text=" ".join(words))
            made += 1
            r = rng.random()
            if r < 0.10:  # near copies: 0.5-2% of the words replaced, inserted or deleted
                for k in range(int(rng.integers(1, 4))):
                    if made >= count:
                        break
                    w2 = list(words)
                    for _ in range(max(1, int(len(w2) * rng.uniform(0.005, 0.02)))):
                        op, pos = int(rng.integers(0, 3)), int(rng.integers(0, len(w2)))
                        if op == 0:
                            w2[pos] = self._word(rng)
                        elif op == 1:
                            w2.insert(pos, self._word(rng))
                        else:
                            del w2[pos]
                    doc = new_doc(f"{base}~{k}", "synthetic", text=" ".join(w2))
                    # The exact word-5-gram Jaccard to the base (rides along as an extra key).
                    doc["planted_jaccard"] = exact_jaccard(shingles(words, 5), shingles(w2, 5))
                    yield doc
                    made += 1
            elif r < 0.12 and made < count:  # exact copy: case and spacing changed
                doc = new_doc(f"{base}~x", "synthetic", text="  ".join(words).upper())
                doc["planted_jaccard"] = 1.0
                yield doc
                made += 1


def bench_synthetic(n: int, cfg: DedupConfig, seed: int = 7) -> None:
    shards = max(1, min(256, n // 2000))
    per = [(s, n // shards + (1 if s < n % shards else 0)) for s in range(shards)]

    def make_docs(p):
        return p | "Shards" >> beam.Create(per) | "Generate" >> beam.ParDo(_GenerateShard(seed))

    with tempfile.TemporaryDirectory() as tmp:
        records, stats, secs, metrics = run_dedup(make_docs, cfg, tmp)
    rss = peak_rss_mib()
    by_id = {r["id"]: r for r in records}
    planted = [(i.split("~")[0], i) for i in by_id if "~" in i]

    def recall(min_j: float) -> tuple[float, int, int]:
        ps = [(a, b) for a, b in planted if by_id[b]["planted_jaccard"] >= min_j]
        hit = sum(1 for a, b in ps if by_id[a]["dropped_by"] or by_id[b]["dropped_by"])
        return (hit / len(ps) if ps else 1.0), hit, len(ps)

    # A removed document is a false removal when its family (a base and its planted copies)
    # has no other member: it was merged with an unrelated document.
    families: dict[str, int] = {}
    for i in by_id:
        families[i.split("~")[0]] = families.get(i.split("~")[0], 0) + 1
    false_removed = sum(1 for i, r in by_id.items() if r["dropped_by"] and families[i.split("~")[0]] == 1)
    removed = sum(1 for r in records if r["dropped_by"])
    print(
        f"synthetic: {len(records)} docs ({len(planted)} planted copies) in {secs:.1f}s = "
        f"{len(records) / secs:.0f} docs/s, peak RSS {rss:.0f} MiB"
    )
    for min_j in (0.0, 0.8, 0.85):
        r, hit, tot = recall(min_j)
        print(f"  planted-pair recall {r:.4f} ({hit}/{tot} planted pairs with exact J >= {min_j})")
    print(f"  removed {removed}, false removals {false_removed}")
    print(f"  clusters {stats['clusters']}, members {stats['members']}, sizes {stats['size_histogram']}")
    print_counters(metrics)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--license", action="store_true", help="run the license-text benchmark")
    ap.add_argument(
        "--synthetic",
        type=int,
        nargs="?",
        const=100_000,
        default=None,
        metavar="N",
        help="run the synthetic benchmark with N documents (default 100000)",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a DedupConfig override")
    args = ap.parse_args(argv)
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    cfg = make_config(args.set)
    print(f"config: {cfg.model_dump()}")
    run_all = not args.license and args.synthetic is None
    if args.license or run_all:
        bench_license(cfg)
    if args.synthetic is not None or run_all:
        bench_synthetic(args.synthetic or 100_000, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

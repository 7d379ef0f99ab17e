"""Documents and a Dedup runner shared by the dedup tests (pure cores and end to end)."""

from __future__ import annotations

import glob
import json
import random

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from tokenmill.config import DedupConfig
from tokenmill.transforms.dedup import Dedup, Limits, Recorder, Verdict, VerdictBook, cluster_stats
from tokenmill.transforms.doc import new_doc

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _vocab(rng: random.Random, n: int = 3000) -> list[str]:
    return sorted({"".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 9))) for _ in range(n)})


def _text(rng: random.Random, vocab: list[str], n: int) -> list[str]:
    return [rng.choice(vocab) for _ in range(n)]


def _edit(rng: random.Random, vocab: list[str], words: list[str], k: int) -> list[str]:
    w = list(words)
    for _ in range(k):
        w[rng.randrange(len(w))] = rng.choice(vocab)
    return w


def _doc(id: str, text: str, **extra) -> dict:
    d = new_doc(id, "test", text=text)
    d.pop("html")
    d.pop("encoding")
    d.update(extra)
    return d


def run_dedup(
    docs: list[dict], cfg: DedupConfig, tmp_path, name: str = "out", limits: Limits = Limits(), groups: int = 1
) -> tuple[dict[str, dict], dict]:
    """Docs -> their nodes (as the clean phase makes them) -> Dedup + cluster_stats on Beam ->
    the verdicts applied as the finish phase applies them; returns (id -> doc, stats). Ids must
    be unique here."""
    out_dir = tmp_path / name
    recorder = Recorder(cfg)
    nodes = [recorder(d) for d in docs]
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
        verdicts = p | beam.Create([n for n in nodes if n is not None], reshuffle=False) | Dedup(cfg, limits, tmp=str(out_dir / "spill"), groups=groups)
        _ = (verdicts
             | "J" >> beam.Map(lambda v: json.dumps([v.key.hex(), v.cluster, v.reason, v.size]))
             | "W" >> beam.io.WriteToText(str(out_dir / "verdicts")))
        _ = (cluster_stats(verdicts, cfg)
             | "JS" >> beam.Map(json.dumps)
             | "WS" >> beam.io.WriteToText(str(out_dir / "stats")))
    lines = [json.loads(line) for f in sorted(glob.glob(str(out_dir / "verdicts*"))) for line in open(f)]
    book = VerdictBook(Verdict(bytes.fromhex(k), c, r, n) for k, c, r, n in lines)
    rows = [book.apply(dict(d), n.key if n else None) for d, n in zip(docs, nodes)]
    by_id = {r["id"]: r for r in rows}
    assert len(by_id) == len(rows)
    stats = json.loads(open(glob.glob(str(out_dir / "stats*"))[0]).read())
    return by_id, stats


def _kept(r: dict) -> bool:
    return not r["dropped_by"]



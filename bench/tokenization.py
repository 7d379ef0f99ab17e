"""Tokenize-stage throughput vs bare ``encode_batch``, and shard write MB/s.

Documents: sentences of ../shared/data/langid/lingua_testdata (75 languages) packed into
documents of ~30 sentences, or the bundled sample's texts repeated when that folder is absent.
A byte-level BPE of 32k is trained on them first (not timed).

- bare: ``Tokenizer.encode_batch`` over all documents in batches, in this process.
- beam: the same documents as JSONL through tokenmill's reader -> BatchElements ->
  TokenizeBatchFn on the DirectRunner, minus the same pipeline without the tokenize step
  (reading and runner overhead), so the figure is the stage itself; the whole-pipeline
  figure is printed too.
- shard write: ``shard_bytes`` + atomic write of synthetic token rows to a temp folder.

    python bench/tokenization.py [--docs 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import apache_beam as beam
import numpy as np

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))


def load_docs(n: int) -> list[dict]:
    rng = random.Random(0)
    sentences_dir = DATA / "langid" / "lingua_testdata" / "sentences"
    if sentences_dir.exists():
        pools = [p.read_text(encoding="utf-8").splitlines() for p in sorted(sentences_dir.glob("*.txt"))]
        source = "lingua sentences"
    else:
        from tokenmill.cli import sample_dir

        lines = Path(sample_dir(), "docs.jsonl").read_text(encoding="utf-8").splitlines()
        pools = [[json.loads(x)["text"]] for x in lines if x.startswith("{") and '"text"' in x]
        source = "bundled sample"
    docs = []
    for i in range(n):
        pool = pools[i % len(pools)]
        docs.append({"id": f"d{i}", "text": " ".join(rng.choice(pool) for _ in range(30)), "dropped_by": None})
    print(f"{n:,} documents from {source}, {sum(len(d['text']) for d in docs) / 1e6:.1f} M chars")
    return docs


def run_beam(src: str, tok_json: str, with_tokenize: bool, batch: int) -> tuple[float, int]:
    """Read the JSONL with tokenmill's reader, optionally tokenize, count tokens; returns (wall, tokens)."""
    from tokenmill.config import ReadConfig
    from tokenmill.transforms.readers import ReadFn, plan_units, resolve_inputs
    from tokenmill.transforms.tokenization import TokenizeBatchFn

    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "n")
        t0 = time.perf_counter()
        with beam.Pipeline(argv=["--direct_running_mode=in_memory"]) as p:
            pc = (p | beam.Create(resolve_inputs([src])) | beam.FlatMap(plan_units, ReadConfig())
                  | beam.ParDo(ReadFn(ReadConfig())))
            if with_tokenize:
                pc = (pc | beam.BatchElements(min_batch_size=batch, max_batch_size=batch)
                      | beam.ParDo(TokenizeBatchFn(None), tok_json=beam.pvalue.AsSingleton(
                          p | "Tok" >> beam.Create([tok_json]))))
            _ = (pc | beam.Map(lambda d: d.get("n_tokens", 0)) | beam.CombineGlobally(sum)
                 | beam.Map(lambda n: Path(result_path).write_text(str(n))))
        wall = time.perf_counter() - t0
        return wall, int(Path(result_path).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=512)
    args = ap.parse_args()

    from tokenmill.format import shard_bytes, shard_schema
    from tokenmill.transforms.shards import write_atomically
    from tokenmill.transforms.tokenization import encode_texts, tokenizer_info, train_tokenizer

    docs = load_docs(args.docs)
    texts = [d["text"] for d in docs]
    tok = train_tokenizer(texts[:5000], vocab_size=32000)
    tok_json = tok.to_str()
    info = tokenizer_info(tok_json)

    t0 = time.perf_counter()
    n_bare = 0
    for i in range(0, len(texts), args.batch):
        n_bare += sum(len(a) for a in encode_texts(tok, texts[i:i + args.batch], info["eos_id"], np.dtype(np.uint16)))
    bare = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "docs.jsonl")
        with open(src, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({"id": d["id"], "text": d["text"]}, ensure_ascii=False) + "\n" for d in docs)
        base_wall, _ = run_beam(src, tok_json, False, args.batch)
        beam_wall, n_beam = run_beam(src, tok_json, True, args.batch)
    assert n_beam == n_bare, (n_beam, n_bare)
    stage = max(beam_wall - base_wall, 1e-9)
    print(f"bare encode_batch : {n_bare / bare:12,.0f} tokens/s ({bare:.2f} s)")
    print(f"beam tokenize stage: {n_beam / stage:12,.0f} tokens/s ({stage:.2f} s = {beam_wall:.2f} s pipeline "
          f"- {base_wall:.2f} s without the stage); ratio to bare {bare / stage:.2f}")
    print(f"beam whole pipeline: {n_beam / beam_wall:12,.0f} tokens/s; ratio to bare {bare / beam_wall:.2f}")

    rng = np.random.default_rng(0)
    rows = [(f"doc-{i:08d}", rng.integers(0, 32000, size=int(rng.integers(200, 2000)), dtype=np.uint16))
            for i in range(40000)]
    schema = shard_schema(np.dtype(np.uint16), info)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        data = shard_bytes(rows, schema, batch_tokens=1 << 20)
        write_atomically(os.path.join(tmp, "train-00000-of-00001.arrow"), data)
        wall = time.perf_counter() - t0
    print(f"shard write        : {len(data) / 1e6 / wall:12,.0f} MB/s ({len(data) / 1e6:.0f} MB, "
          f"{sum(len(t) for _, t in rows) / 1e6:.1f} M tokens in {wall:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

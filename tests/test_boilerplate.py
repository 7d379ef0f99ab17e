"""Boilerplate lines across documents: the sketch never under-counts and stays near the truth,
the combine's sparse and dense accumulators agree, lines are cut per corpus and per domain, and
a real prepare run cuts a banner shared by many sample documents and reports it."""

import json
import random

import numpy as np
from conftest import run_prepare

from tokenmill.config import BoilerplateConfig
from tokenmill.transforms.boilerplate import SketchFn, line_keys, strip

SAMPLE = __import__("pathlib").Path(__file__).parent.parent / "tokenmill" / "sample"


def _docs(n=300, seed=0):
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        lines = [f"unique line {i} number {j} with words {rng.random()}" for j in range(5)]
        if i % 2 == 0:
            lines.insert(0, "Accept all cookies to continue reading")  # in 150 docs
        if i < 4:
            lines.append("Subscribe to the Harbour Times newsletter")  # in 4 docs of one domain
        docs.append({"text": "\n".join(lines), "url": f"https://{'news.example' if i < 8 else f'site{i}.org'}/p{i}"})
    return docs


def _sketch(docs, bits=12, per_doc=False):
    fn = SketchFn(bits)
    accs = []
    for i in range(0, len(docs), 7):  # bundles of 7 docs, merged as the runner merges them
        acc = fn.create_accumulator()
        for d in docs[i:i + 7]:
            acc = fn.add_input(acc, line_keys(d, 8))
        accs.append(fn.compact(acc))
    return fn.extract_output(fn.merge_accumulators(accs))


def test_sketch_counts_documents_and_never_under_counts():
    docs = _docs()
    sketch = _sketch(docs)
    true: dict[int, int] = {}
    for d in docs:
        for k in line_keys(d, 8).tolist():
            true[k] = true.get(k, 0) + 1
    keys = np.array(list(true), dtype=np.uint64)
    est = sketch.estimate(keys)
    assert (est >= np.array(list(true.values()))).all()
    assert sketch.added == sum(true.values())
    # 4 x 4096 cells for ~3,300 keys: most estimates are exact.
    assert np.mean(est == np.array(list(true.values()))) > 0.9
    small = SketchFn(12)
    dense = small._dense(small.add_input(small.create_accumulator(), keys))
    assert (dense.estimate(keys) >= 1).all()


def test_strip_cuts_corpus_and_domain_boilerplate():
    docs = _docs()
    sketch = _sketch(docs)
    cfg = BoilerplateConfig(enabled=True, min_docs=10, min_docs_domain=3)
    d0 = dict(docs[0])
    lines, chars = strip(d0, sketch, cfg)
    assert lines == 2 and "cookies" not in d0["text"] and "newsletter" not in d0["text"]
    assert d0["text"].startswith("unique line 0 number 0") and chars == len("Accept all cookies to continue reading") + len(
        "Subscribe to the Harbour Times newsletter")
    d9 = dict(docs[9])
    assert strip(d9, sketch, cfg) == (0, 0) and d9["text"] == docs[9]["text"]
    corpus_only = BoilerplateConfig(enabled=True, min_docs=10, min_docs_domain=0)
    d2 = dict(docs[2])
    assert strip(d2, sketch, corpus_only)[0] == 1 and "newsletter" in d2["text"]


def test_prepare_cuts_a_banner_shared_by_many_documents(tmp_path):
    banner = "We use cookies to improve your experience on this site"
    recs = [json.loads(x) for x in (SAMPLE / "docs.jsonl").read_text().splitlines() if x.strip().endswith("}")]
    recs = [r for r in recs if isinstance(r.get("text"), str) and len(r["text"]) > 400]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({**r, "text": r["text"] + "\n" + banner}) + "\n" for r in recs))
    rc, rows, report = run_prepare(tmp_path / "out", [src], ["boilerplate.enabled=true", "boilerplate.min_docs=5"])
    assert rc == 0
    kept = [r for r in rows if r["dropped_by"] is None]
    assert len(kept) >= 5 and not any(banner in r["text"] for r in kept)
    assert all(r["boilerplate_chars"] >= len(banner) for r in kept)
    cut = report["boilerplate_cut"]
    assert cut["docs"] == len(kept) and cut["lines"] >= len(kept)
    _, rows_off, _ = run_prepare(tmp_path / "off", [src])
    assert all(banner in r["text"] for r in rows_off if r["dropped_by"] is None)

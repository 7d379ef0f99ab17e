"""Boilerplate lines across documents: the sketch never under-counts and stays near the truth,
the combine's sparse and dense accumulators agree, lines are cut per corpus and per domain, and
a real prepare run cuts a banner shared by many sample documents and reports it."""

import json
import random

import numpy as np
import pytest
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


def _sketch(docs, bits=14, bundle=7, seed=None):
    fn = SketchFn(bits)
    accs = []
    for i in range(0, len(docs), bundle):  # bundles of docs, merged as the runner merges them
        acc = fn.create_accumulator()
        for d in docs[i:i + bundle]:
            acc = fn.add_input(acc, line_keys(d, 8))
        accs.append(fn.compact(acc))
    if seed is not None:
        random.Random(seed).shuffle(accs)
        while len(accs) > 1:  # a random merge tree
            k = random.Random(seed + len(accs)).randint(2, len(accs))
            accs = [fn.merge_accumulators(accs[:k])] + accs[k:]
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


def test_the_table_does_not_depend_on_bundling_or_merge_order():
    docs = _docs()
    tables = [_sketch(docs, 10, bundle, seed).table for bundle, seed in ((1, 1), (7, None), (50, 2), (300, 3))]
    assert all((t == tables[0]).all() for t in tables[1:])
    fn = SketchFn(10)  # a table small enough that accumulators turn dense part-way
    fn._sparse_max = 100
    acc = fn.create_accumulator()
    for d in docs:
        acc = fn.add_input(acc, line_keys(d, 8))
    assert (fn.extract_output(fn.merge_accumulators([fn.compact(acc)])).table == tables[0]).all()


def test_copies_of_one_page_do_not_make_its_lines_boilerplate():
    page = "A page about ferries that three sites copied\nIts second line, also copied\nAnd a third"
    docs = [{"text": page, "url": f"https://news.example/copy{i}"} for i in range(3)] + _docs(20, 1)
    sketch = _sketch(docs)
    cfg = BoilerplateConfig(enabled=True, min_docs=10, min_docs_domain=3)
    survivor = {**docs[0], "dup_cluster_size": 3}  # dedup found the two copies
    assert strip(survivor, sketch, cfg) == (0, 0) and survivor["text"] == page
    assert strip({**docs[0], "dup_cluster_size": 1}, sketch, cfg)[0] == 3  # without dedup's word, all cut


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


@pytest.mark.slow
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

"""Per-stage cost of Beam: each tokenmill stage as a Beam step vs the bare library in a loop.

The goal (issue): per stage, tokenmill's Beam stage reaches >= 85% of the bare library's
speed on the same documents. For every stage this script times, on the same documents:

- bare: the library (or tokenmill's pure core) called in a plain Python loop:

  ========  ==========================================================================
  extract   ``tokenmill.transforms.extract.extract_html`` (our extractor: lexbor's tree, compiled walk)
  normalize ``ftfy.fix_text(text, fix_character_width=False)``, and the core ``normalize_text``
  language  fastText ``model.predict(one-line prefix, k=1)`` (tokenmill's model loader)
  quality   ``signals`` + ``first_failure``
  pii       ``redact``
  dedup     datasketch ``MinHash`` (tokenmill's num_perm, seed, xxh32, word 5-gram shingles)
            + ``MinHashLSH`` (tokenmill's bands x rows) query + insert per document; and, for
            reference, the stage's whole job in memory (exact groups, verified candidates,
            union-find, verdicts) with datasketch doing MinHash and LSH
  tokenize  ``Tokenizer.encode_batch_fast`` (what the stage calls) in batches of ``tokenize.batch_size``
  ========  ==========================================================================

- Beam (loaded as ``prepare`` loads it: pipelines/beamload.py): pipeline A = ``read docs | stage | Count.Globally()`` and pipeline B = the same
  without the stage (the docs come from a pickle file, not ``Create``: see ``run_beam``), both
  on the in-process FnApiRunner with one worker (``--runner=FnApiRunner
  --direct_running_mode=in_memory --direct_num_workers=1``), so the bare loop and Beam each
  use one core. A - B is what the stage adds inside Beam: its own work, Beam's per-element
  cost, its fixed cost per pipeline, and for dedup its shuffles.

Reported per stage: docs/s bare, docs/s in Beam (n / (A - B)), ratio = bare / (A - B) against
the 85% goal, the overhead per document in microseconds, ((A - B) - bare) / n, and A - B on
8 documents (the fixed cost per pipeline, which a real corpus amortises) with the ratio left
once it is taken out.

Clock: process CPU time by default (``--clock wall`` for wall time; the table shows the other
clock's ratio too). The machine may be shared, and Beam's wall time holds idle waits: every
bundle ends by joining Beam's state-sampler thread, which sleeps up to 200 ms between
samples, i.e. about 0-20% of a bundle of a second or less, which is what the stages here are.

Documents: ``--pages`` Rust documentation pages from the local toolchain, chosen as
bench/scaling.py does, plus the shared real news pages
(``../shared/data/html_extraction/scrapinghub_aeb``) unless ``--no-shared``. Each stage gets
realistic input: the preceding pure cores are run once, untimed (extract -> normalize ->
language -> quality -> pii). Rust docs are mostly dropped by the quality filters, so pii, dedup
and tokenize get every document as live input (drop marks cleared).

Each measurement is repeated (``--repeat``), bare and Beam runs interleaved: a round times the
bare loop, then A, B and their runs on a few documents, one after the other. This machine's speed
drifts by a third within minutes, more than the gaps measured, so the ratios are taken within each
round and the table shows their median and spread (and, for reference, the ratio of the best
figures, which may come from rounds minutes apart).

A corpus this size takes dedup's one-partition shortcut (LSH, verification and labels in one
group); ``--dedup-groups K`` sizes its partitions so that the same documents take a big job's
path instead (K LSH partitions, K verification groups, the components rounds).

    python bench/stages.py [--pages 2000] [--repeat 3] [--stages extract,pii] [--no-shared]
                           [--clock cpu|wall] [--dedup-groups K]
"""

from __future__ import annotations

import argparse
import gc
import gzip
import logging
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Not a parallel benchmark: encode_batch_fast would otherwise spread over every core, while the
# comparison is one core (bare loop) vs one Beam worker. Set before tokenizers is imported.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/scaling.py: the Rust doc pages
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))

from tokenmill.pipelines.beamload import import_lean  # noqa: E402

# Beam as prepare loads it, in the launcher and every worker: its state sampler at 20 ms, graph
# introspection cached (bench/MEASUREMENTS.md), so that the stage's cost is what a job pays.
beam = import_lean("apache_beam")
import scaling  # noqa: E402
from apache_beam.metrics import Metrics  # noqa: E402
from apache_beam.metrics.metric import MetricsFilter  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

from tokenmill.config import JobConfig  # noqa: E402
from tokenmill.transforms import tokenization as tokmod  # noqa: E402
from tokenmill.transforms.dedup import (  # noqa: E402
    Dedup,
    Limits,
    NodesFn,
    exact_hash,
    has_tokens,
    node_id,
    node_key,
    shingles,
    tokens,
    union_find_components,
)
from tokenmill.transforms.doc import new_doc  # noqa: E402
from tokenmill.transforms.extract import ExtractFn, extract_html  # noqa: E402
from tokenmill.transforms.langid import LanguageFn, load_model, model_text, predict, resolve_model_path  # noqa: E402
from tokenmill.transforms.normalize import NormalizeFn, normalize_text  # noqa: E402
from tokenmill.transforms.pii import PiiFn, redact  # noqa: E402
from tokenmill.transforms.quality import QualityFn, first_failure, quality_score, signals  # noqa: E402

GOAL = 0.85
BEAM_ARGS = ["--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"]
STAGES = ["extract", "normalize", "language", "quality", "pii", "dedup", "tokenize"]


# ---------------------------------------------------------------- documents


def load_pages(n_rust: int, shared: bool) -> list[tuple[str, bytes]]:
    """(url, raw HTML bytes) of the chosen pages, read once into memory (reading is not timed)."""
    pages = []
    if n_rust:
        for p in scaling.pick_spread(scaling.rust_doc_pages(), n_rust):
            pages.append((p.as_uri(), p.read_bytes()))
    aeb = SHARED / "html_extraction" / "scrapinghub_aeb" / "html"
    if shared and aeb.is_dir():
        for p in sorted(aeb.glob("*.html.gz")):
            pages.append((p.as_uri(), gzip.decompress(p.read_bytes())))
    return pages


@dataclass
class Inputs:
    """What each stage receives, built by running the preceding pure cores once, untimed."""

    html: list[dict]  # extract: raw pages
    extracted: list[dict]  # normalize: pages with main text
    normalized: list[dict]  # language
    labelled: list[dict]  # quality: normalized text with lang / lang_score
    live: list[dict]  # pii: every quality-scored doc, drop marks cleared
    redacted: list[dict]  # dedup, tokenize: pii output


def build_inputs(pages: list[tuple[str, bytes]], cfg: JobConfig, model) -> Inputs:
    ex, nz, lg, qu = cfg.extract, cfg.normalize, cfg.language, cfg.quality
    html = [new_doc(f"p{i:06d}", "bench", url=url, html=raw) for i, (url, raw) in enumerate(pages)]
    extracted = []
    for d in html:
        res = extract_html(d["html"], url=d["url"], max_bytes=ex.max_html_bytes, timeout_s=ex.timeout_s,
                           include_title=ex.include_title)
        if res.text:  # a page the extractor drops never reaches the next stage as live input
            extracted.append(dict(d, html=None, text=res.text))
    normalized = [dict(d, text=t) for d in extracted if (t := normalize_text(d["text"], nz))]
    labelled = []
    for d in normalized:
        lang, score = predict(model, d["text"], lg.max_chars)
        labelled.append(dict(d, lang=lang, lang_score=score))
    live = []
    for d in labelled:
        s = signals(d["text"], d["lang"], qu)
        live.append({**d, **s, "quality_score": quality_score(s, d["lang_score"])})
    redacted = [dict(d, text=redact(d["text"], cfg.pii.kinds)[0]) for d in live]
    return Inputs(html, extracted, normalized, labelled, live, redacted)


# ---------------------------------------------------------------- bare loops


def bare_extract(docs, cfg: JobConfig) -> None:
    ex = cfg.extract
    for d in docs:
        extract_html(d["html"], encoding_hint=d["encoding"], url=d["url"], max_bytes=ex.max_html_bytes,
                     timeout_s=ex.timeout_s, include_title=ex.include_title)


def bare_ftfy(texts) -> None:
    import ftfy

    for t in texts:
        ftfy.fix_text(t, fix_character_width=False)


def bare_normalize(texts, cfg: JobConfig) -> None:
    for t in texts:
        normalize_text(t, cfg.normalize)


def bare_language(texts, model, max_chars: int) -> None:
    # fastText predicts on one line: the prefix and its newlines replaced are part of the
    # library call's input, so they are done here too (what any caller has to do).
    for t in texts:
        model.predict(model_text(t, max_chars), k=1)


def bare_quality(docs, cfg: JobConfig) -> None:
    for d in docs:
        first_failure(signals(d["text"], d["lang"], cfg.quality), d["lang"], cfg.quality)


def bare_pii(texts, cfg: JobConfig) -> None:
    kinds = cfg.pii.kinds
    for t in texts:
        redact(t, kinds)


def dedup_hasher(cfg: JobConfig):
    """datasketch's MinHash set up as tokenmill's (num_perm, seed, xxh32), permutations drawn
    once: building them per document costs more than hashing a short one."""
    import xxhash
    from datasketch import MinHash

    num_perm = cfg.dedup.bands * cfg.dedup.rows
    proto = MinHash(num_perm=num_perm, seed=cfg.dedup.seed, hashfunc=xxhash.xxh32_intdigest)

    def minhash(text: str):
        sh = shingles(tokens(text), cfg.dedup.ngram)
        if not sh:
            return None  # tokenmill gives an empty text no signature either
        m = MinHash(num_perm=num_perm, seed=cfg.dedup.seed, hashfunc=xxhash.xxh32_intdigest,
                    permutations=proto.permutations, scheme=proto.scheme)
        m.update_batch([s.encode("utf-8", "surrogatepass") for s in sh])
        return m

    return minhash


def check_same_signatures(docs, cfg: JobConfig) -> None:
    """The bare MinHash must be tokenmill's (same shingles, hash, permutations), or the
    dedup figures compare different work."""
    import numpy as np

    from tokenmill.transforms.dedup import MinHasher

    minhash, ours = dedup_hasher(cfg), MinHasher(cfg.dedup.bands * cfg.dedup.rows, cfg.dedup.seed)
    for d in docs[:50]:
        m = minhash(d["text"])
        bare = None if m is None else np.asarray(m.hashvalues, dtype="<u4").tobytes()
        if bare != ours.text_signature(d["text"], cfg.dedup.ngram):
            raise SystemExit(f"stages: bare MinHash differs from tokenmill's on {d['id']}")


def bare_dedup(docs, cfg: JobConfig) -> None:
    from datasketch import MinHashLSH

    minhash = dedup_hasher(cfg)
    lsh = MinHashLSH(num_perm=cfg.dedup.bands * cfg.dedup.rows, params=(cfg.dedup.bands, cfg.dedup.rows))
    for d in docs:
        m = minhash(d["text"])
        if m is not None:
            lsh.query(m)
            lsh.insert(d["id"], m)


def bare_dedup_job(docs, cfg: JobConfig) -> None:
    """The stage's whole job in memory, with datasketch doing the MinHash and the LSH: exact groups
    and their survivor keys, candidates verified by the Jaccard estimate, components by
    union-find, one verdict per document. (The stage turns a bucket of more than
    ``bucket_all_pairs_max`` nodes into a star; MinHashLSH.query lists them all.)"""
    from datasketch import MinHashLSH

    dc = cfg.dedup
    minhash = dedup_hasher(cfg)
    lsh = MinHashLSH(num_perm=dc.bands * dc.rows, params=(dc.bands, dc.rows))
    groups: dict[bytes, list] = {}
    for d in docs:
        if (d.get("text") or "").strip():
            h = exact_hash(d["text"])
            groups.setdefault(h, []).append((node_key(d, h, dc.survivor, dc.quality_field), d))
    sigs, edges = {}, []
    for members in groups.values():
        rep, doc = min(members, key=lambda kd: kd[0])
        m = minhash(doc["text"])
        if m is None:
            continue
        edges += [(rep, other) for other in lsh.query(m) if m.jaccard(sigs[other]) >= dc.verify_threshold]
        lsh.insert(rep, m)
        sigs[rep] = m
    labels = union_find_components(edges)
    for members in groups.values():
        rep = min(k for k, _ in members)
        label = labels.get(rep)
        if label is None and len(members) == 1:
            continue
        cluster = node_id(label or rep, dc.survivor)
        for k, d in members:
            d = dict(d, dup_cluster=cluster)
            if k != rep:
                d["dropped_by"] = "dedup:exact_duplicate"
            elif label not in (None, rep):
                d["dropped_by"] = "dedup:near_duplicate"


def force_dedup_groups(docs: list[dict], cfg: JobConfig, k: int) -> Limits:
    """Limits that make ``docs`` take dedup's big-job path: K LSH partitions and K verification
    groups instead of the one-partition shortcut a corpus this small takes."""
    nodes = sum(has_tokens(d.get("text")) for d in docs)  # those with a signature
    limits = Limits(partition_records=-(-nodes * cfg.dedup.bands // k), join_nodes=-(-nodes // k))
    got = limits.lsh_partitions(nodes, cfg.dedup.bands), limits.join_partitions(nodes)
    print(f"stages: dedup forced to {got[0]} LSH partitions and {got[1]} verification groups")
    return limits


class EncodeFn(beam.DoFn):
    """Batches of docs -> tokenized, as prepare's Finish step encodes them."""

    def __init__(self, eos_token):
        self._eos, self._encoder = eos_token, None

    def process(self, batch, tok_json):
        if self._encoder is None:
            self._encoder = tokmod.Encoder(tok_json, self._eos)
        self._encoder.encode(batch)
        yield from batch


def bare_tokenize(texts, tok, batch_size: int) -> None:
    for i in range(0, len(texts), batch_size):
        tok.encode_batch_fast(texts[i:i + batch_size], add_special_tokens=False)


# ---------------------------------------------------------------- timing

CLOCKS = ("cpu", "wall")
# A - B on this many documents is the stage's fixed cost per pipeline (building and pickling
# the graph, bundle processors, DoFn.setup: model loading, the tokenizer side input, dedup's
# shuffle stages), which does not grow with the corpus.
FIXED_DOCS = 8


def now() -> dict[str, float]:
    return {"cpu": time.process_time(), "wall": time.perf_counter()}


def since(t0: dict[str, float]) -> dict[str, float]:
    t1 = now()
    return {c: t1[c] - t0[c] for c in CLOCKS}


def timed(fn: Callable[[], None]) -> dict[str, float]:
    gc.collect()  # garbage of the previous run is not this run's cost
    t0 = now()
    fn()
    return since(t0)


def _count(n: int) -> None:
    # Read back after the run: a sanity check that every document went through.
    Metrics.counter("bench", "out").inc(n)


def _read_docs(path: str):
    with open(path, "rb") as fh:
        yield from pickle.load(fh)


def run_beam(docs_path: str, stage: Callable | None) -> tuple[dict[str, float], int]:
    """Seconds of source [| stage] | Count, construction included (it is the same for A and
    B), and the number of elements that reached the sink.

    The source reads the documents from a pickle file rather than ``beam.Create(docs)``:
    Create pickles its elements into the pipeline, where Beam compresses every pickled DoFn
    with bz2 level 9 and decompresses it per bundle processor (40 MB of HTML: ~10 s in both A
    and B, mostly noise around a 2 s difference). The reading DoFn is fused with the stage, as
    the reader is in ``tokenmill prepare``, and every run gets fresh dicts (stages mutate them).
    """
    gc.collect()
    t0 = now()
    p = beam.Pipeline(options=PipelineOptions(BEAM_ARGS))
    pc = p | "Path" >> beam.Create([docs_path]) | "Docs" >> beam.FlatMap(_read_docs)
    if stage is not None:
        pc = stage(p, pc)
    _ = pc | "Count" >> beam.combiners.Count.Globally() | "Out" >> beam.Map(_count)
    result = p.run()
    result.wait_until_finish()
    took = since(t0)
    got = result.metrics().query(MetricsFilter().with_namespace("bench").with_name("out"))["counters"]
    return took, sum(c.committed or c.attempted or 0 for c in got)


@dataclass
class Case:
    stage: str
    docs: list[dict]  # Beam input; the bare loops see the same documents
    beam_stage: Callable  # (pipeline, pcoll) -> pcoll
    bares: list[tuple[str, Callable[[], None]]]  # (what the bare figure is, the loop)
    # False where the stage does not give one element per document (dedup gives a verdict per
    # member of a cluster): its sink count is not checked, only the source-only run's.
    one_out_per_doc: bool = True
    # Each round's own figures ({"bare:<label>", "a", "b", "a_fixed", "b_fixed"} -> seconds per
    # clock; A and B on all docs and on FIXED_DOCS docs): the ratios are taken within a round,
    # minutes apart at most, then their median.
    rounds: list[dict[str, dict[str, float]]] = field(default_factory=list)

    def best(self, key: str) -> dict[str, float]:
        """The best seconds of ``key`` over the rounds, per clock."""
        return {c: min(r[key][c] for r in self.rounds) for c in CLOCKS}

    def round_ratios(self, label: str, clock: str, per_doc: bool = False) -> list[float]:
        out = []
        for r in self.rounds:
            stage = r["a"][clock] - r["b"][clock]
            if per_doc:
                stage -= r["a_fixed"][clock] - r["b_fixed"][clock]
            out.append(r[f"bare:{label}"][clock] / stage if stage > 0 else float("nan"))
        return out


def make_cases(inp: Inputs, cfg: JobConfig, model, tok, tok_json: str, wanted: list[str],
               limits: Limits = Limits(), tmp: str = "") -> list[Case]:
    texts = lambda docs: [d["text"] for d in docs]  # noqa: E731 - the bare loops take texts
    bs = cfg.tokenize.batch_size
    cases = {
        "extract": Case("extract", inp.html, lambda p, pc: pc | beam.ParDo(ExtractFn(cfg.extract)),
                        [("extract_html", lambda: bare_extract(inp.html, cfg))]),
        "normalize": Case("normalize", inp.extracted, lambda p, pc: pc | beam.ParDo(NormalizeFn(cfg.normalize)),
                          [("ftfy.fix_text", lambda: bare_ftfy(texts(inp.extracted))),
                           ("normalize_text", lambda: bare_normalize(texts(inp.extracted), cfg))]),
        "language": Case("language", inp.normalized, lambda p, pc: pc | beam.ParDo(LanguageFn(cfg.language)),
                         [("fastText predict", lambda: bare_language(texts(inp.normalized), model,
                                                                     cfg.language.max_chars))]),
        "quality": Case("quality", inp.labelled, lambda p, pc: pc | beam.ParDo(QualityFn(cfg.quality)),
                        [("signals+first_failure", lambda: bare_quality(inp.labelled, cfg))]),
        "pii": Case("pii", inp.live, lambda p, pc: pc | beam.ParDo(PiiFn(cfg.pii)),
                    [("redact", lambda: bare_pii(texts(inp.live), cfg))]),
        "dedup": Case("dedup", inp.redacted, lambda p, pc: pc | beam.ParDo(NodesFn(cfg.dedup))
                      | Dedup(cfg.dedup, limits, tmp=os.path.join(tmp or tempfile.gettempdir(), "spill")),
                      [("datasketch MinHash+LSH", lambda: bare_dedup(inp.redacted, cfg)),
                       ("same job, in memory", lambda: bare_dedup_job(inp.redacted, cfg))],
                      one_out_per_doc=False),
        "tokenize": Case(
            "tokenize", inp.redacted,
            # As prepare's Finish step encodes: batches, the tokenizer JSON as a side input.
            lambda p, pc: (pc
                           | beam.BatchElements(min_batch_size=bs, max_batch_size=bs)
                           | beam.ParDo(EncodeFn(cfg.tokenize.eos_token),
                                        tok_json=beam.pvalue.AsSingleton(p | "TokJson" >> beam.Create([tok_json])))),
            [("encode_batch_fast", lambda: bare_tokenize(texts(inp.redacted), tok, bs))]),
    }
    return [cases[s] for s in wanted]


def write_docs(docs: list[dict], path: str) -> str:
    with open(path, "wb") as fh:
        pickle.dump(docs, fh, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def measure(case: Case, repeat: int, tmp: str) -> None:
    """Best of ``repeat`` for each figure, bare and Beam runs interleaved (and A/B order
    alternated) so a burst of load on the shared machine hits no single figure every time."""
    n = len(case.docs)
    full = write_docs(case.docs, os.path.join(tmp, f"{case.stage}.pickle"))
    small = write_docs(case.docs[:FIXED_DOCS], os.path.join(tmp, f"{case.stage}-fixed.pickle"))
    runs = [("a", full, case.beam_stage, n), ("b", full, None, n),
            ("a_fixed", small, case.beam_stage, min(n, FIXED_DOCS)), ("b_fixed", small, None, min(n, FIXED_DOCS))]
    for r in range(repeat):
        this = {f"bare:{label}": timed(fn) for label, fn in case.bares}
        for key, path, stage, expected in runs if r % 2 == 0 else runs[::-1]:
            this[key], got = run_beam(path, stage)
            if got != expected and (stage is None or case.one_out_per_doc):
                raise SystemExit(f"stages: {case.stage}: {got} documents reached the sink, expected {expected}")
        case.rounds.append(this)


def ratio_of(bare: float, stage: float) -> str:
    return f"{bare / stage:.0%}" if stage > 0 else "-"  # <= 0: noise larger than the stage


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]  # a round whose stage was within the noise (nan) is left out
    return statistics.median(xs) if xs else float("nan")


def pct(x: float) -> str:
    return "-" if x != x else f"{x:.0%}"


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=2000, help="Rust doc pages (0: none)")
    ap.add_argument("--no-shared", action="store_true", help="leave out the shared news pages (scrapinghub_aeb)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--clock", choices=CLOCKS, default="cpu",
                    help="cpu (process CPU time, default) or wall; the table shows the other's ratio too")
    ap.add_argument("--vocab-size", type=int, default=4096, help="of the byte-level BPE trained for tokenize")
    ap.add_argument("--dedup-groups", type=int, default=0, metavar="K",
                    help="size dedup's LSH partitions and verification groups so that these documents "
                         "make K of each: a big job's path (joins, components rounds) on this corpus")
    args = ap.parse_args()
    wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(STAGES))
    if unknown:
        ap.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    logging.getLogger().setLevel(logging.ERROR)  # Beam's per-run INFO/WARNING lines would bury the table

    pages = load_pages(args.pages, not args.no_shared)
    if not pages:
        print("stages: no Rust toolchain docs (~/.rustup/toolchains/*/share/doc/rust/html) and no shared "
              f"pages ({SHARED}/html_extraction/scrapinghub_aeb); skipped")
        return 0

    cfg = JobConfig()
    model = load_model(resolve_model_path(cfg.language))
    t0 = time.perf_counter()
    inp = build_inputs(pages, cfg, model)
    # A small byte-level BPE stands in for the user's tokenizer; its training is not timed.
    check_same_signatures(inp.redacted, cfg)
    texts = [d["text"] for d in inp.redacted]
    tok = tokmod.train_tokenizer(texts, args.vocab_size, "bpe")
    tok_json = tok.to_str()
    kept = sum(first_failure(d, d["lang"], cfg.quality) is None for d in inp.live)
    print(f"stages: {len(pages):,} pages ({sum(len(r) for _, r in pages) / 1e6:.1f} MB HTML): "
          f"{len(inp.extracted):,} with text, {len(inp.normalized):,} normalized, {kept:,} pass quality "
          f"(pii/dedup/tokenize get all {len(inp.live):,}, {sum(map(len, texts)) / 1e6:.1f} M chars); "
          f"inputs + BPE {args.vocab_size} in {time.perf_counter() - t0:.0f} s")
    print(f"stages: Beam {beam.__version__} {' '.join(BEAM_ARGS)}; best of {args.repeat}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs at start")

    limits = force_dedup_groups(inp.redacted, cfg, args.dedup_groups) if args.dedup_groups else Limits()
    tmp = tempfile.TemporaryDirectory(prefix="tokenmill-stages-")
    cases = make_cases(inp, cfg, model, tok, tok_json, wanted, limits, tmp.name)
    for case in cases:
        t0 = time.perf_counter()
        measure(case, args.repeat, tmp.name)
        c = args.clock
        a, b, a_fixed, b_fixed = (case.best(k)[c] for k in ("a", "b", "a_fixed", "b_fixed"))
        bares = " / ".join(f"{case.best('bare:' + label)[c]:.2f}" for label, _ in case.bares)
        print(f"  {case.stage}: {len(case.docs):,} docs, bare {bares} s, Beam A {a:.2f} s, "
              f"B {b:.2f} s; on {FIXED_DOCS} docs A {a_fixed:.2f} s, B {b_fixed:.2f} s "
              f"({args.clock} time; {time.perf_counter() - t0:.0f} s wall)", flush=True)
    tmp.cleanup()

    c, other = args.clock, next(x for x in CLOCKS if x != args.clock)
    print(f"\n{c} time; ratio = bare / (A - B) within each round, the median of the rounds (best = best bare / "
          f"(best A - best B)), goal >= {GOAL:.0%}; overhead = ((A - B) - bare) / docs, best of each; fixed = A - B "
          f"on {FIXED_DOCS} docs; per-doc ratio = bare / (A - B - fixed), median of rounds")
    print(f"{'stage':<10} {'bare':<23} {'docs':>5} {'bare s':>6} {'A-B s':>6} {'bare doc/s':>10} {'Beam doc/s':>10} "
          f"{'ratio':>5} {'rounds':<17} {'best':>5} {'goal':<6} {'overhead us/doc':>15} {'fixed ms':>8} "
          f"{'per-doc ratio':>13} {other + ' ratio':>10}")
    for case in cases:
        n = len(case.docs)
        stage_s = case.best("a")[c] - case.best("b")[c]
        fixed = case.best("a_fixed")[c] - case.best("b_fixed")[c]
        for label, _ in case.bares:
            bare = case.best(f"bare:{label}")
            rounds = case.round_ratios(label, c)
            ratio = median(rounds)
            spread = f"{pct(min(rounds))}-{pct(max(rounds))}" if all(x == x for x in rounds) else "some in the noise"
            print(f"{case.stage:<10} {label:<23} {n:>5} {bare[c]:>6.2f} {stage_s:>6.2f} {n / bare[c]:>10.0f} "
                  f"{n / stage_s if stage_s > 0 else float('nan'):>10.0f} {pct(ratio):>5} {spread:<17} "
                  f"{ratio_of(bare[c], stage_s):>5} {'ok' if ratio >= GOAL else 'MISSED':<6} "
                  f"{(stage_s - bare[c]) / n * 1e6:>15.1f} {fixed * 1e3:>8.0f} "
                  f"{pct(median(case.round_ratios(label, c, per_doc=True))):>13} "
                  f"{pct(median(case.round_ratios(label, other))):>10}")
    print("\nA = read docs | stage | Count.Globally(), B = read docs | Count.Globally(), one in-process worker.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

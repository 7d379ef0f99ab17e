"""tokenmill vs datatrove on the same corpus: wall time, docs/s and peak memory, side by side.

What it measures. For each size N (default 5000 and 20000 pages) the same staged corpus of real
HTML pages (the Rust documentation shipped with the local toolchain, chosen and staged exactly
as bench/scaling.py does) goes through two pipelines, one after the other, each in a fresh
process tree with 2 workers:

(a) tokenmill: ``tokenmill prepare --input DIR --output OUT --set tokenize.tokenizer=TOK.json``
    with no runner flags (tokenmill's default: every core for an input this size) and the default job config
    otherwise (read, extract, normalize, language ID, Gopher/repetition/C4/FineWeb quality, PII,
    exact + MinHash dedup, tokenize, Arrow shards, report).
(b) datatrove 0.10.x, FineWeb-style, run by ``LocalPipelineExecutor`` (tasks=2, workers=2) in
    its own virtualenv: read the HTML files -> Trafilatura -> LanguageFilter (fastText lid.176)
    -> GopherRepetitionFilter -> GopherQualityFilter -> C4QualityFilter -> FineWebQualityFilter
    -> JsonlWriter + MinhashDedupSignature (14 buckets x 8 hashes); MinhashDedupBuckets;
    MinhashDedupCluster; JsonlReader -> MinhashDedupFilter -> DocumentTokenizer.

Both tokenize with the same tokenizer.json (TOK.json, a byte-level BPE, target 32k tokens, that
``tokenmill tokenizer train`` builds once per invocation from a spread sample of the pages, not
timed) and both append the same EOS token. The language stage mirrors tokenmill's default
(``language.keep=[]``: label every document, drop none); ``--keep-lang en`` makes both drop
what is not English at score 0.65.

Figures per run: wall seconds (process start to exit: imports and runner start-up count),
docs/s = input pages / wall, peak tree RSS (bench/scaling.py's TreeSampler: the summed RSS of
the process and all its descendants, sampled from /proc), documents kept and tokens written.
Then the ratio tokenmill docs/s / datatrove docs/s (goal >= 2x) and datatrove's own per-stage
and per-step timings (a step's seconds are summed over its tasks; MinhashDedupSignature times
its whole input loop, so its figure includes every step before it).

datatrove is installed on first use into ``<repo>/.bench-venv/datatrove`` (gitignored; PyPI by
package name) with the few packages its steps import but its "processing" extra lacks
(EXTRA_PACKAGES), and reused after. Every step runs with datatrove's defaults (Trafilatura
included: favour_precision, a 1 s per-page timeout in a sandbox process) except one forced by
the machine being offline: the language model is the lid.176.ftz that tokenmill ships (in
tokenmill/models/), where datatrove would download lid.176.bin. Without Rust docs the bench says so and
exits 0.

    python bench/compare_datatrove.py [--sizes 5000,20000] [--keep-lang en] [--keep]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling  # noqa: E402  (bench/scaling.py: corpus selection, staging, tree RSS sampling)

REPO = Path(__file__).resolve().parent.parent
DATATROVE_SPEC = "datatrove[processing]==0.10.1"
# JsonlWriter/JsonlReader import orjson, which only datatrove's heavy "io" extra (datasets,
# pyarrow, ...) would bring; datatrove 0.10's English word tokenizer (Gopher, C4, FineWeb
# filters, MinHash shingles) is spacy.blank("en"), which only its "multilingual" extra brings;
# trafilatura 1.x imports lxml.html.clean, a separate package since lxml 5.2.
EXTRA_PACKAGES = ["orjson", "spacy", "lxml_html_clean"]
WORKERS = 2


# -- the datatrove side ---------------------------------------------------------------------------

def ensure_datatrove(venv: Path) -> tuple[Path, str]:
    """The venv's python and its datatrove version; creates the venv on first use."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import datatrove, fasttext, orjson, spacy, lxml_html_clean; "
                            "from importlib.metadata import version; print(version('datatrove'))"]
    ok = py.exists() and subprocess.run(probe, capture_output=True, text=True).returncode == 0
    if not ok:
        print(f"compare: installing {DATATROVE_SPEC} into {venv} (first run only)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        # datatrove[processing] pulls fasttext-numpy2-wheel (the old `fasttext` breaks under
        # NumPy 2) and no torch; pip's own output goes to a log, only failures are shown.
        log = venv / "pip-install.log"
        with open(log, "w") as fh:
            r = subprocess.run([str(py), "-m", "pip", "install", DATATROVE_SPEC, *EXTRA_PACKAGES],
                               stdout=fh, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            sys.exit(f"compare: pip install failed, see {log}")
    version = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    return py, version


def lid_model_path() -> str:
    """The lid.176.ftz tokenmill ships (tokenmill/models/), so both sides label with one model."""
    from tokenmill.transforms.langid import default_model_path

    return default_model_path()


# The datatrove pipeline, written to a file and run by the datatrove venv's python. It writes a
# JSON summary (per-stage wall time, per-step stats, tokens) to --summary; logs go to stderr.
DT_PIPELINE = r'''
import argparse, glob, json, os, sys, time

from datatrove.data import Document
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup import (MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter,
                                      MinhashDedupSignature)
from datatrove.pipeline.dedup.minhash import MinhashConfig
from datatrove.pipeline.extractors import Trafilatura
from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                        GopherRepetitionFilter, LanguageFilter)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
from datatrove.pipeline.writers import JsonlWriter
from datatrove.utils.hashing import HashConfig
from datatrove.utils.lid import FT176LID


class HtmlFilesReader(PipelineStep):
    """Every file of a flat folder as one Document; rank r of W reads sorted names[r::W]."""
    name = "HTML files"
    type = "READER"

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def run(self, data=None, rank=0, world_size=1):
        for name in sorted(os.listdir(self.folder))[rank::world_size]:
            with self.track_time():
                with open(os.path.join(self.folder, name), "rb") as fh:
                    html = fh.read().decode("utf-8", errors="replace")
            self.stat_update("documents")
            yield Document(text=html, id=name)


class LocalFT176LID(FT176LID):
    """datatrove's fastText lid.176, loaded from a local file instead of downloaded."""

    def __init__(self, path, languages):
        super().__init__(languages)
        self.path = path

    @property
    def model(self):
        if self._model is None:
            from fasttext.FastText import _FastText
            self._model = _FastText(self.path)
        return self._model


class LocalLanguageFilter(LanguageFilter):
    def __init__(self, model_path, **kw):
        super().__init__(**kw)
        self.model = LocalFT176LID(model_path, self.languages)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--eos", required=True)
    ap.add_argument("--lid-model", required=True)
    ap.add_argument("--keep-lang", default="")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--summary", required=True)
    a = ap.parse_args()
    w, tasks = a.work, a.workers
    langs = [c for c in a.keep_lang.split(",") if c] or None
    minhash = MinhashConfig(num_buckets=14, hashes_per_bucket=8, hash_config=HashConfig(precision=64))

    stages = [
        ("1 extract+filter+signatures", LocalPipelineExecutor(pipeline=[
            HtmlFilesReader(a.input),
            Trafilatura(favour_precision=True),
            # languages=None + label_only mirrors tokenmill's default (label, drop nothing).
            LocalLanguageFilter(a.lid_model, languages=langs, language_threshold=0.65,
                                label_only=langs is None),
            GopherRepetitionFilter(),
            GopherQualityFilter(),
            C4QualityFilter(),
            FineWebQualityFilter(),
            JsonlWriter(f"{w}/filtered"),
            MinhashDedupSignature(output_folder=f"{w}/signatures", config=minhash),
        ], tasks=tasks, workers=tasks, logging_dir=f"{w}/logs/1")),
        ("2 minhash buckets", LocalPipelineExecutor(pipeline=[
            MinhashDedupBuckets(input_folder=f"{w}/signatures", output_folder=f"{w}/buckets", config=minhash),
        ], tasks=minhash.num_buckets, workers=tasks, logging_dir=f"{w}/logs/2")),
        ("3 minhash cluster", LocalPipelineExecutor(pipeline=[
            MinhashDedupCluster(input_folder=f"{w}/buckets", output_folder=f"{w}/remove_ids", config=minhash),
        ], tasks=1, logging_dir=f"{w}/logs/3")),
        ("4 dedup filter+tokenize", LocalPipelineExecutor(pipeline=[
            JsonlReader(f"{w}/filtered"),
            MinhashDedupFilter(input_folder=f"{w}/remove_ids"),
            DocumentTokenizer(output_folder=f"{w}/tokens", tokenizer_name_or_path=a.tokenizer,
                              eos_token=a.eos),
        ], tasks=tasks, workers=tasks, logging_dir=f"{w}/logs/4")),
    ]
    summary = {"stages": []}
    for label, ex in stages:
        t0 = time.perf_counter()
        try:
            stats = ex.run()
        except Exception as e:  # a failed task re-raises here; report it instead of dying
            print(f"stage {label} failed: {e!r}", file=sys.stderr)
            stats = None
        wall = time.perf_counter() - t0
        missing = ex.get_incomplete_ranks()
        steps = []
        for s in (stats.stats if stats else []):
            d = s.to_dict()
            # "🔻 - FILTER: 🥇 Gopher Quality" -> kind "FILTER", name "Gopher Quality"
            kind, _, name = d["name"].partition(": ")
            ascii_only = lambda t: t.encode("ascii", "ignore").decode().strip(" -")
            steps.append({"kind": ascii_only(kind), "name": ascii_only(name), "time_s": s.time_stats.total,
                          "stats": {k: v.get("total", v) if isinstance(v, dict) else v
                                    for k, v in d["stats"].items()}})
        summary["stages"].append({"label": label, "wall_s": wall, "steps": steps, "failed_ranks": missing})
        if missing:
            summary["error"] = f"stage {label}: ranks {missing} did not complete (logs in {w}/logs)"
            break
    # The proof that tokens came out: token files, their sizes and datatrove's own counts.
    tokens = 0
    for meta in glob.glob(f"{w}/tokens/*.ds.metadata"):
        with open(meta) as fh:
            tokens += int(fh.read().splitlines()[1])
    summary["tokens"] = tokens
    summary["token_bytes"] = sum(os.path.getsize(p) for p in glob.glob(f"{w}/tokens/*.ds"))
    with open(a.summary, "w") as fh:
        json.dump(summary, fh)
    return 1 if "error" in summary else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def run_datatrove(py: Path, script: Path, inp: Path, work: Path, tok: Path, eos: str, lid: str,
                  keep_lang: str, poll: float, log: Path) -> dict:
    """One datatrove run in a fresh process tree, timed and RSS-sampled like scaling.run_once."""
    summary = work / "summary.json"
    cmd = [str(py), str(script), "--input", str(inp), "--work", str(work), "--tokenizer", str(tok),
           "--eos", eos, "--lid-model", lid, "--keep-lang", keep_lang, "--workers", str(WORKERS),
           "--summary", str(summary)]
    # Offline: never let huggingface_hub (imported by datatrove) try the network.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    with open(log, "w") as err:
        # scaling.WRAPPER: a fresh parent per run so RUSAGE_CHILDREN covers only this run's tree.
        proc = subprocess.Popen([sys.executable, "-c", scaling.WRAPPER, *cmd], stdout=subprocess.PIPE,
                                stderr=err, text=True, env=env)
        sampler = scaling.TreeSampler(proc.pid, poll)
        sampler.start()
        stdout, _ = proc.communicate()
    wall = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    try:
        w = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        w = {"rc": proc.returncode, "maxrss_kb": 0}
    try:
        s = json.loads(summary.read_text())
    except (OSError, ValueError):
        s = {"stages": [], "tokens": 0}
    # Kept = what MinhashDedupFilter (the last step before the tokenizer) lets through.
    kept = None
    for st in s["stages"]:
        for step in st["steps"]:
            if step["name"] == "MinHash stage 4":
                kept = int(step["stats"].get("forwarded", 0))
    return {"wall_s": wall, "rc": w.get("rc"), "tree_mb": sampler.peak_kb / 1024, "procs": sampler.peak_procs,
            "max1_mb": w.get("maxrss_kb", 0) / 1024, "kept": kept, "tokens": s.get("tokens", 0),
            "summary": s}


# -- the tokenmill side ---------------------------------------------------------------------------

def build_tokenizer(pages: list[Path], tmp: Path, vocab: int, sample: int) -> tuple[Path, float]:
    """TOK.json: ``tokenmill tokenizer train`` (BPE) on a spread sample of the pages; a fixed
    sample and trainer, so the same pages give the same tokenizer."""
    src = tmp / "tok-sample"
    scaling.stage(scaling.pick_spread(pages, sample), src)
    tok = tmp / "TOK.json"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tokenmill.cli", "tokenizer", "train", "--input", str(src),
                    "--output", str(tok), "--kind", "bpe", "--vocab-size", str(vocab)],
                   check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(src, ignore_errors=True)
    return tok, time.perf_counter() - t0


def eos_and_vocab(tok: Path) -> tuple[str, int]:
    """The EOS token tokenmill appends (its first candidate present), for datatrove to append
    too, and the vocabulary size (the trainer stops short of the target on a small sample)."""
    from tokenizers import Tokenizer

    # The import pulls in apache_beam, which logs a warning about optional GCP clients.
    logging.disable(logging.WARNING)
    from tokenmill.transforms.tokenization import EOS_CANDIDATES
    logging.disable(logging.NOTSET)
    t = Tokenizer.from_file(str(tok))
    for c in EOS_CANDIDATES:
        if t.token_to_id(c) is not None:
            return c, t.get_vocab_size()
    sys.exit(f"compare: {tok} has none of the EOS tokens {EOS_CANDIDATES}")


def tokenmill_tokens(out: Path) -> int:
    try:
        return json.loads((out / "report" / "report.json").read_text()).get("tokens_kept", 0)
    except (OSError, ValueError):
        return 0


# -- report ---------------------------------------------------------------------------------------

def tokenmill_funnel(out: Path) -> str:
    """Documents out of each tokenmill stage, from its report.json."""
    try:
        rows = json.loads((out / "report" / "report.json").read_text())["funnel"]
    except (OSError, ValueError, KeyError):
        return "?"
    return " > ".join(f"{r['stage']} {r['out']}" for r in rows)


def datatrove_funnel(s: dict) -> str:
    """Documents out of each datatrove step that reads, extracts, filters or deduplicates."""
    parts = []
    for st in s["stages"]:
        for step in st["steps"]:
            c = step["stats"]
            if step["kind"] == "READER" and step["name"] == "HTML files":
                parts.append(f"read {int(c.get('documents', 0))}")
            elif step["kind"] in ("EXTRAC", "FILTER") or step["name"] == "MinHash stage 4":
                parts.append(f"{step['name']} {int(c.get('forwarded', 0))}")
    return " > ".join(parts) or "?"


def print_datatrove_stages(s: dict) -> None:
    """datatrove's own timings: wall per executor (stage) and, per step, the seconds its
    track_time() blocks add up to over all tasks (so up to workers x wall), with its counters."""
    for st in s["stages"]:
        print(f"    stage {st['label']:<30} {st['wall_s']:>8.1f} s wall")
        upstream = 0.0
        for step in st["steps"]:
            counts = {k: v for k, v in step["stats"].items()
                      if k in ("documents", "total", "forwarded", "dropped", "timeout", "clean_error",
                               "broken_process", "tokens") or k.startswith("dropped_")}
            cs = " ".join(f"{k}={int(v)}" for k, v in counts.items() if isinstance(v, (int, float)))
            note = ""
            if step["name"] == "MinHash stage 1":
                # Its track_time() wraps its whole `for doc in data` loop, so it includes the
                # time of every step before it in the stage; its own share is the difference.
                note = f" (incl. upstream; own ~{max(0.0, step['time_s'] - upstream):.1f} s)"
            upstream += step["time_s"]
            print(f"      {step['name'][:22]:<22} {step['time_s']:>8.1f} s{note}  {cs}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="5000,20000", help="comma-separated page counts")
    ap.add_argument("--keep-lang", default="",
                    help="e.g. en: both drop other languages (score >= 0.65); default: label only, "
                         "tokenmill's default")
    ap.add_argument("--tok-sample", type=int, default=3000, help="pages TOK.json is trained on")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--venv", type=Path, default=REPO / ".bench-venv" / "datatrove",
                    help="datatrove's virtualenv (created on first use)")
    ap.add_argument("--poll", type=float, default=0.2, help="seconds between /proc memory samples")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (inputs, outputs, logs)")
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})

    pages = scaling.rust_doc_pages()
    if not pages:
        print("compare: no Rust toolchain docs under ~/.rustup/toolchains/*/share/doc/rust/html; skipped")
        return 0
    dt_py, dt_version = ensure_datatrove(args.venv)
    lid = lid_model_path()
    print(f"compare: {len(pages):,} Rust doc pages of 2 KB-500 KB; sizes {sizes}; {WORKERS} workers each; "
          f"datatrove {dt_version}; language {'keep ' + args.keep_lang if args.keep_lang else 'label only'}")
    print(f"compare: deviations from datatrove defaults: LID model {lid} (lid.176.ftz, not a downloaded "
          f"lid.176.bin)")

    tmp = Path(tempfile.mkdtemp(prefix="tokenmill-vs-datatrove-"))
    rows = []
    try:
        tok, tok_s = build_tokenizer(pages, tmp, args.vocab_size, args.tok_sample)
        eos, vocab = eos_and_vocab(tok)
        print(f"compare: TOK.json: byte-level BPE, {vocab:,} tokens (target {args.vocab_size:,}), EOS {eos}, "
              f"trained on {args.tok_sample} pages in {tok_s:.0f} s")
        script = tmp / "dt_pipeline.py"
        script.write_text(DT_PIPELINE)
        sets = [f"tokenize.tokenizer={tok}"]
        if args.keep_lang:
            sets.append(f"language.keep=[{args.keep_lang}]")
        for n in sizes:
            chosen = scaling.pick_spread(pages, n)
            inp = tmp / f"in-{n}"
            mb_in = scaling.stage(chosen, inp) / 1e6
            print(f"\n== {len(chosen)} pages ({mb_in:.0f} MB) ==", flush=True)

            tm_out = tmp / f"tokenmill-{n}"
            # scaling.run_once: the multi_processing mode's flags, wrapper process and TreeSampler.
            tm = scaling.run_once(inp, tm_out, "default", args.poll, tmp / f"tokenmill-{n}.log",
                                  sets)
            tm["tokens"] = tokenmill_tokens(tm_out)
            print(f"  tokenmill: {tm['wall_s']:.1f} s" + ("" if tm["rc"] == 0 else
                  f"  FAILED rc={tm['rc']} (log {tmp / f'tokenmill-{n}.log'})"), flush=True)

            dt = run_datatrove(dt_py, script, inp, tmp / f"datatrove-{n}", tok, eos, lid, args.keep_lang,
                               args.poll, tmp / f"datatrove-{n}.log")
            err = dt["summary"].get("error")
            print(f"  datatrove: {dt['wall_s']:.1f} s" + ("" if dt["rc"] == 0 else
                  f"  FAILED rc={dt['rc']} {err or ''} (log {tmp / f'datatrove-{n}.log'})"), flush=True)
            # Both must have produced tokens, or the comparison is meaningless.
            for name, r in (("tokenmill", tm), ("datatrove", dt)):
                if r["rc"] == 0 and not r["tokens"]:
                    print(f"  {name}: exited 0 but wrote no tokens")
                    r["rc"] = r["rc"] or -1
            if tm["rc"] != 0 or dt["rc"] != 0:
                args.keep = True

            print(f"\n  {'':<10} {'wall s':>8} {'docs/s':>7} {'tree RSS MB':>12} {'max1 MB':>8} {'procs':>5} "
                  f"{'kept docs':>9} {'tokens':>11}")
            for name, r in (("tokenmill", tm), ("datatrove", dt)):
                print(f"  {name:<10} {r['wall_s']:>8.1f} {n / r['wall_s']:>7.1f} {r['tree_mb']:>12.0f} "
                      f"{r['max1_mb']:>8.0f} {r['procs']:>5} {str(r['kept']):>9} {r['tokens']:>11,}")
            ratio = dt["wall_s"] / tm["wall_s"]
            print(f"  tokenmill docs/s / datatrove docs/s = {ratio:.2f}x (goal >= 2x "
                  f"{'ok' if ratio >= 2 else 'MISSED'})")
            print(f"  tokenmill funnel: {tokenmill_funnel(tm_out)}")
            print(f"  datatrove funnel: {datatrove_funnel(dt['summary'])}")
            print("  datatrove stage timings (step seconds summed over its tasks):")
            print_datatrove_stages(dt["summary"])
            rows.append((len(chosen), mb_in, tm, dt))
            shutil.rmtree(inp, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"compare: kept {tmp}")

    if len(rows) > 1:
        print(f"\n{'pages':>7} {'MB in':>6} {'tokenmill docs/s':>17} {'datatrove docs/s':>17} {'ratio':>6} "
              f"{'tm RSS MB':>10} {'dt RSS MB':>10} {'tm kept':>8} {'dt kept':>8}")
        for n, mb, tm, dt in rows:
            print(f"{n:>7} {mb:>6.0f} {n / tm['wall_s']:>17.1f} {n / dt['wall_s']:>17.1f} "
                  f"{dt['wall_s'] / tm['wall_s']:>5.2f}x {tm['tree_mb']:>10.0f} {dt['tree_mb']:>10.0f} "
                  f"{str(tm['kept']):>8} {str(dt['kept']):>8}")
    return 0 if all(tm["rc"] == 0 and dt["rc"] == 0 for _, _, tm, dt in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

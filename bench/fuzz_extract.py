"""Fuzz the extractor: coverage-guided (atheris, libFuzzer underneath) over extract_html, and
differential: every input goes through the compiled lexbor walk and its Python twin
(extract/lexbor_py.py), and any difference in title or text is a finding, as is any exception
(extract_html must turn every page into a result) or a crash (the process dies: libFuzzer keeps
the input as crash-*). For a fixed budget; not part of `make test`.

    .venv/bin/pip install atheris        # not a dependency of tokenmill
    .venv/bin/python bench/fuzz_extract.py [--seconds 300] [--max-len 16384]

The corpus is kept as bench/fuzz/corpus.tar.gz (unpacked into bench/fuzz/corpus/, where
libFuzzer adds every input that reaches new coverage; pack it again to keep a run's finds; first
seeded from tokenmill/sample's pages and small pages of ../shared/data); findings go to
bench/fuzz/findings/, each to become a regression test."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))
HERE = REPO / "bench" / "fuzz"
CORPUS, FINDINGS = HERE / "corpus", HERE / "findings"
stats = {"inputs": 0, "differences": 0, "exceptions": 0, "start": time.time(), "cpu": time.process_time()}


def seed_corpus(max_len: int) -> None:
    """The kept corpus (bench/fuzz/corpus.tar.gz, what earlier runs found) unpacked; the first
    time, seeds from the sample's and the shared data's pages."""
    if CORPUS.exists() and any(CORPUS.iterdir()):
        return
    kept = HERE / "corpus.tar.gz"
    if kept.exists():
        import tarfile

        with tarfile.open(kept) as tar:
            tar.extractall(HERE, filter="data")
        return
    CORPUS.mkdir(parents=True, exist_ok=True)
    pages = [p.read_bytes() for p in sorted((REPO / "tokenmill" / "sample" / "pages").rglob("*")) if p.is_file()]
    for p in sorted((DATA / "html_extraction").rglob("*.html.gz"))[:200]:
        pages.append(gzip.decompress(p.read_bytes()))
    for data in pages:
        if len(data) <= max_len:
            (CORPUS / hashlib.sha1(data).hexdigest()).write_bytes(data)


def keep(kind: str, data: bytes, why: str) -> None:
    FINDINGS.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    (FINDINGS / f"{kind}-{name}.html").write_bytes(data)
    (FINDINGS / f"{kind}-{name}.txt").write_text(why[:2000])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=300, help="the fuzzing budget (wall time)")
    ap.add_argument("--max-len", type=int, default=16384, help="the longest input libFuzzer makes")
    args = ap.parse_args()
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: .venv/bin/pip install atheris")
    with atheris.instrument_imports(include=["tokenmill.transforms.extract"]):
        from tokenmill.transforms.extract import extract_html, lexbor_py, tree
    compiled = tree._LEXBOR
    if compiled is lexbor_py:
        sys.exit("the compiled lexbor walk is not built here: nothing to compare")
    seed_corpus(args.max_len)

    def one(data: bytes):
        tree._LEXBOR = compiled
        try:
            a = extract_html(data, timeout_s=5.0)
            tree._LEXBOR = lexbor_py
            b = extract_html(data, timeout_s=5.0)
        except Exception as e:  # noqa: BLE001 - a finding, not the end of the run
            stats["exceptions"] += 1
            keep("exception", data, f"{type(e).__name__}: {e}")
            return
        finally:
            tree._LEXBOR = compiled
        stats["inputs"] += 1
        if stats["inputs"] % 1000 == 0:
            summary()
        if (a.title, a.text) != (b.title, b.text):
            stats["differences"] += 1
            keep("difference", data, f"compiled title={a.title!r}\npython   title={b.title!r}\n"
                                     f"compiled text={a.text[:800]!r}\npython   text={b.text[:800]!r}")

    def summary():  # every 1,000 inputs (libFuzzer ends the process without Python's atexit)
        wall, cpu = time.time() - stats["start"], time.process_time() - stats["cpu"]
        print(f"fuzz_extract: {stats['inputs']:,} inputs compared in {wall:.0f} s ({cpu:.0f} s CPU), "
              f"{stats['differences']} differences, {stats['exceptions']} exceptions; corpus "
              f"{len(list(CORPUS.iterdir()))} inputs; findings in {FINDINGS}", file=sys.stderr, flush=True)

    atheris.Setup([sys.argv[0], str(CORPUS), f"-max_total_time={args.seconds}", f"-max_len={args.max_len}",
                   "-rss_limit_mb=4096", f"-artifact_prefix={FINDINGS}/", "-print_final_stats=1"], one)
    FINDINGS.mkdir(parents=True, exist_ok=True)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tag now, filter later: `tokenmill refilter` against a full `prepare`, wall time.

The corpus is N Rust documentation pages (bench/scaling.py's pick). Three runs, each in a fresh
process, multi_processing x2:
  1. prepare --set quality.mode=tag            (the run that stores every signal and signature)
  2. refilter OUT1 --set quality.gopher.min_words=80
  3. prepare --set quality.gopher.min_words=80 (what 2 must equal, and its time to beat)
It prints the wall times, the ratio 2 / 3 (goal: at most 1/5) and whether 2 and 3 wrote the same
docs and shards.

    python bench/refilter.py [--pages 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from scaling import pick_spread, rust_doc_pages, stage  # noqa: E402

FLAGS = ["--quiet", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def tokenmill(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tokenmill.cli", *args, *FLAGS], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def same(a: Path, b: Path) -> bool:
    docs = sorted(os.listdir(a / "docs")) == sorted(os.listdir(b / "docs")) and all(
        (a / "docs" / f).read_bytes() == (b / "docs" / f).read_bytes() for f in os.listdir(a / "docs"))
    ma, mb = (json.loads((x / "manifest.json").read_text())["splits"] for x in (a, b))
    return docs and ma == mb


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=20000)
    a = ap.parse_args()
    pages = rust_doc_pages()
    if not pages:
        print("skip: no Rust toolchain docs on this machine")
        return 0
    work = Path(tempfile.mkdtemp(prefix="tokenmill_bench_refilter_"))
    try:
        stage(pick_spread(pages, a.pages), work / "pages")
        t_tag = tokenmill("prepare", "--input", str(work / "pages"), "--output", str(work / "tag"),
                          "--set", "quality.mode=tag")
        t_ref = tokenmill("refilter", str(work / "tag"), "--output", str(work / "ref"),
                          "--set", "quality.gopher.min_words=80")
        t_dir = tokenmill("prepare", "--input", str(work / "pages"), "--output", str(work / "dir"),
                          "--set", "quality.gopher.min_words=80")
        print(f"{a.pages:,} pages: prepare (tag) {t_tag:.1f} s, refilter {t_ref:.1f} s, prepare (same settings) "
              f"{t_dir:.1f} s; refilter / prepare = {t_ref / t_dir:.2f} (goal <= 0.20); "
              f"same docs and shards: {same(work / 'ref', work / 'dir')}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

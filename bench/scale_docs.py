"""A survivor-heavy corpus at scale: flat memory through the whole `prepare` (issue #15).

N documents (default 500,000, about 4 KB each: ~2 GB of text) made from real text: lines of the
Rust documentation pages of the local toolchain (extracted by tokenmill), or, without them, of
the license texts in ../shared/data. Each document is ~600 words of lines drawn at random, so
documents are distinct; planted on top: 6% of the base documents get one or two near copies
(1-2% of the words replaced, inserted or deleted) and 1% an exact copy (case and spacing
changed). They are written as 16 JSONL.zst files, and

    tokenmill prepare --input DIR --output OUT --set quality.enabled=false <mode flags>

runs in a fresh process (quality off, so nearly everything survives to tokenization and the
shards). The bench prints docs/s, the peak tree RSS (scaling.py's sampler: the summed RSS of the
process tree), the peak of the run's temporary candidate files, the output sizes, and the dedup
recall on the planted pairs (a pair counts as found when one of the two was removed).

    python bench/scale_docs.py [--docs 500000] [--mode multi_processing|in_memory] [--keep]
                               [--set section.key=value ...]
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.append(_HERE)  # for scaling's sampler, after the standard library

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import scaling  # noqa: E402

FILES = 16
WORDS = 600


def line_pool(max_pages: int = 3000) -> tuple[list[str], str]:
    """Lines of real text (>= 40 characters), and where they came from."""
    from tokenmill.transforms.extract import extract_html

    pages = scaling.rust_doc_pages()
    lines: list[str] = []
    if pages:
        for p in scaling.pick_spread(pages, max_pages):
            text = extract_html(p.read_bytes()).text or ""
            lines += [ln for ln in text.splitlines() if len(ln) >= 40]
        return lines, f"{min(len(pages), max_pages)} Rust doc pages"
    shared = Path(os.environ.get("TOKENMILL_SHARED_DATA", Path(_HERE).parent.parent / "shared" / "data"))
    for f in sorted(glob.glob(str(shared / "near_duplicates" / "license_texts" / "**" / "*"), recursive=True)):
        if os.path.isfile(f):
            lines += [ln for ln in open(f, errors="replace").read().splitlines() if len(ln) >= 40]
    return lines, "license texts in ../shared/data"


def edit(rng: random.Random, words: list[str], vocab: list[str]) -> list[str]:
    w = list(words)
    for _ in range(max(1, int(len(w) * rng.uniform(0.01, 0.02)))):
        op, pos = rng.randrange(3), rng.randrange(len(w))
        if op == 0:
            w[pos] = rng.choice(vocab)
        elif op == 1:
            w.insert(pos, rng.choice(vocab))
        else:
            del w[pos]
    return w


def generate(n: int, folder: Path, lines: list[str], seed: int = 11) -> tuple[int, int, list[tuple[str, str]]]:
    """Writes the corpus; returns (docs, text bytes, planted (base, copy) pairs)."""
    import zstandard

    rng = random.Random(seed)
    vocab = sorted({w for ln in lines[:20000] for w in ln.split()})
    folder.mkdir(parents=True)
    outs = [zstandard.ZstdCompressor(level=1).stream_writer(open(folder / f"part-{i:02d}.jsonl.zst", "wb"))
            for i in range(FILES)]
    made = chars = 0
    planted: list[tuple[str, str]] = []
    i = 0

    def put(doc_id: str, text: str) -> None:
        nonlocal made, chars
        outs[made % FILES].write((json.dumps({"id": doc_id, "text": text}) + "\n").encode())
        made += 1
        chars += len(text)

    while made < n:
        words: list[str] = []
        while len(words) < WORDS:
            words += rng.choice(lines).split()
        base = f"b{i:07d}"
        i += 1
        put(base, " ".join(words))
        r = rng.random()
        if r < 0.06:
            for k in range(rng.randint(1, 2)):
                if made < n:
                    put(f"{base}~{k}", " ".join(edit(rng, words, vocab)))
                    planted.append((base, f"{base}~{k}"))
        elif r < 0.07 and made < n:
            put(f"{base}~x", "  ".join(words).upper())
            planted.append((base, f"{base}~x"))
    for o in outs:
        o.close()
    return made, chars, planted


class DiskSampler(threading.Thread):
    """Peak bytes under OUT's stage folders' temporary files (candidates and spills)."""

    def __init__(self, out: Path, every: float = 1.0):
        super().__init__(daemon=True)
        self.out, self.every, self.peak = out, every, 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            total = 0
            for tmp in glob.glob(str(self.out / ".tokenmill-stage-*" / ".tmp")):
                for d, _, fs in os.walk(tmp):
                    for f in fs:
                        try:
                            total += os.path.getsize(os.path.join(d, f))
                        except OSError:
                            pass
            self.peak = max(self.peak, total)
            self.stop.wait(self.every)


def recall(out: Path, planted: list[tuple[str, str]]) -> tuple[float, int, dict]:
    import pyarrow.parquet as pq

    dropped: dict[str, str | None] = {}
    reasons: dict[str, int] = {}
    for f in sorted(glob.glob(str(out / "docs" / "*.parquet"))):
        t = pq.read_table(f, columns=["id", "dropped_by"]).to_pydict()
        for i, r in zip(t["id"], t["dropped_by"]):
            dropped[i] = r
            reasons[r or "kept"] = reasons.get(r or "kept", 0) + 1
    found = sum(1 for a, b in planted if dropped.get(a) or dropped.get(b))
    return (found / len(planted) if planted else 1.0), len(dropped), reasons


def du(path: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=500_000)
    ap.add_argument("--mode", choices=sorted(scaling.MODES), default="multi_processing")
    ap.add_argument("--set", action="append", default=[], metavar="section.key=value")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tokenmill-scale-"))
    try:
        t0 = time.perf_counter()
        lines, source = line_pool()
        n, chars, planted = generate(args.docs, tmp / "in", lines)
        print(f"scale_docs: {n:,} docs, {chars / 1e9:.2f} G chars of text ({len(lines):,} lines of {source}), "
              f"{len(planted):,} planted pairs; {du(tmp / 'in') / 1e6:.0f} MB as JSONL.zst; "
              f"made in {time.perf_counter() - t0:.0f} s")
        out = tmp / "out"
        disk = DiskSampler(out)
        disk.start()
        r = scaling.run_once(tmp / "in", out, args.mode, 0.5, tmp / "run.log", ["quality.enabled=false", *args.set])
        disk.stop.set()
        disk.join()
        if r["rc"] != 0:
            print(f"scale_docs: prepare failed (rc {r['rc']}); log: {tmp / 'run.log'}")
            print(open(tmp / "run.log").read()[-3000:])
            args.keep = True
            return 1
        rec, rows, reasons = recall(out, planted)
        manifest = json.loads((out / "manifest.json").read_text())
        tokens = sum(s["tokens"] for s in manifest["splits"].values())
        print(f"scale_docs: {args.mode}: {r['wall_s']:.0f} s wall = {n / r['wall_s']:,.0f} docs/s; "
              f"peak tree RSS {r['tree_mb']:,.0f} MB (largest process {r['max1_mb']:,.0f} MB); "
              f"temporary files (candidates and spills) peak {disk.peak / 1e6:,.0f} MB")
        print(f"scale_docs: output {du(out / 'docs') / 1e6:,.0f} MB docs Parquet ({rows:,} rows), "
              f"{du(out / 'shards') / 1e6:,.0f} MB shards ({tokens:,} tokens in "
              f"{sum(len(s['shards']) for s in manifest['splits'].values())} files)")
        print(f"scale_docs: dedup recall on planted pairs {rec:.4f}; rows by verdict {json.dumps(reasons)}")
        return 0
    finally:
        if args.keep:
            print(f"scale_docs: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""Export speed: `tokenmill export` (Megatron .bin/.idx, nanoGPT train.bin, MosaicML MDS) in MB of tokens per
second, against copying the same shard bytes with shutil (the disk's own pace, the ceiling).

    python bench/export.py [--tokens 100000000]

Synthetic shards from bench/loader.py's builder (random EOS-terminated documents, uint16). Each
format runs twice, interleaved with the copy; the best of two is printed, and the ratio to the
copy in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from loader import build  # noqa: E402

from tokenmill.pipelines.export_formats import export  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=100_000_000)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tokenmill_bench_export_")
    try:
        out = build(os.path.join(work, "out"), a.tokens, 4)
        shards = [os.path.join(out, "shards", f) for f in sorted(os.listdir(os.path.join(out, "shards")))]
        size = sum(os.path.getsize(f) for f in shards)
        best: dict[str, float] = {}
        for _ in range(2):
            for name in ("copy", "megatron", "nanogpt", "mds"):
                dest = os.path.join(work, name)
                shutil.rmtree(dest, ignore_errors=True)
                t0 = time.perf_counter()
                if name == "copy":
                    os.makedirs(dest)
                    for f in shards:
                        shutil.copyfile(f, os.path.join(dest, os.path.basename(f)))
                    written = size
                else:
                    written = export(out, name, dest)
                dt = time.perf_counter() - t0
                best[name] = max(best.get(name, 0.0), written / 2**20 / dt)
        print(f"{a.tokens:,} tokens, {size / 2**20:,.0f} MB of Arrow shards")
        for name, mbs in best.items():
            ratio = "" if name == "copy" else f"   {mbs / best['copy']:.2f} x the copy"
            print(f"  {name:9s} {mbs:8,.0f} MB/s{ratio}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

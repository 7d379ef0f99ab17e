"""Where in-process beats every core: `tokenmill prepare` in-process (one core) against
multi_processing with one worker per core (warm workers), on growing slices of real HTML pages.
pipelines/local_mode.MIN_BYTES, the input size from which a run given no runner flags uses
every core, comes from this crossover.

Pages: Rust documentation from the local toolchain (as bench/scaling.py picks them), else the
shared held-out pages (../shared/data/html_extraction). Each size is run in both modes,
alternating, best of --repeat; wall time from process start to exit (imports and worker start
count: that is what decides).

    python bench/default_mode.py [--sizes-mb 0.5,1,2,4,8,16,32] [--repeat 2]
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))
TOKENMILL = str(Path(sys.executable).parent / "tokenmill")


def pages() -> list[str]:
    try:
        root = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True).stdout.strip()
        found = sorted(glob.glob(os.path.join(root, "share/doc/rust/html/std/**/*.html"), recursive=True))
    except (OSError, subprocess.CalledProcessError):
        found = []
    if not found:
        found = sorted(glob.glob(str(DATA / "html_extraction" / "**" / "*.html"), recursive=True))
    return [p for p in found if 2_000 <= os.path.getsize(p) <= 500_000]


def stage(files: list[str], mb: float, folder: Path) -> int:
    folder.mkdir(parents=True)
    total = 0
    for i, f in enumerate(files):
        if total >= mb * 2**20:
            break
        os.symlink(f, folder / f"{i:06d}.html")
        total += os.path.getsize(f)
    return total


def run(inp: Path, out: Path, flags: list[str], tok: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run([TOKENMILL, "prepare", "--input", str(inp), "--output", str(out), "--quiet",
                    "--set", f"tokenize.tokenizer={tok}", *flags], check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="0.5,1,2,4,8,16,32")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from tokenmill.pipelines.local_mode import usable_cores

    files = pages()
    if not files:
        print("default_mode: no pages (no Rust docs, no shared data)")
        return 0
    n = usable_cores()
    modes = {"in-process": ["--runner=FnApiRunner"],
             f"{n} workers": ["--direct_running_mode=multi_processing", f"--direct_num_workers={n}"]}
    print(f"default_mode: {len(files):,} pages available; {n} usable cores; best of {args.repeat}")
    with tempfile.TemporaryDirectory(prefix="tokenmill-default-mode-") as tmp:
        # One tokenizer for every run (trained by a first prepare), so no run trains its own.
        first = Path(tmp) / "first"
        stage(files, 4, first)
        subprocess.run([TOKENMILL, "prepare", "--input", str(first), "--output", str(Path(tmp) / "first-out"),
                        "--quiet", "--runner=FnApiRunner", "--set", "tokenize.vocab_size=8000"],
                       check=True, capture_output=True)
        tok = str(Path(tmp) / "tok.json")
        shutil.copy(Path(tmp) / "first-out" / "tokenizer.json", tok)
        print(f"{'MB':>6} {'pages':>6} " + " ".join(f"{m:>12}" for m in modes) + "   faster")
        for mb in (float(x) for x in args.sizes_mb.split(",")):
            inp = Path(tmp) / f"in-{mb}"
            size = stage(files, mb, inp)
            best = {m: min(run(inp, Path(tmp) / "out", flags, tok) for _ in range(args.repeat)) for m, flags in modes.items()}
            print(f"{size / 2**20:6.1f} {len(os.listdir(inp)):6d} " + " ".join(f"{best[m]:11.2f}s" for m in modes)
                  + f"   {min(best, key=best.get)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

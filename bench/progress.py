"""What the live progress line of `prepare` costs: the same job with the line on (workers write
their counts once a second, a thread redraws) and off (--quiet), interleaved, best of N each.

    python bench/progress.py [--pages 5000] [--repeat 2]

Corpus: N Rust documentation pages, as bench/scaling.py picks them; multi_processing x2. The
line is drawn into a throwaway terminal-like console, so it costs what it costs on a terminal.
Without a Rust toolchain's docs the bench says so and exits 0.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
logging.basicConfig(level=logging.ERROR)

from scaling import pick_spread, rust_doc_pages, stage  # noqa: E402


def main() -> None:
    from rich.console import Console

    from tokenmill.config import load_config
    from tokenmill.pipelines import prepare
    from tokenmill.pipelines.progress_line import Display

    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    pages = rust_doc_pages()
    if not pages:
        print("no Rust documentation found (rustup's share/doc/rust/html): nothing to measure")
        return
    work = Path(tempfile.mkdtemp(prefix="tokenmill_bench_progress_"))
    try:
        inp = work / "in"
        stage(pick_spread(pages, a.pages), inp)
        best: dict[str, float] = {}
        for _ in range(a.repeat):
            for name in ("off", "on"):
                cfg = load_config(None, [])
                cfg.inputs, cfg.output = [str(inp)], str(work / f"out-{name}")
                display = Display(Console(file=io.StringIO(), force_terminal=True, width=160)) if name == "on" else None
                t0 = time.perf_counter()
                prepare.run(cfg, ["--direct_running_mode=multi_processing", "--direct_num_workers=2"], display)
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
        print(f"{a.pages:,} pages, multi_processing x2, best of {a.repeat}:")
        print(f"  progress off (--quiet)  {best['off']:7.2f} s")
        print(f"  progress on             {best['on']:7.2f} s   ({100 * (best['on'] / best['off'] - 1):+.1f}%)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

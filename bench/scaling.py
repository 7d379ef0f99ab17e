"""How `tokenmill prepare` scales with corpus size: wall time and peak memory (issue #8).

The corpus is N real HTML pages from the Rust documentation that ships with the local Rust
toolchain (``$HOME/.rustup/toolchains/*/share/doc/rust/html``): every k-th page, in sorted
path order, of those between 2 KB and 500 KB, so the N pages spread over the whole set (std,
core, alloc, the books, ...). They are copied under a temp folder with unique flat names.
Without a Rust toolchain's docs the bench says so and exits 0.

Each size runs the same command line in a fresh process (import and runner start-up count):

    tokenmill prepare --input DIR --output OUT <mode flags>

with the default job config. Modes:

- multi_processing (default): --direct_running_mode=multi_processing --direct_num_workers=2
- in_memory:                  --direct_running_mode=in_memory

Memory. Beam's multi_processing mode starts its SDK workers as subprocesses, so the peak of
one process is not the job's peak. Two numbers are reported:

- tree RSS: the peak, over samples taken every --poll seconds from /proc, of the summed RSS
  of the tokenmill process and all its descendants (what the job holds at once; shared
  pages counted once per process, so an upper bound);
- max1 RSS: ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` read after the run, i.e. the
  peak RSS of the largest single process in the waited-for tree (exact, kernel-accounted,
  but not a sum).

The ratio line compares the largest size to the smallest: time at most 1.1x per page (issue
#8), tree RSS at most 1.25x (issue #15's goal at 60k/5k; #8 asked 1.2x at 20k/5k).

    python bench/scaling.py [--sizes 5000,10000,20000] [--mode multi_processing|in_memory]
                            [--set section.key=value ...] [--keep]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MIN_BYTES, MAX_BYTES = 2 * 1024, 500 * 1024

MODES: dict[str, list[str]] = {
    "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    "in_memory": ["--direct_running_mode=in_memory"],
    "default": [],  # no runner flags: what a user gets (pipelines/local_mode.py)
}


def rust_doc_pages() -> list[Path]:
    """Every .html page of 2 KB-500 KB under the toolchains' doc folders, sorted by path."""
    roots = sorted(glob.glob(os.path.expanduser("~/.rustup/toolchains/*/share/doc/rust/html")))
    pages: list[Path] = []
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for n in names:
                if n.endswith(".html"):
                    p = Path(dirpath, n)
                    try:
                        size = p.stat().st_size
                    except OSError:
                        continue
                    if MIN_BYTES <= size <= MAX_BYTES:
                        pages.append(p)
    return sorted(pages)


def pick_spread(pages: list[Path], n: int) -> list[Path]:
    """n pages, every k-th in sorted order (k = len/n, fractional), over the whole set."""
    if n >= len(pages):
        return list(pages)
    step = len(pages) / n
    return [pages[int(i * step)] for i in range(n)]


def stage(pages: list[Path], dst: Path) -> int:
    dst.mkdir(parents=True, exist_ok=True)
    total = 0
    for i, p in enumerate(pages):
        # Flat, unique names: an index plus the page's own name (many pages share names).
        target = dst / f"{i:06d}_{p.name}"
        shutil.copyfile(p, target)
        total += p.stat().st_size
    return total


# -- memory sampling from /proc (no psutil needed) --------------------------------------------

def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # comm may contain spaces/parens: ppid is the 2nd field after the last ')'
        rest = stat[stat.rfind(b")") + 2:].split()
        kids.setdefault(int(rest[1]), []).append(int(d))
    return kids


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kb(root: int, per_pid: dict[int, int] | None = None) -> tuple[int, int]:
    """(summed RSS in KB, number of processes) of root and all its descendants; per_pid, when
    given, keeps each process's own peak."""
    kids = _children_map()
    todo, total, n = [root], 0, 0
    while todo:
        pid = todo.pop()
        kb = _rss_kb(pid)
        total += kb
        n += 1
        if per_pid is not None and kb > per_pid.get(pid, 0):
            per_pid[pid] = kb
        todo.extend(kids.get(pid, []))
    return total, n


class TreeSampler(threading.Thread):
    def __init__(self, pid: int, every: float):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak_kb, self.peak_procs, self.samples = 0, 0, 0
        self.per_pid: dict[int, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            kb, n = tree_rss_kb(self.pid, self.per_pid)
            self.samples += 1
            if kb > self.peak_kb:
                self.peak_kb = kb
            self.peak_procs = max(self.peak_procs, n)
            self.stop.wait(self.every)


# -- one run -------------------------------------------------------------------------------------

# A fresh wrapper process per run, so RUSAGE_CHILDREN covers exactly this run's process tree.
WRAPPER = r"""
import json, resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
print(json.dumps({"rc": rc, "maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def run_once(inp: Path, out: Path, mode: str, poll: float, log: Path, sets: list[str] = ()) -> dict:
    cmd = [sys.executable, "-m", "tokenmill.cli", "prepare", "--input", str(inp), "--output", str(out),
           *(a for kv in sets for a in ("--set", kv)), *MODES[mode]]
    t0 = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", WRAPPER, *cmd], stdout=subprocess.PIPE, stderr=err,
                                text=True)
        sampler = TreeSampler(proc.pid, poll)
        sampler.start()
        stdout, _ = proc.communicate()
    wall = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    last = stdout.strip().splitlines()[-1] if stdout.strip() else "{}"
    try:
        w = json.loads(last)
    except ValueError:
        w = {"rc": proc.returncode, "maxrss_kb": 0}
    kept = None
    try:
        rep = json.loads((out / "report" / "report.json").read_text())
        kept = rep.get("documents")
        if isinstance(kept, dict):  # tolerate a report that nests the count
            kept = kept.get("kept", kept)
    except (OSError, ValueError):
        pass
    # Per-process peaks, in start order: the wrapper, the tokenmill (runner) process, then
    # the SDK workers (multi_processing) -- shows where the memory sits.
    per = [sampler.per_pid[p] / 1024 for p in sorted(sampler.per_pid)]
    return {"wall_s": wall, "rc": w.get("rc"), "max1_mb": w.get("maxrss_kb", 0) / 1024,
            "tree_mb": sampler.peak_kb / 1024, "procs": sampler.peak_procs, "kept": kept, "per_proc_mb": per}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="5000,10000,20000", help="comma-separated page counts")
    ap.add_argument("--mode", choices=sorted(MODES), default="multi_processing")
    ap.add_argument("--poll", type=float, default=0.2, help="seconds between /proc memory samples")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (inputs, outputs, logs)")
    ap.add_argument("--set", action="append", default=[], metavar="section.key=value",
                    help="passed to tokenmill prepare (e.g. dedup.enabled=false to isolate a stage); repeatable")
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})

    pages = rust_doc_pages()
    if not pages:
        print("scaling: no Rust toolchain docs under ~/.rustup/toolchains/*/share/doc/rust/html; skipped")
        return 0
    print(f"scaling: {len(pages):,} Rust doc pages of 2 KB-500 KB; mode {args.mode}; sizes {sizes}"
          + (f"; --set {' '.join(args.set)}" if args.set else ""))
    if sizes[-1] > len(pages):
        print(f"scaling: only {len(pages):,} pages: larger sizes use them all")

    tmp = Path(tempfile.mkdtemp(prefix="tokenmill-scaling-"))
    rows = []
    try:
        for n in sizes:
            chosen = pick_spread(pages, n)
            inp, out = tmp / f"in-{n}", tmp / f"out-{n}"
            nbytes = stage(chosen, inp)
            r = run_once(inp, out, args.mode, args.poll, tmp / f"log-{n}.txt", args.set)
            r.update(pages=len(chosen), mb_in=nbytes / 1e6)
            rows.append(r)
            status = "" if r["rc"] == 0 else f"  FAILED rc={r['rc']} (log {tmp / f'log-{n}.txt'})"
            print(f"  {len(chosen):>6} pages ({r['mb_in']:.0f} MB): {r['wall_s']:.1f} s, tree RSS "
                  f"{r['tree_mb']:.0f} MB, max1 {r['max1_mb']:.0f} MB; per-process peaks (MB, by pid) "
                  f"{' '.join(f'{m:.0f}' for m in r['per_proc_mb'])}{status}", flush=True)
            if r["rc"] != 0:
                args.keep = True
            shutil.rmtree(inp, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"scaling: kept {tmp}")

    print()
    print(f"{'pages':>7} {'MB in':>6} {'wall s':>8} {'docs/s':>7} {'tree RSS MB':>12} {'max1 RSS MB':>12} "
          f"{'procs':>5} {'kept docs':>9}")
    for r in rows:
        print(f"{r['pages']:>7} {r['mb_in']:>6.0f} {r['wall_s']:>8.1f} {r['pages'] / r['wall_s']:>7.1f} "
              f"{r['tree_mb']:>12.0f} {r['max1_mb']:>12.0f} {r['procs']:>5} {str(r['kept']):>9}")
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        size_x = b["pages"] / a["pages"]
        t_x = b["wall_s"] / a["wall_s"]
        m_x = b["tree_mb"] / a["tree_mb"] if a["tree_mb"] else float("nan")
        m1_x = b["max1_mb"] / a["max1_mb"] if a["max1_mb"] else float("nan")
        # Goals: time <= 1.1x per page (#8); tree RSS <= 1.25x (#15, 60k/5k).
        t_goal, m_goal = 1.1 * size_x, 1.25
        print(f"\n{b['pages']}/{a['pages']} ({size_x:.1f}x pages): time {t_x:.2f}x (goal <= {t_goal:.1f}x "
              f"{'ok' if t_x <= t_goal else 'MISSED'}), tree RSS {m_x:.2f}x (goal <= {m_goal}x "
              f"{'ok' if m_x <= m_goal else 'MISSED'}), max1 RSS {m1_x:.2f}x")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

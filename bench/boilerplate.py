"""Boilerplate lines across documents, measured on ../shared/data/html_extraction/trafilatura_eval:
476 pages, each with snippets its main text must contain ("with") and must not ("without").
`tokenmill prepare` runs with boilerplate removal off and on (quality filters off, so that the
same pages survive), and prints the share of each kind of snippet found in the kept text. The
"without" share should fall and the "with" share hold.

    python bench/boilerplate.py [--min-docs 3]
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))


def snippets(value) -> list[str]:
    items = ast.literal_eval(value) if isinstance(value, str) else (value or [])
    return [" ".join(s.split()) for s in items if s and s.strip()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-docs", type=int, default=3)
    a = ap.parse_args()
    root = DATA / "html_extraction" / "trafilatura_eval"
    if not root.exists():
        print(f"skip: {root} not found (set TOKENMILL_SHARED_DATA)")
        return 0
    from tokenmill.cli import main as cli

    meta = {v["file"]: v for v in json.loads((root / "evaldata.json").read_text()).values()}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, sets in (("off", []), ("on", ["boilerplate.enabled=true", f"boilerplate.min_docs={a.min_docs}"])):
            out = os.path.join(tmp, name)
            argv = ["prepare", "--input", str(root / "html"), "--output", out, "--quiet",
                    "--set", "quality.enabled=false", "--set", "tokenize.enabled=false", "--set", "shards.enabled=false"]
            for s in sets:
                argv += ["--set", s]
            t0 = time.perf_counter()
            assert cli(argv) == 0
            dt = time.perf_counter() - t0
            texts = {}
            for f in glob.glob(os.path.join(out, "docs", "kept-*.parquet")):
                for r in pq.read_table(f, columns=["id", "text"]).to_pylist():
                    texts[os.path.basename(r["id"]).removesuffix(".gz")] = " ".join(r["text"].split())
            found = {"with": [0, 0], "without": [0, 0]}
            for file, m in meta.items():
                text = texts.get(file)
                if text is None:
                    continue
                for kind in ("with", "without"):
                    for snip in snippets(m.get(kind)):
                        found[kind][0] += snip in text
                        found[kind][1] += 1
            report = json.loads(Path(out, "report", "report.json").read_text())
            results[name] = (found, len(texts), dt, report.get("boilerplate_cut"))
    for name, (found, n, dt, cut) in results.items():
        w, wo = found["with"], found["without"]
        print(f"boilerplate {name:3s}: {n} pages kept, 'with' snippets in kept text {w[0] / w[1]:.4f} ({w[0]}/{w[1]}), "
              f"'without' {wo[0] / wo[1]:.4f} ({wo[0]}/{wo[1]}), {dt:.1f} s" + (f", cut {cut}" if cut else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The extractor's lexbor path, compiled walk against its Python twin (lexbor_py, what a build
without a C compiler runs): pages per second over the shared benchmark pages, one core, and
whether every page's text is equal.

    python bench/lexbor_twin.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="passes per path; the best is shown")
    args = ap.parse_args()
    from tokenmill.transforms.extract import decode_html, extract_html, lexbor_py, tree

    if tree._LEXBOR is lexbor_py:
        sys.exit("the compiled lexbor walk is not built here: nothing to compare")
    root = DATA / "html_extraction"
    pages = [decode_html(gzip.decompress(p.read_bytes()))[0] for p in sorted(root.rglob("*.html.gz"))
             if p.name != "expected.html.gz"]
    if not pages:
        sys.exit(f"no pages under {root}")
    compiled = tree._LEXBOR
    results, texts = {}, {}
    for name, module in (("compiled", compiled), ("python twin", lexbor_py)):
        tree._LEXBOR = module
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.process_time()
            out = [extract_html(p).text for p in pages]
            best = min(best, time.process_time() - t0)
        results[name], texts[name] = best, out
    tree._LEXBOR = compiled
    same = sum(a == b for a, b in zip(texts["compiled"], texts["python twin"]))
    print(f"{len(pages)} shared pages, whole extractor, CPU seconds (best of {args.repeat}):")
    for name, s in results.items():
        print(f"  {name:<12} {s:6.2f} s  {len(pages) / s:6.0f} pages/s")
    print(f"  python twin / compiled: {results['python twin'] / results['compiled']:.2f}x; "
          f"equal text on {same} of {len(pages)} pages")
    return 0 if same == len(pages) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Quality signals + filters: docs/s on one core over real text, and what each rule drops.

Text: the HTML pages of ../shared/data/html_extraction (extracted and normalised with
tokenmill's own cores first, not timed) and the Lingua sentences packed into documents.

    python bench/quality.py
"""

from __future__ import annotations

import collections
import gzip
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))


def main() -> int:
    pages_root = DATA / "html_extraction"
    if not pages_root.exists():
        print(f"skip: {pages_root} not found (set TOKENMILL_SHARED_DATA)")
        return 0
    from tokenmill.config import load_config
    from tokenmill.transforms.extract import extract_html
    from tokenmill.transforms.langid import default_model_path, load_model, predict
    from tokenmill.transforms.normalize import normalize_text
    from tokenmill.transforms.quality import first_failure, signals

    cfg = load_config()
    model = load_model(default_model_path())
    docs = []
    for path in sorted(pages_root.rglob("*.html.gz")):
        if path.name == "expected.html.gz":
            continue
        res = extract_html(gzip.decompress(path.read_bytes()))
        if res.text:
            text = normalize_text(res.text, cfg.normalize)
            lang, _ = predict(model, text, 4000)
            docs.append((text, lang))
    print(f"{len(docs):,} extracted pages from {pages_root}")
    t0 = time.process_time()
    verdicts = collections.Counter()
    for text, lang in docs:
        verdicts[first_failure(signals(text, lang, cfg.quality), lang, cfg.quality) or "kept"] += 1
    cpu = time.process_time() - t0
    chars = sum(len(t) for t, _ in docs)
    print(f"signals + filters: {len(docs) / cpu:,.0f} docs/s on one core ({chars / cpu / 1e6:.1f} M chars/s)")
    print("what each rule drops (first failing rule, default config):")
    for reason, n in verdicts.most_common():
        print(f"  {reason:32} {n:5d}  {n / len(docs):6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

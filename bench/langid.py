"""Language-ID accuracy of the pipeline's labels vs the bare fastText model on the same text.

Data: ../shared/data/langid (Lingua test sentences in 75 languages, UDHR in 532 translations).
The texts go through the real `tokenmill prepare` pipeline (DirectRunner: read JSONL ->
normalize -> language) and the `lang` column is read back from the docs Parquet; the bare
model gets the raw text with newlines replaced. Both are scored against the gold code.
Only gold languages that lid.176 has a label for are scored (the others cannot be right).

    python bench/langid.py [--limit N]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data")) / "langid"


def gold_codes(code639_1: str | None, code639_3: str | None) -> set[str]:
    return {c for c in (code639_1, code639_3) if c}


def load_items(limit: int | None) -> dict[str, list[tuple[str, set[str]]]]:
    import pycountry

    sets: dict[str, list[tuple[str, set[str]]]] = {"lingua_sentences": [], "udhr": []}
    for f in sorted((DATA / "lingua_testdata" / "sentences").glob("*.txt")):
        code = f.stem
        lang = pycountry.languages.get(alpha_2=code)
        alt = getattr(lang, "alpha_3", None) if lang else None
        for line in f.read_text(encoding="utf-8").splitlines()[:limit]:
            if line.strip():
                sets["lingua_sentences"].append((line, gold_codes(code, alt)))
    with open(DATA / "udhr" / "udhr_preamble_articles_01-15.jsonl", encoding="utf-8") as fh:
        per_lang: collections.Counter = collections.Counter()
        for line in fh:
            r = json.loads(line)
            iso3 = r.get("iso6393")
            if not iso3 or iso3 == "und" or not r["text"].strip():
                continue
            per_lang[iso3] += 1
            if limit and per_lang[iso3] > limit:
                continue
            lang = pycountry.languages.get(alpha_3=iso3)
            sets["udhr"].append((r["text"], gold_codes(getattr(lang, "alpha_2", None) if lang else None, iso3)))
    return sets


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None, help="items per language (default: all)")
    args = ap.parse_args()
    if not DATA.exists():
        print(f"skip: {DATA} not found (set TOKENMILL_SHARED_DATA)")
        return 0

    from tokenmill.cli import main as cli
    from tokenmill.transforms.langid import default_model_path, iso_code, load_model

    model = load_model(default_model_path())
    all_labels, _ = model.predict("a", k=-1)  # fasttext-predict has no get_labels(): ask for every label
    known = {iso_code(lab) for lab in all_labels} | {lab.removeprefix("__label__") for lab in all_labels}
    sets = load_items(args.limit)

    print(f"{'dataset':18} {'items':>7} {'scored':>7} {'bare acc':>9} {'pipeline acc':>13} {'pipeline docs/s':>16}")
    for name, items in sets.items():
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / f"{name}.jsonl"
            with open(src, "w", encoding="utf-8") as fh:
                for i, (text, _) in enumerate(items):
                    fh.write(json.dumps({"id": str(i), "text": text}, ensure_ascii=False) + "\n")
            t0 = time.perf_counter()
            rc = cli(["prepare", "--input", str(src), "--output", f"{tmp}/out", "--set", "report.enabled=false"])
            wall = time.perf_counter() - t0
            if rc:
                print(f"{name}: pipeline failed", file=sys.stderr)
                return 1
            rows = [r for f in glob.glob(f"{tmp}/out/docs/*.parquet") for r in pq.read_table(f).to_pylist()]
        pipe = {int(r["id"]): r["lang"] for r in rows}
        scored = bare_ok = pipe_ok = 0
        for i, (text, gold) in enumerate(items):
            if not gold & known:
                continue
            scored += 1
            labels, _ = model.predict(text.replace("\n", " "), k=1)
            bare_ok += bool(labels) and labels[0].removeprefix("__label__") in gold
            pipe_ok += pipe.get(i) in gold
        print(f"{name:18} {len(items):7d} {scored:7d} {bare_ok / scored:9.4f} {pipe_ok / scored:13.4f} "
              f"{len(items) / wall:16.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

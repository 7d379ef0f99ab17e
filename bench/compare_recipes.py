"""Does the rule-based quality filtering help a small model? `tokenmill compare` on real pages:
rules on (the default job) against rules off (quality.enabled=false), 2 seeds each, the tiny
preset, the same number of training tokens per arm; evaluated in bits per byte on the gold
main text of the scrapinghub article-extraction pages (not in the training inputs).

    python bench/compare_recipes.py [--tokens 1500000] [--seeds 2] [--work DIR]

Training inputs: ../shared/data's trafilatura_eval and mozilla_readability HTML pages and its
WARC files. Prints each phase's wall time and the compare table; the page is DIR/cmp/compare.html.
Without ../shared/data the bench says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO)
from tokenmill.private import cache_dir_or_temp  # noqa: E402

SHARED = os.environ.get("TOKENMILL_SHARED_DATA", os.path.join(REPO, "..", "shared", "data"))
TOKENMILL = os.path.join(os.path.dirname(sys.executable), "tokenmill")
BEAM = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"failed: {' '.join(cmd[:3])} ...\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1_500_000, help="training tokens per arm")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--work", default=None, help="default: a private cache folder (reused between runs)")
    a = ap.parse_args()
    # reused between runs (finished arms are kept): a private folder, never a fixed name in the shared /tmp
    a.work = a.work or os.path.join(cache_dir_or_temp("bench"), "compare_recipes")
    html = os.path.join(SHARED, "html_extraction")
    gold = os.path.join(html, "scrapinghub_aeb", "ground-truth.json")
    if not os.path.exists(gold):
        print(f"no shared data at {SHARED}: nothing to measure")
        return
    inputs = [os.path.join(html, "trafilatura_eval", "html"), os.path.join(html, "mozilla_readability", "test-pages"),
              os.path.join(SHARED, "warc")]
    os.makedirs(a.work, exist_ok=True)
    eval_path = os.path.join(a.work, "scrapinghub_gold.jsonl")
    with open(gold, encoding="utf-8") as fh, open(eval_path, "w", encoding="utf-8") as out:
        for key, page in sorted(json.load(fh).items()):
            if page.get("articleBody"):
                out.write(json.dumps({"id": key, "text": page["articleBody"]}) + "\n")

    outs = {"rules": [], "no_rules": ["--set", "quality.enabled=false"]}
    for name, extra in outs.items():
        out = os.path.join(a.work, name)
        if not os.path.exists(os.path.join(out, "manifest.json")):
            cmd = [TOKENMILL, "prepare", "--output", out, "--set", "tokenize.vocab_size=8192", *extra, *BEAM]
            for i in inputs:
                cmd += ["--input", i]
            print(f"prepare {name}: {run(cmd):.1f} s")
        with open(os.path.join(out, "manifest.json"), encoding="utf-8") as fh:
            m = json.load(fh)
        print(f"  {name}: {m['splits']['train']['tokens']:,} train tokens, vocab {m['tokenizer']['vocab_size']:,}")

    cmp_dir = os.path.join(a.work, "cmp")
    cmd = [TOKENMILL, "compare", *(os.path.join(a.work, n) for n in outs), "--eval", eval_path,
           "--tokens", str(a.tokens), "--seeds", str(a.seeds), "--output", cmp_dir,
           "--set", "model.preset=tiny", "--set", "data.seq_len=256", "--set", "train.micro_batch=8"]
    print(f"compare ({a.seeds} seeds x {len(outs)} arms, {a.tokens:,} tokens each): {run(cmd):.1f} s")
    with open(os.path.join(cmp_dir, "compare.json"), encoding="utf-8") as fh:
        r = json.load(fh)
    print(f"\neval: {r['eval']['docs']} scrapinghub gold documents, {r['eval']['bytes']:,} bytes; "
          f"{r['tokens_per_arm']:,} training tokens per arm ({r['steps']} steps)")
    print(f"{'arm':10} {'bpb mean':>9} {'min':>8} {'max':>8} {'per seed':>18} {'corpus tokens':>14}")
    for arm in r["arms"]:
        b = arm["eval_bpb"]
        seeds = " ".join(f"{run_['eval_bpb']:.4f}" for run_ in arm["runs"])
        print(f"{arm['name']:10} {b['mean']:9.4f} {b['min']:8.4f} {b['max']:8.4f} {seeds:>18} {arm['corpus_tokens']:14,}")
    for v in r["verdicts"]:
        said = {None: "spread unknown", True: "beyond the seed spread", False: "within the seed spread"}[v["exceeds_spread"]]
        print(f"{v['best']} beats {v['arm']} by {v['gap_bpb']:.4f} bpb ({said})")
    print("val-split matrix (rows: model, columns: val split):")
    for name, row in zip(r["val_matrix"]["models"], r["val_matrix"]["bpb"]):
        print(f"  {name:10} " + " ".join("   -   " if v is None else f"{v:.4f}" for v in row))
    print(f"page: {cmp_dir}/compare.html")


if __name__ == "__main__":
    main()

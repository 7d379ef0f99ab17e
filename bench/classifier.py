"""The learned quality classifier, measured honestly, and the cost of the #18 stages.

1. AUC: the 99 pages of ../shared/data/html_extraction/scrapinghub_aeb. Positive: each page's
   gold article body. Negative: the same page's visible text (lxml, without script/style)
   minus every line of the gold body, i.e. its boilerplate. 5-fold cross-validation by page,
   each fold trained with `tokenmill classifier train`'s core (epoch 50, lr 0.5: ~80 pages per
   class; the defaults, epoch 5 and lr 0.1, are for 100k+ documents) and scored with fasttext-predict
   as the pipeline scores; the pooled held-out ROC AUC is printed, with the rule-based
   quality_score's AUC on the same texts for comparison.
2. Speed on one core: classifier scoring, decontamination (13-grams of 2,000 synthetic eval items
   + the gold bodies as items) and URL matching (10,000 domains), docs/s over the same texts.

    python bench/classifier.py
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))


def visible_text(html: bytes) -> str:
    import lxml.html

    root = lxml.html.fromstring(html)
    for bad in root.xpath("//script|//style|//noscript"):
        bad.drop_tree()
    return "\n".join(" ".join(t.split()) for t in root.itertext() if t.strip())


def main() -> int:
    root = DATA / "html_extraction" / "scrapinghub_aeb"
    if not root.exists():
        print(f"skip: {root} not found (set TOKENMILL_SHARED_DATA)")
        return 0
    from tokenmill.config import load_config
    from tokenmill.pipelines.classifier_train import roc_auc, train
    from tokenmill.transforms.classifier import load, score
    from tokenmill.transforms.decontaminate import EvalGrams, decontaminate
    from tokenmill.transforms.langid import default_model_path, load_model, predict
    from tokenmill.transforms.quality import quality_score, signals
    from tokenmill.transforms.urlfilter import UrlList, blocked

    gold = json.loads((root / "ground-truth.json").read_text())
    pos, neg = [], []
    for key, g in sorted(gold.items()):
        body = g["articleBody"]
        norm = " ".join(body.split())
        page = visible_text(gzip.decompress((root / "html" / f"{key}.html.gz").read_bytes()))
        rest = "\n".join(line for line in page.splitlines() if line and line not in norm)
        if len(body.split()) >= 20 and len(rest.split()) >= 20:
            pos.append(body)
            neg.append(rest)
    print(f"{len(pos)} pages with a gold body and boilerplate of 20+ words each")
    order = list(range(len(pos)))
    random.Random(0).shuffle(order)
    folds = [order[i::5] for i in range(5)]
    held_pos, held_neg = np.zeros(len(pos)), np.zeros(len(neg))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        for k, test in enumerate(folds):
            test_set = set(test)
            files = {}
            for side, texts in (("pos", pos), ("neg", neg)):
                files[side] = os.path.join(tmp, f"{side}{k}.jsonl")
                with open(files[side], "w") as fh:
                    fh.writelines(json.dumps({"text": t}) + "\n" for i, t in enumerate(texts) if i not in test_set)
            model_path = os.path.join(tmp, f"m{k}.bin")
            train([files["pos"]], [files["neg"]], model_path, holdout=0.0, params={"epoch": 50, "lr": 0.5})
            m = load(model_path)
            for i in test:
                held_pos[i], held_neg[i] = score(m, pos[i], "hq"), score(m, neg[i], "hq")
        train_s = time.perf_counter() - t0
        cfg = load_config()
        lid = load_model(default_model_path())

        def rule_score(text):
            lang, ls = predict(lid, text, 4000)
            return quality_score(signals(text, lang, cfg.quality), ls)

        rules = roc_auc(np.array([rule_score(t) for t in pos]), np.array([rule_score(t) for t in neg]))
        print(f"5-fold held-out ROC AUC: classifier {roc_auc(held_pos, held_neg):.4f}, rule quality_score {rules:.4f} "
              f"(5 trainings in {train_s:.1f} s)")

        texts = (pos + neg) * 10
        chars = sum(map(len, texts))
        t0 = time.perf_counter()
        for t in texts:
            score(m, t, "hq")
        dt = time.perf_counter() - t0
        print(f"classifier scoring: {len(texts) / dt:,.0f} docs/s, {chars / dt / 1e6:.1f} M chars/s (dim 64, one core)")

    rng = random.Random(1)
    words = " ".join(pos).split()
    items = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) for _ in range(2000)] + pos[:50]
    grams = EvalGrams.build([("synthetic", items)], 13, 8)
    t0 = time.perf_counter()
    hits = sum(bool(decontaminate({"text": t}, grams, "drop").get("dropped_by")) for t in texts)
    dt = time.perf_counter() - t0
    print(f"decontamination: {len(texts) / dt:,.0f} docs/s, {chars / dt / 1e6:.1f} M chars/s; "
          f"{hits} of {len(texts)} docs hit (the 50 gold bodies used as items x10, and boilerplate texts that "
          f"kept part of a gold line)")
    block = UrlList([(f"site{i}.example", "list", i) for i in range(10_000)] + [("re:casino", "list", 0)])
    urls = [g["url"] for g in gold.values()] * 200
    t0 = time.perf_counter()
    n = sum(blocked(u, block, None) for u in urls)
    dt = time.perf_counter() - t0
    print(f"url lists: {len(urls) / dt:,.0f} URLs/s against 10,000 domains + a regex ({n} blocked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``tokenmill classifier train --positive A --negative B --output model.bin``: a fastText
quality classifier, the DCLM recipe (supervised, word bigrams), trained offline on the user's
texts and scored in the pipeline by ``quality.classifier.model``.

fastText (fasttext-numpy2, the one package that both trains and scores) trains in a child
process: a crash of its C++ core is one line, not the end of the command.

A share of each class (``--holdout``, by a hash of the text) is kept apart: the model is scored
on it exactly as the pipeline scores, and its ROC AUC is printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import xxhash

from tokenmill.errors import UserError
from tokenmill.pipelines.tokenizer_train import input_texts
from tokenmill.transforms.classifier import LABEL_PREFIX, fasttext_line, load, score

DEFAULTS = {"dim": 64, "wordNgrams": 2, "epoch": 5, "lr": 0.1, "minCount": 2, "bucket": 500_000, "seed": 1}


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counting half (Mann-Whitney U)."""
    scores = np.concatenate([pos, neg])
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # tied scores share their mean rank: (first + last) / 2, 1-based
    ranks = ((ends - counts + 1 + ends) / 2)[inverse]
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def _held_out(line: str, holdout: float) -> bool:
    return xxhash.xxh3_64_intdigest(line.encode("utf-8", "surrogatepass")) / 2**64 < holdout


def train(positive: list[str], negative: list[str], output: str, label: str = "hq", holdout: float = 0.1,
          max_docs: int = 500_000, params: dict | None = None) -> dict:
    """Trains and saves the model; returns counts and the held-out AUC (None without a held-out set)."""
    held: dict[str, list[str]] = {"pos": [], "neg": []}
    counts = {"pos": 0, "neg": 0}
    with tempfile.TemporaryDirectory(prefix="tokenmill-classifier-") as tmp:
        train_file = os.path.join(tmp, "train.txt")
        with open(train_file, "w", encoding="utf-8") as fh:
            for side, inputs, lab in (("pos", positive, label), ("neg", negative, "other")):
                for text in input_texts(inputs, max_docs):
                    line = fasttext_line(text)
                    if not line:
                        continue
                    if _held_out(line, holdout):
                        held[side].append(line)
                    else:
                        fh.write(f"{LABEL_PREFIX}{lab} {line}\n")
                        counts[side] += 1
        for side, inputs in (("pos", positive), ("neg", negative)):
            if not counts[side]:
                raise UserError(f"--{'positive' if side == 'pos' else 'negative'}: no training text in {', '.join(inputs)}")
        args = {"input": train_file, "output": output, **DEFAULTS, **(params or {})}
        child = subprocess.run([sys.executable, "-m", __name__, json.dumps(args)], capture_output=True, text=True)
        if child.returncode != 0:
            raise UserError(f"fastText training failed: {(child.stderr.strip().splitlines() or ['?'])[-1]}")
    auc = None
    if held["pos"] and held["neg"]:
        model = load(output)
        auc = roc_auc(np.array([score(model, t, label) for t in held["pos"]]),
                      np.array([score(model, t, label) for t in held["neg"]]))
    return {"positive": counts["pos"], "negative": counts["neg"], "held_out_positive": len(held["pos"]),
            "held_out_negative": len(held["neg"]), "auc": auc}


def _child(args: dict) -> None:
    """In the child process."""
    import fasttext

    output = args.pop("output")
    model = fasttext.train_supervised(verbose=0, thread=1, **args)
    model.save_model(output)


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))

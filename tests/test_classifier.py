"""The learned quality classifier: `tokenmill classifier train` (fastText, in a child process)
on real text, scored in a real prepare run, with the threshold's reason, the score column and
the report's histogram."""

import json

import numpy as np
import pytest
from conftest import run_prepare

from tokenmill.cli import main
from tokenmill.pipelines.classifier_train import roc_auc

SAMPLE = __import__("pathlib").Path(__file__).parent.parent / "tokenmill" / "sample"


def test_roc_auc():
    assert roc_auc(np.array([0.9, 0.8]), np.array([0.1, 0.2])) == 1.0
    assert roc_auc(np.array([0.1]), np.array([0.9])) == 0.0
    assert roc_auc(np.array([0.5, 0.5]), np.array([0.5])) == 0.5


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """Positive: the sample's English prose; negative: navigation and boilerplate lines."""
    tmp = tmp_path_factory.mktemp("clf")
    docs = [json.loads(x) for x in (SAMPLE / "docs.jsonl").read_text().splitlines() if x.strip().endswith("}")]
    prose = [d["text"] for d in docs if d.get("id", "").startswith("doc-en") and len(d.get("text") or "") > 300]
    assert len(prose) >= 3
    paragraphs = [p for t in prose for p in t.split("\n\n") if len(p.split()) > 12]
    (tmp / "pos.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs * 4))
    menus = ["Home | About us | Contact | Privacy policy | Terms of use | Sitemap",
             "Log in Sign up Subscribe Newsletter Follow us on Twitter Facebook Instagram",
             "Cookie settings Accept all cookies Manage preferences Learn more",
             "Previous Next Page 1 2 3 4 5 Back to top Share this Print Email",
             "Copyright 2024 All rights reserved Powered by WordPress Theme by Example"]
    rng = np.random.default_rng(0)
    neg = [" ".join(rng.permutation(" ".join(menus).split())[:25]) for _ in range(len(paragraphs) * 4)]
    (tmp / "neg.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in neg))
    path = tmp / "model.bin"
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["classifier", "train", "--positive", str(tmp / "pos.jsonl"), "--negative", str(tmp / "neg.jsonl"),
                   "--output", str(path), "--dim", "16", "--bucket", "20000", "--epoch", "10", "--holdout", "0.2"])
    assert rc == 0 and "held-out AUC 1.0000" in printed.getvalue(), printed.getvalue()
    return path


def test_the_model_ranks_prose_above_boilerplate(model):
    from tokenmill.transforms.classifier import load, score

    m = load(str(model))
    good = "When we brought home three hens two springs ago, I assumed the hard part would be the coop."
    assert score(m, good, "hq") > score(m, "Home | About us | Contact | Privacy policy | Sitemap | Log in", "hq")


def test_prepare_scores_every_document_and_drops_below_the_threshold(model, tmp_path):
    out = tmp_path / "out"
    rc, rows, report = run_prepare(out, [SAMPLE / "docs.jsonl"], [f"quality.classifier.model={model}",
                                                                   "quality.classifier.threshold=0.5"])
    assert rc == 0
    scored = [r for r in rows if r.get("n_words") is not None]
    assert scored and all(0.0 <= r["quality_classifier"] <= 1.0 for r in scored)
    low = [r for r in rows if r["dropped_by"] == "quality:classifier_low"]
    assert all(r["quality_classifier"] < 0.5 for r in low)
    assert all(r["quality_classifier"] >= 0.5 for r in rows if r["dropped_by"] is None)
    assert "quality_classifier" in report["histograms"]
    assert "quality_classifier" in (out / "report" / "report.html").read_text()  # its kept-vs-dropped histogram


def test_bad_model_or_label_is_one_line(model, tmp_path, capsys):
    for sets, words in (([f"quality.classifier.model={tmp_path / 'none.bin'}"], "none.bin"),
                        ([f"quality.classifier.model={model}", "quality.classifier.label=good"], "has labels")):
        assert main(["prepare", "--output", str(tmp_path / "o"), "--input", str(SAMPLE / "docs.jsonl")]
                    + [a for s in sets for a in ("--set", s)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err

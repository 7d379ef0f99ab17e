"""Hostile misuse outside the readers: a manifest that is no manifest, bad ``inspect`` flags,
files beside the shards, and trainer floats that mean nothing as inf or nan."""

import hashlib
import json
import os

import numpy as np
import pytest
from rich.console import Console

from tokenmill.cli import main
from tokenmill.format import manifest_problem
from tokenmill.pipelines.inspect_output import inspect_output
from tokenmill.transforms.shards import write_manifest, write_shard


def make_out(out) -> str:
    """A small prepared output: two train and one val shard, a stand-in tokenizer file."""
    os.makedirs(os.path.join(out, "shards"), exist_ok=True)
    tok_text = '{"version": "1.0", "note": "stand-in"}'
    with open(os.path.join(out, "tokenizer.json"), "w") as fh:
        fh.write(tok_text)
    tok = {"sha256": hashlib.sha256(tok_text.encode()).hexdigest(), "vocab_size": 300, "eos_id": 0,
           "bos_id": None, "pad_id": None, "model": "BPE"}
    rng, metas = np.random.default_rng(0), []
    for split, n, shards in (("train", 20, 2), ("val", 4, 1)):
        rows = [(f"{split}-{i}", np.append(rng.integers(1, 300, size=30, dtype=np.uint16), np.uint16(0)))
                for i in range(n)]
        for k in range(shards):
            metas.append(write_shard((split, k, shards), rows[k::shards], str(out), "uint16", tok, 200))
    write_manifest(metas, str(out), tok, "uint16", {}, "test")
    return str(out)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("tokenmill: error: "), err
    return err


def edit(out, change) -> None:
    path = os.path.join(out, "manifest.json")
    with open(path) as fh:
        m = json.load(fh)
    m = change(m)
    with open(path, "w") as fh:
        json.dump(m, fh)


def _set(path, value):
    def change(m):
        node = m
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        return m
    return change


@pytest.mark.parametrize("change, said", [
    (lambda m: [1, 2, 3], "a JSON list, not an object"),
    (lambda m: {k: v for k, v in m.items() if k != "splits"}, "no splits object"),
    (_set(["tokenizer"], None), "no tokenizer object"),
    (_set(["tokenizer", "vocab_size"], "300"), "tokenizer.vocab_size is '300'"),
    (_set(["splits", "train", "shards", 0, "bytes"], "lots"), "splits.train.shards[0].bytes is 'lots'"),
    (_set(["splits", "train", "shards", 0, "file"], "../../../etc/passwd"), "is not a path inside OUT"),
    (_set(["splits", "val", "shards", 0, "file"], "/etc/passwd"), "is not a path inside OUT"),
    (_set(["splits", "val", "shards"], {"a": 1}), "splits.val has no list of shards"),
])
def test_a_manifest_that_is_no_manifest_is_one_line(tmp_path, capsys, change, said):
    out = make_out(tmp_path / "out")
    assert manifest_problem(json.load(open(os.path.join(out, "manifest.json")))) is None
    edit(out, change)
    assert main(["inspect", out]) == 2
    assert said in one_error_line(capsys)


def test_inspect_refuses_negative_docs_and_notes_unlisted_shards(tmp_path, capsys):
    out = make_out(tmp_path / "out")
    assert main(["inspect", out, "--docs", "-1"]) == 2
    line = one_error_line(capsys)
    assert "--docs" in line and "'-1'" in line
    extra = os.path.join(out, "shards", "train-00009-of-00009.arrow")
    with open(os.path.join(out, "shards", "train-00000-of-00002.arrow"), "rb") as src, open(extra, "wb") as dst:
        dst.write(src.read())
    assert inspect_output(out, n_docs=0, console=Console(width=400)) == 0  # the manifest's shards are whole: not a failure ...
    said = capsys.readouterr().out
    assert "train-00009-of-00009.arrow: not in the manifest" in said  # ... but the stray file is named


@pytest.mark.parametrize("item", ["optim.lr=.inf", "model.rope_theta=.inf", "optim.lr=.nan",
                                  "data.weights=[.inf]", "metrics.peak_flops=1e400"])
def test_trainer_floats_must_be_finite(tmp_path, capsys, item):
    out = make_out(tmp_path / "out")
    assert main(["train", "--data", out, "--run", str(tmp_path / "run"), "--set", item]) == 2
    assert "finite number" in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_empty_output_and_a_foreign_report_are_one_line(tmp_path, capsys):
    from tokenmill.cli import main

    assert main(["prepare", "--output", ""]) == 2
    assert capsys.readouterr().err.strip() == "tokenmill: error: --output: an empty path"
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.json").write_text("[1, 2]")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no report `tokenmill prepare` wrote" in err


GOOD_REPORT = {"documents": {"read": 10, "kept": 4, "dropped": 6}, "chars_kept": 900,
               "funnel": [{"stage": "read", "in": 10, "dropped": 0, "out": 10, "reasons": {}},
                          {"stage": "quality", "in": 10, "dropped": 6, "out": 4, "reasons": {"gopher_min_words": 6}}],
               "languages": {"en": 4}, "tokens_kept": 120, "pii_redactions": {"email": 1},
               "dedup": {"clusters": 1, "removed_exact": 0, "removed_near": 1}, "other": [1, "x"]}


@pytest.mark.parametrize("path,value,field", [
    (("documents", "read"), "10", "documents.read"),
    (("documents", "kept"), -1, "documents.kept"),
    (("documents", "dropped"), 2**70, "documents.dropped"),
    (("funnel", 1, "in"), True, "funnel.1.in"),
    (("funnel", 1, "reasons", "gopher_min_words"), 1.5, "funnel.1.reasons.gopher_min_words"),
    (("languages",), ["en"], "languages"),
    (("dedup", "clusters"), None, "dedup.clusters"),
    (("tokens_kept",), "many", "tokens_kept"),
])
def test_a_report_json_read_back_is_checked_field_by_field(tmp_path, capsys, path, value, field):
    """`tokenmill report` on a received OUT whose report.json lies about a count: one line naming
    the file and the field (each of these was a traceback from print_summary's formatting)."""
    import copy
    import json

    from tokenmill.cli import main

    (tmp_path / "report").mkdir()
    report = tmp_path / "report" / "report.json"
    report.write_text(json.dumps(GOOD_REPORT))
    assert main(["report", str(tmp_path)]) == 0
    assert "10 documents read" in capsys.readouterr().out
    bad = copy.deepcopy(GOOD_REPORT)
    node = bad
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    report.write_text(json.dumps(bad))
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"report.json: {field}:" in err, err

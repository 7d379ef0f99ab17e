"""`tokenmill compare` end to end: two tiny outputs from the bundled sample (rules on, rules
off), real training runs through the trainer, compare.json with every field, a page that
renders in headless Chromium without console errors, resuming, and one-line errors."""

import json

import pytest

torch = pytest.importorskip("torch")

from conftest import needs_chromium, render_in_chromium  # noqa: E402

pytestmark = pytest.mark.slow  # trains several proxy models

from tokenmill.cli import main  # noqa: E402

SETS = ["data.seq_len=64", "train.micro_batch=4", "data.num_workers=0", "metrics.tensorboard=false",
        "train.log_every=4", "model.preset=null", "model.n_layers=1", "model.d_model=32", "model.n_heads=2"]


def compare_args(outs, eval_path, output, tokens=3000, seeds=2) -> list[str]:
    return ["compare", *map(str, outs), "--eval", str(eval_path), "--tokens", str(tokens), "--seeds", str(seeds),
            "--output", str(output), *(a for s in SETS for a in ("--set", s))]


@pytest.fixture(scope="module")
def arms(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    outs = [root / "rules", root / "no-rules"]
    for out, extra in zip(outs, ([], ["--set", "quality.enabled=false"])):
        assert main(["prepare", "--output", str(out), "--set", "tokenize.vocab_size=600", *extra]) == 0
    eval_path = root / "eval.jsonl"
    eval_path.write_text("".join(json.dumps({"text": t}) + "\n" for t in [
        "A short evaluation document about tokenizers and training data.",
        "Ein zweites Dokument mit Umlauten: größer, Übung, Maß.",
        "Third document, with numbers 1 2 3 and punctuation!"]))
    output = root / "cmp"
    assert main(compare_args(outs, eval_path, output)) == 0
    return outs, eval_path, output


def test_compare_json_has_every_field(arms):
    outs, _, output = arms
    r = json.loads((output / "compare.json").read_text())
    assert r["seeds"] == [0, 1] and r["eval"]["docs"] == 3 and r["eval"]["bytes"] > 100
    assert r["tokens_per_arm"] >= 3000 and r["tokens_per_arm"] == r["steps"] * r["batch_tokens"]
    assert [a["name"] for a in r["arms"]] == ["rules", "no-rules"]
    for a in r["arms"]:
        assert a["train_tokens"] == r["tokens_per_arm"]  # the same budget for every arm
        assert a["tokenizer"]["vocab_size"] > 0 and a["corpus_tokens"] > 0
        assert [run["seed"] for run in a["runs"]] == [0, 1]
        for run in a["runs"]:
            assert len(run["curve"]) == r["steps"] and run["final_loss"] == run["curve"][-1][1]
            assert 0 < run["eval_bpb"] < 20 and set(run["val_bpb"]) == {"rules", "no-rules"}
        b = a["eval_bpb"]
        assert b["min"] <= b["mean"] <= b["max"] and b["n"] == 2 and b["std"] is not None
        assert a["report"]["funnel"] and a["report"]["top_drops"] is not None
    assert len(r["verdicts"]) == 1 and r["verdicts"][0]["exceeds_spread"] in (True, False)
    m = r["val_matrix"]
    assert m["models"] == m["val_splits"] == ["rules", "no-rules"] and all(len(row) == 2 for row in m["bpb"])
    # the two seeds are different trainings
    runs = r["arms"][0]["runs"]
    assert runs[0]["curve"] != runs[1]["curve"]


def test_compare_resumes_finished_runs(arms, capsys):
    outs, eval_path, output = arms
    hf = output / "runs" / "rules-seed0" / "hf" / "model.safetensors"
    before = hf.stat().st_mtime_ns
    assert main(compare_args(outs, eval_path, output)) == 0
    err = capsys.readouterr().err
    assert err.count("already done") == 4 and hf.stat().st_mtime_ns == before


@needs_chromium
def test_compare_page_renders_in_headless_chromium(arms, tmp_path):
    page = arms[2] / "compare.html"
    dom = render_in_chromium(page, tmp_path, height=1800)
    assert dom.count("<polyline") == 4 and dom.count("<svg") >= 3 and "Bits per byte" in dom
    assert "<script" not in page.read_text() and "http" not in page.read_text().split("</style>")[0]


@pytest.mark.parametrize("case, needle", [
    ("one", "at least two prepared outputs"),
    ("no_eval", "--eval"),
    ("bad_set", "training rules seed 0"),
    ("output_is_a_file", "--output"),
])
def test_compare_errors_are_one_line(arms, tmp_path, capsys, case, needle):
    outs, eval_path, _ = arms
    args = compare_args(outs, eval_path, tmp_path / "c", tokens=500, seeds=1)
    if case == "one":
        args = compare_args(outs[:1], eval_path, tmp_path / "c")
    elif case == "no_eval":
        args = compare_args(outs, tmp_path / "missing.jsonl", tmp_path / "c")
    elif case == "output_is_a_file":  # was a 17-line traceback, after the arms had trained
        (tmp_path / "c").write_text("not a folder")
        args = compare_args(outs, eval_path, tmp_path / "c")
    else:
        args += ["--set", "train.micro_batch=10000000"]  # valid config, refused by the trainer (memory)
    assert main(args) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tokenmill: error:")]
    assert len(lines) == 1 and needle in lines[0], lines

"""The report: exact counts from the combiner, and the page as a person sees it (headless Chromium)."""

import json
import re

import pytest
from conftest import needs_chromium, render_in_chromium, run_prepare

from tokenmill.transforms.report import add_doc, finish, funnel, merge, new_acc


def test_counts_merge_and_funnel():
    docs = [{"id": f"d{i}", "text": "x" * i, "lang": "en", "dropped_by": None, "n_words": i} for i in range(5)]
    docs += [{"id": "q", "text": "short", "dropped_by": "quality:gopher_min_words", "n_words": 1},
             {"id": "r", "text": None, "dropped_by": "read:invalid_json"}]
    a, b = new_acc(), new_acc()
    for i, d in enumerate(docs):
        add_doc(a if i % 2 else b, d, n_samples=2)
    acc = merge([a, b], 2)
    rep = finish(acc, ["read", "extract", "quality"])
    assert rep["documents"] == {"read": 7, "kept": 5, "dropped": 2}
    assert rep["languages"] == {"en": 5} and rep["chars_kept"] == 10
    assert [f["out"] for f in rep["funnel"]] == [6, 6, 5]
    assert sum(rep["histograms"]["n_words"]["kept"]) == 5 and sum(rep["histograms"]["n_words"]["dropped"]) == 1
    assert funnel({"dedup:near_duplicate": 1}, 3, ["read"])[-1] == {
        "stage": "dedup", "in": 3, "dropped": 1, "out": 2, "reasons": {"near_duplicate": 1}}


@pytest.fixture(scope="module")
def sample_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "out"
    # With a URL block list and an evaluation file, so their reasons and section show too.
    (out.parent / "block.txt").write_text("harbourtimes.example\n")
    (out.parent / "eval.txt").write_text("When we brought home three hens two springs ago, I assumed the hard part\n")
    rc, rows, report = run_prepare(out, [], sets=["tokenize.vocab_size=1000", f"url.block_files=[{out.parent / 'block.txt'}]",
                                                  f"decontaminate.files=[{out.parent / 'eval.txt'}]"])
    assert rc == 0
    return out, rows, report


def test_report_json_and_samples(sample_out):
    out, rows, report = sample_out
    assert report["documents"]["read"] == len(rows)
    for reason, n in report["samples"].items():
        lines = (out / "report" / "samples" / (reason.replace(":", "-") + ".jsonl")).read_text().splitlines()
        assert len(lines) == n and all(json.loads(x)["id"] for x in lines)
    q = [r for r in report["samples"] if r.startswith("quality:")]
    assert q, "the sample corpus has junk that quality filters drop"
    first = json.loads((out / "report" / "samples" / (q[0].replace(":", "-") + ".jsonl")).read_text().splitlines()[0])
    assert "n_words" in first["signals"]  # the values that made the filter fire
    assert report["dedup"]["removed_exact"] >= 1 and report["pii_redactions"]["email"] >= 1
    metrics = {m["metric"].split(" (")[0]: m for m in report["corpus_metrics"]}
    assert set(metrics) == {"duplicate-text ratio", "tokenizer vocabulary coverage", "character entropy",
                            "token fertility"}
    assert metrics["duplicate-text ratio"]["value"] == 0.0  # dedup ran: no exact duplicate survives
    assert metrics["tokenizer vocabulary coverage"]["value"] == 1.0  # byte-level BPE has no <unk>


def test_report_page_is_self_contained(sample_out):
    page = (sample_out[0] / "report" / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # no CDN, works offline
    for section in ("funnel", "reasons", "languages", "signals", "metrics", "pii", "decontamination", "dedup",
                    "samples"):
        assert f'id="{section}"' in page


def test_terminal_summary(sample_out, capsys):
    from tokenmill.cli import main

    assert main(["report", str(sample_out[0])]) == 0
    text = capsys.readouterr().out
    assert "Funnel" in text and "report.html" in text


@needs_chromium
def test_report_renders_in_headless_chromium(sample_out, tmp_path):
    dom = render_in_chromium(sample_out[0] / "report" / "report.html", tmp_path)
    assert dom.count("<svg") >= 5 and "Funnel" in dom
    assert "Evaluation overlap" in dom and "eval.txt" in dom and "blocked" in dom and "overlap" in dom


def test_duplicate_text_ratio_across_merged_accumulators(monkeypatch):
    from tokenmill.transforms import report

    def acc_of(texts):
        acc = new_acc()
        for i, t in enumerate(texts):
            add_doc(acc, {"id": str(i), "text": t}, 0)
        return acc

    merged = merge([acc_of(["A b", "c"]), acc_of(["a   B", "d"])], 0)  # "A b" = "a   B" once normalised
    assert len(merged["text_hashes"]) == 4 * report.HASH_BYTES
    ratio = next(m for m in finish(merged, [])["corpus_metrics"] if m["metric"].startswith("duplicate-text"))
    assert ratio["value"] == 0.25 and not ratio["ok"]
    monkeypatch.setattr(report, "MAX_HASHES", 3)  # past the cap the metric is left out, not wrong
    merged = merge([acc_of(["A b", "c"]), acc_of(["a   B", "d"])], 0)
    assert merged["text_hashes"] is None
    assert not any(m["metric"].startswith("duplicate-text") for m in finish(merged, [])["corpus_metrics"])

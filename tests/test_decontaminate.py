"""Decontamination against evaluation items: the n-gram core (normalisation, short items, file
masks, cutting) and a real prepare run that drops or cuts the documents holding an item taken
from the bundled sample, with the report's per-file counts."""

import json

import pytest
from conftest import run_prepare

from tokenmill.config import DecontaminateConfig
from tokenmill.transforms.decontaminate import EvalGrams, cut, decontaminate, load

SAMPLE = __import__("pathlib").Path(__file__).parent.parent / "tokenmill" / "sample"
ITEM = "The quick brown fox jumps over the lazy dog while 3 cats watch from the old stone wall"


def grams(**files) -> EvalGrams:
    return EvalGrams.build(list(files.items()), 13, 8)


def test_thirteen_grams_survive_case_punctuation_and_digits():
    g = grams(mmlu=[ITEM], other=["something else entirely that is long enough to count here"])
    doc = {"text": "Intro. THE QUICK, brown fox -- jumps over the lazy dog; while 7 cats watch from... more"}
    out = decontaminate(dict(doc), g, "drop")
    assert out["dropped_by"] == "decontaminate:overlap" and out["decontaminated"] == ["mmlu"]
    twelve = {"text": "the quick brown fox jumps over the lazy dog while 3 cats"}  # 12 words: no 13-gram
    assert "dropped_by" not in decontaminate(dict(twelve), g, "drop")
    assert g.items == [1, 1]


def test_short_items_match_whole_and_masks_name_every_file():
    g = grams(a=["what is the capital city of france today"], b=["What is the capital city of France, today?"],
              c=["too short to count"])
    assert g.items == [1, 1, 0]
    hit = decontaminate({"text": "Quiz: what is the capital city of France today? Paris."}, g, "drop")
    assert hit["decontaminated"] == ["a", "b"]
    assert "dropped_by" not in decontaminate({"text": "what is the capital city of spain today"}, g, "drop")


def test_cut_removes_only_the_overlapping_words():
    g = grams(e=[ITEM])
    text = f"Before the item. {ITEM}. After the item, the text goes on."
    out = decontaminate({"text": text}, g, "cut")
    assert "dropped_by" not in out and out["decontaminated"] == ["e"]
    assert out["text"] == "Before the item.  . After the item, the text goes on."
    only = decontaminate({"text": ITEM}, g, "cut")
    assert only["dropped_by"] == "decontaminate:overlap"  # nothing left
    assert cut("a b c", [(0, 1), (2, 3), (4, 5)], [(0, 2), (1, 3)]) == " "


@pytest.mark.slow
def test_prepare_drops_or_cuts_documents_holding_an_eval_item(tmp_path):
    line = next(x for x in (SAMPLE / "docs.jsonl").read_text().splitlines() if '"doc-en-001"' in x)
    target = json.loads(line)  # (the sample also holds broken records, on purpose)
    sentence = target["text"].split("\n\n")[1].split(". ")[0]  # a sentence of 19 words
    assert len(sentence.split()) >= 15
    evals = tmp_path / "eval.jsonl"
    evals.write_text(json.dumps({"question": sentence.upper(), "answer": "B"}) + "\n"
                     + json.dumps({"question": "an item no document of the sample holds at all, not even in part"}) + "\n")
    text_file = tmp_path / "other.txt"
    text_file.write_text("a line of an evaluation set that nothing matches in the sample docs either\n")
    cfg = DecontaminateConfig(files=[str(evals), str(text_file)])
    assert load(cfg).items == [2, 1]
    for mode in ("drop", "cut"):
        out = tmp_path / mode
        rc, rows, report = run_prepare(out, [SAMPLE / "docs.jsonl"],
                                       [f"decontaminate.files=[{evals}, {text_file}]", f"decontaminate.mode={mode}"])
        assert rc == 0
        row = next(r for r in rows if r["id"] == "doc-en-001")
        assert row["decontaminated"] == ["eval.jsonl"]
        assert [r["id"] for r in rows if r["decontaminated"]] == ["doc-en-001"]
        assert report["decontamination"] == {"eval.jsonl": 1}
        if mode == "drop":
            assert row["dropped_by"] == "decontaminate:overlap" and report["dropped_by"]["decontaminate:overlap"] == 1
        else:
            assert row["dropped_by"] is None and sentence not in row["text"] and len(row["text"]) > 200

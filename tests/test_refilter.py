"""Tag now, filter later: quality.mode=tag keeps every document with its decision, and
`tokenmill refilter` then writes exactly what `prepare` writes with the new settings (docs
Parquet bytes, shard bytes, report), without reading the inputs again."""

import json
import os

import pyarrow.parquet as pq
import pytest
from conftest import run_prepare

from tokenmill.cli import main

SETTINGS = [
    ["quality.gopher.min_words=80"],
    ["quality.per_lang.de.gopher.min_words=200", "dedup.ngram=3", "tokenize.vocab_size=600"],
]


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    out = tmp_path_factory.mktemp("tag") / "out"
    rc, rows, report = run_prepare(out, [], ["quality.mode=tag"])
    assert rc == 0
    return out, rows, report


def _same_output(a, b):
    assert sorted(os.listdir(a / "docs")) == sorted(os.listdir(b / "docs"))
    for f in os.listdir(a / "docs"):
        assert (a / "docs" / f).read_bytes() == (b / "docs" / f).read_bytes(), f
    ma, mb = json.loads((a / "manifest.json").read_text()), json.loads((b / "manifest.json").read_text())
    assert ma["splits"] == mb["splits"] and ma["tokenizer"] == mb["tokenizer"]  # shard sha256s included
    ra, rb = json.loads((a / "report" / "report.json").read_text()), json.loads((b / "report" / "report.json").read_text())
    ra["config"].pop("output"), rb["config"].pop("output")
    assert ra == rb


def test_tag_mode_drops_nothing_and_keeps_the_decision(tagged):
    out, rows, report = tagged
    assert not any((r["dropped_by"] or "").startswith("quality:") for r in rows)
    flagged = [r for r in rows if r["quality_flag"]]
    assert flagged and all(r["quality_flag"].startswith("quality:") for r in flagged)
    assert all(len(r["minhash"]) == 14 * 8 * 4 for r in rows if r["dropped_by"] is None)


@pytest.mark.parametrize("sets", SETTINGS, ids=["min_words", "per_lang+ngram+vocab"])
@pytest.mark.slow
def test_refilter_writes_what_prepare_writes(tagged, tmp_path, sets):
    src = tagged[0]
    args = [a for s in sets for a in ("--set", s)]
    assert main(["refilter", str(src), "--output", str(tmp_path / "refiltered")] + args) == 0
    rc, _, _ = run_prepare(tmp_path / "direct", [], sets)
    assert rc == 0
    _same_output(tmp_path / "refiltered", tmp_path / "direct")


@pytest.mark.slow
def test_refilter_of_a_filtered_output_brings_documents_back(tmp_path):
    rc, rows, _ = run_prepare(tmp_path / "strict", [], ["quality.gopher.min_words=120"])
    assert rc == 0 and any(r["dropped_by"] == "quality:gopher_min_words" for r in rows)
    assert main(["refilter", str(tmp_path / "strict"), "--output", str(tmp_path / "loose"),
                 "--set", "quality.gopher.min_words=50"]) == 0
    run_prepare(tmp_path / "direct", [])
    _same_output(tmp_path / "loose", tmp_path / "direct")
    kept = [r for f in (tmp_path / "loose" / "docs").glob("kept-*.parquet") for r in pq.read_table(f).to_pylist()]
    assert len(kept) > sum(r["dropped_by"] is None for r in rows)


def test_what_cannot_be_redone_is_one_line(tagged, tmp_path, capsys):
    src = tagged[0]
    for args, words in ((["--set", "extract.include_title=true"], "extract settings differ"),
                        (["--set", "language.max_chars=100"], "language labels come from"),
                        ([], "another folder")):
        output = str(src) if not args else str(tmp_path / "x")
        assert main(["refilter", str(src), "--output", output] + args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert main(["refilter", str(tmp_path), "--output", str(tmp_path / "y")]) == 2
    assert "not a prepared output" in capsys.readouterr().err


def test_settings_that_change_signals_or_texts_are_refused(tagged, tmp_path, capsys):
    src = tagged[0]
    for sets, words in ((["quality.fineweb_short_line_chars=10"], "change the stored signals"),
                        (["quality.per_lang.de.stop_words={de: [und]}"], "change the stored signals"),
                        (["quality.compat=datatrove"], "change the stored signals"),
                        (["quality.c4.remove_lines=true"], "change the stored signals"),
                        (["quality.per_lang.fr.c4.min_words_per_line=2"], "change the stored signals"),
                        (["language.enabled=false"], "language labels come from")):
        assert main(["refilter", str(src), "--output", str(tmp_path / "x")] + [a for s in sets for a in ("--set", s)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_refilter_with_the_report_off_publishes_and_succeeds(tagged, tmp_path, capsys):
    src, out = tagged[0], tmp_path / "noreport"
    capsys.readouterr()
    assert main(["refilter", str(src), "--output", str(out), "--set", "report.enabled=false"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "report disabled" in captured.out
    assert (out / "manifest.json").exists() and not (out / "report" / "report.json").exists()


_EN = ("The harbour town wakes early. Fishing boats return before dawn, and the market opens as soon as "
       "the first crates are carried up the slipway. Visitors who arrive by the morning train can walk "
       "along the old sea wall, watch the gulls argue over scraps and buy bread from the bakery that has "
       "stood on the corner of the square for more than a century. In the afternoon the tide goes out, "
       "the sand flats shine in the low light, and families dig for cockles while the cafes fill up. ")
_DE = ("Der Wanderweg beginnt am Bahnhof und führt durch einen dichten Wald hinauf zu einer alten Burg. "
       "Unterwegs kommt man an mehreren Bauernhöfen vorbei, auf denen im Sommer frische Milch und Käse "
       "verkauft werden. Oben angekommen hat man bei klarem Wetter einen weiten Blick über das ganze Tal "
       "bis zu den Bergen im Süden. Für die Strecke sollte man etwa vier Stunden einplanen und genug "
       "Wasser mitnehmen, denn eine Hütte gibt es erst kurz vor dem Gipfel. ")


@pytest.mark.slow
@pytest.mark.parametrize("with_pii", [True, False], ids=["pii", "no_pii"])
def test_a_looser_language_setting_refilters_as_prepare_does_or_is_refused(tmp_path, capsys, with_pii):
    """A document the language setting dropped got no quality signals, and PII redaction changed
    its stored text since: prepare with a looser setting computes its signals on the text before
    redaction, which refilter no longer has. Refilter writes prepare's output, or refuses in one
    line; it refuses only where the text was changed (without PII found, the stored text is it)."""
    contact = " Fragen zur Tour beantwortet Hans Becker unter hans.becker@example.de gerne." if with_pii else ""
    rows = [{"id": f"en-{i}", "text": f"{_EN}This is story number {i} of the harbour."} for i in range(3)]
    rows += [{"id": f"de-{i}", "text": f"{_DE}Das ist die Etappe {i}.{contact}"} for i in range(2)]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    small = ["tokenize.vocab_size=300", "dedup.enabled=false"]
    rc, stored, _ = run_prepare(tmp_path / "en", [data], ["language.keep=[en]", *small])
    assert rc == 0 and sum(r["dropped_by"] == "language:not_in_keep" for r in stored) == 2
    assert any(r["pii"] and r["pii"]["email"] for r in stored) == with_pii
    capsys.readouterr()
    rc = main(["refilter", str(tmp_path / "en"), "--output", str(tmp_path / "refiltered"),
               "--set", "language.keep=[en, de]"])
    if rc != 0:
        err = capsys.readouterr().err.strip().splitlines()
        assert with_pii and rc == 2 and len(err) == 1 and "run prepare with these settings" in err[0], err
        return
    rc, direct, _ = run_prepare(tmp_path / "direct", [data], ["language.keep=[en, de]", *small])
    assert rc == 0 and {r["id"] for r in direct if not r["dropped_by"]} >= {"de-0", "de-1"}
    _same_output(tmp_path / "refiltered", tmp_path / "direct")

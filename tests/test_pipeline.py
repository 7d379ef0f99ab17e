"""End-to-end `tokenmill prepare` on the DirectRunner: the bundled sample and every bad input."""

import gzip
import json
import shutil

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import by_id, run_prepare, shared

from tokenmill.config import load_config
from tokenmill.errors import UserError
from tokenmill.pipelines import output, prepare
from tokenmill.pipelines.inspect_output import inspect_output
from tokenmill.transforms.doc import docs_schema

STAGE_REASON = r"^(read|extract|normalize|language|quality|dedup):[a-z0-9_]+$"


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sample") / "out"
    return run_prepare(out, []) + (out,)


def test_sample_run_accounts_for_every_record(sample_run):
    rc, rows, report, out = sample_run
    assert rc == 0
    assert len(rows) == report["documents"]["read"] > 40
    kept = [r for r in rows if r["dropped_by"] is None]
    assert len(kept) == report["documents"]["kept"] > 25
    assert sum(report["dropped_by"].values()) == len(rows) - len(kept)
    for r in rows:
        assert r["dropped_by"] is None or __import__("re").match(STAGE_REASON, r["dropped_by"]), r["dropped_by"]
    funnel = report["funnel"]
    assert [f["stage"] for f in funnel] == ["read", "extract", "normalize", "language", "quality", "pii", "dedup", "tokenize"]
    assert all(a["out"] == b["in"] for a, b in zip(funnel, funnel[1:]))
    assert funnel[-1]["out"] == len(kept)
    # The cleaned-docs Parquet has exactly the documented columns.
    table = pq.read_table(sorted((out / "docs").glob("*.parquet"))[0])
    fields = [f for _, _, fs in prepare.clean_steps(load_config()) for f in fs]
    assert table.schema.names == docs_schema(fields + [pa.field("n_tokens", pa.int32())]).names
    assert "pii" in table.schema.names and "quality_score" in table.schema.names


def test_sample_languages_and_text(sample_run):
    _, rows, report, _ = sample_run
    kept = [r for r in rows if r["dropped_by"] is None]
    langs = {r["lang"] for r in kept}
    assert {"en", "de", "fr", "es", "ja", "zh", "ru"} <= langs
    assert all(r["text"] and r["lang_score"] > 0 for r in kept)
    assert all(r["source"] and r["id"] for r in rows)
    assert set(report["languages"]) == langs
    # HTML pages lose their boilerplate; mojibake and curly quotes are repaired.
    for r in kept:
        assert "<script" not in r["text"] and "\u201c" not in r["text"] and "Ã©" not in r["text"]


def test_sample_bad_records_counted(sample_run):
    _, rows, report, out = sample_run
    reasons = report["dropped_by"]
    assert reasons.get("read:invalid_json", 0) >= 1 and reasons.get("read:not_an_object", 0) >= 1
    samples = out / "report" / "samples" / "read-invalid_json.jsonl"
    assert samples.exists() and json.loads(samples.read_text().splitlines()[0])["id"]


first_lines = (json.dumps({"id": "good-en", "text": "A perfectly ordinary paragraph about the weather in spring."})
               + "\n" + '{"id": "broken", "text": "unterminated\n')


def _bad_inputs(d, warc_src):
    (d / "good.jsonl").write_text(first_lines + json.dumps({"id": "huge", "text": "x" * (50 * 1024 * 1024)}) + "\n")
    (d / "latin1.txt").write_bytes("Un texte français écrit en Latin-1.".encode("latin-1"))
    (d / "junk.html").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 200)
    page = b"<html><body><article><p>" + b"Some words for the page. " * 200 + b"</p></article></body></html>"
    gz = gzip.compress(page)
    (d / "cut.html.gz").write_bytes(gz[: len(gz) // 2])
    (d / "empty.jsonl").write_bytes(b"")
    (d / "deep.html").write_bytes(b"<html><body>" + b"<div>" * 100_000 + b"deep text" + b"</div>" * 100_000
                                  + b"</body></html>")
    (d / "fine.html").write_text("<html><head><title>t</title></head><body><nav><a href=/>Home</a></nav>"
                                 "<article><h1>Garden notes</h1><p>" + "Tomatoes need sun and water every day. " * 20
                                 + "</p></article><footer>Copyright 2024</footer></body></html>")
    shutil.copy(warc_src, d / "clipped.warc.gz")


def test_bad_inputs_are_counted_and_the_job_completes(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    try:
        warc = shared("warc", "resiliparse", "clipped.warc.gz")
    except pytest.skip.Exception:
        warc = None
    if warc is None:  # make our own clipped WARC when the shared one is absent
        from test_readers import _warc

        _warc(tmp_path / "w.warc.gz", [("http://a/", "text/html", "200 OK", b"<p>" + b"word " * 5000 + b"</p>")])
        data = (tmp_path / "w.warc.gz").read_bytes()
        (tmp_path / "w.warc.gz").write_bytes(data[: len(data) // 2])
        warc = tmp_path / "w.warc.gz"
    _bad_inputs(src, warc)
    rc, rows, report = run_prepare(tmp_path / "out", [src], sets=["quality.enabled=false"])
    assert rc == 0
    docs = by_id(rows)
    assert docs["good-en"]["dropped_by"] is None and docs["good-en"]["lang"] == "en"
    assert docs["fine.html"]["dropped_by"] is None and "Tomatoes need sun" in docs["fine.html"]["text"]
    assert "Home" not in docs["fine.html"]["text"] and "Copyright" not in docs["fine.html"]["text"]
    # Too large to parse: its id is the file and byte offset of the line.
    assert [r["id"] for r in rows if r["dropped_by"] == "read:too_large"] == [f"good.jsonl:{len(first_lines)}"]
    assert docs["latin1.txt"]["dropped_by"] == "read:invalid_utf8"
    assert docs["junk.html"]["dropped_by"] == "extract:binary_content"
    assert docs["cut.html.gz"]["dropped_by"] == "read:truncated_file"
    assert docs["empty.jsonl"]["dropped_by"] == "read:empty_file"
    assert docs["deep.html"]["dropped_by"] in (None, "extract:no_text", "extract:parse_error", "extract:timeout")
    assert any(r["dropped_by"] == "read:invalid_json" for r in rows)
    assert any(r["source"].endswith("clipped.warc.gz") and r["dropped_by"] in ("read:truncated_file",
               "read:corrupt_file") for r in rows)
    assert report["documents"]["read"] == len(rows)


def test_missing_input_is_one_clear_line(tmp_path, capsys):
    rc, rows, _ = run_prepare(tmp_path / "out", [tmp_path / "does-not-exist"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and rows == []
    assert err.count("\n") == 0 and "input not found" in err and "does-not-exist" in err


def test_unwritable_output_is_one_clear_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    rc, rows, _ = run_prepare(blocker / "out", [])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and rows == []
    assert err.count("\n") == 0 and "cannot write" in err and "a-file" in err


def test_bad_config_value_is_one_clear_line(tmp_path, capsys):
    rc, _, _ = run_prepare(tmp_path / "out", [], sets=["language.threshold=lots"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("tokenmill: error: bad config: language.threshold") and "\n" not in err


def test_keep_list_filters_and_beam_flags_pass_through(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps({"id": i, "text": t}) for i, t in [
        ("en", "The library opens at nine and closes at five on weekdays."),
        ("de", "Die Bibliothek öffnet um neun Uhr und schließt um fünf."),
        ("fr", "La bibliothèque ouvre à neuf heures et ferme à dix-sept heures."),
    ]) + "\n")
    rc, rows, report = run_prepare(tmp_path / "out", [src], sets=["language.keep=[en,de]", "quality.enabled=false"],
                                   extra=["--direct_num_workers=1"])
    assert rc == 0
    docs = by_id(rows)
    assert docs["en"]["dropped_by"] is None and docs["de"]["dropped_by"] is None
    assert docs["fr"]["dropped_by"] == "language:not_in_keep" and docs["fr"]["lang"] == "fr"
    assert report["dropped_by"] == {"language:not_in_keep": 1}


def _run_graph(tmp_path):
    """prepare's graph run on a line of text and a broken line; the runner's result."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "Hello there, a short English line of text."}\n{"broken\n')
    cfg = load_config(overrides=[f"output={tmp_path / 'out'}"])
    cfg.inputs = [str(src)]
    p = beam.Pipeline()
    prepare.build(p, cfg, prepare.check_job(cfg), cfg.output)
    result = p.run()
    result.wait_until_finish()
    output.discard(str(tmp_path / "out" / ".tmp"))  # what run() does after the graph
    return result


def test_beam_metrics_count_stages_and_reasons(tmp_path):
    result = _run_graph(tmp_path)
    counters = {c.key.metric.name: c.committed for c in result.metrics().query()["counters"]}
    assert counters["read.records"] == 2
    assert counters["dropped.read:invalid_json"] == 1
    assert counters["language.in"] == 1 and counters["language.out"] == 1


def test_records_read_that_did_not_reach_the_report_are_one_line(tmp_path):
    """The launcher checks the runner's own count of the records read against the report before
    publishing: a runner that calls a job done after a step failed (Prism 2.65 did) is one line."""
    result = _run_graph(tmp_path)
    report = tmp_path / "out" / "report" / "report.json"
    prepare.check_accounted(result, str(report), "OUT")  # 2 read, 2 in the report
    lost = json.loads(report.read_text())
    lost["documents"]["read"] -= 1
    (tmp_path / "lost.json").write_text(json.dumps(lost))
    with pytest.raises(UserError, match="^the runner called the job done, but 1 of the 2 records read never "
                                        "reached the report .*; the previous output in OUT is untouched$"):
        prepare.check_accounted(result, str(tmp_path / "lost.json"), "OUT")


def test_a_rerun_replaces_only_its_own_files(tmp_path):
    """OUT may be a folder that holds the user's own files (a project's docs/): a run replaces
    what tokenmill wrote there and nothing else, and leaves no stage folder behind."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "The library opens at nine and closes at five on weekdays."}) + "\n")
    out = tmp_path / "out"
    (out / "docs").mkdir(parents=True)
    (out / "docs" / "index.md").write_text("mine")
    (out / "shards").mkdir()
    (out / "shards" / "notes.bin").write_bytes(b"mine")
    for _ in range(2):
        rc, rows, _ = run_prepare(out, [src], sets=["quality.enabled=false", "tokenize.vocab_size=300"])
        assert rc == 0 and [r["id"] for r in rows] == ["a"]
    assert (out / "docs" / "index.md").read_text() == "mine" and (out / "shards" / "notes.bin").read_bytes() == b"mine"
    assert not [p for p in out.iterdir() if p.name.startswith((".tokenmill-stage-", ".tokenmill-old-"))]


def test_a_publish_cut_short_is_finished_by_the_next_run(tmp_path):
    """A run killed while it moved its files into OUT: the next run finishes that publish before
    it starts, so OUT is never left half old, half new (here the next run then fails early)."""
    from tokenmill.pipelines import output

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "The library opens at nine and closes at five on weekdays."}) + "\n")
    out = tmp_path / "out"
    assert run_prepare(out, [src], sets=["quality.enabled=false", "tokenize.vocab_size=300"])[0] == 0
    first = (out / "manifest.json").read_bytes()
    # A second, successful run whose publish died after the old files went out (SIGKILL).
    stage = out / (output.STAGE_PREFIX + "cut")
    shutil.copytree(out, stage, ignore=shutil.ignore_patterns(".tokenmill*"))
    (stage / output.COMPLETE).write_text("")
    old = out / (output.OLD_PREFIX + "cut")
    old.mkdir()
    (out / "manifest.json").rename(old / "manifest.json")
    output.remove_leftovers(str(out))
    assert (out / "manifest.json").read_bytes() == first and inspect_output(str(out)) == 0
    assert not [p for p in out.iterdir() if p.name.startswith((output.STAGE_PREFIX, output.OLD_PREFIX))]


def test_rehydrated_survivors_repeat_in_the_shards(tmp_path):
    """dedup.keep=rehydrate: a cluster's survivor goes into its shard as many times as its
    cluster's size step says; every other document once; the manifest says so."""
    out = tmp_path / "out"
    rc, rows, _ = run_prepare(out, [], ["dedup.keep=rehydrate", "dedup.repeats={2: 3}"])
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["duplicates"] == {"keep": "rehydrate", "repeats": {"2": 3}}
    ids = [i for split in manifest["splits"].values() for s in split["shards"]
           for i in pa.ipc.open_file(pa.memory_map(str(out / s["file"]))).read_all().column("id").to_pylist()]
    kept = [r for r in rows if r["dropped_by"] is None]
    clustered = [r for r in kept if (r["dup_cluster_size"] or 1) >= 2]
    assert clustered, "the sample has duplicate clusters"
    assert all(ids.count(r["id"]) == (3 if (r["dup_cluster_size"] or 1) >= 2 else 1) for r in kept)
    assert len(ids) == len(kept) + 2 * len(clustered)


@pytest.mark.slow
def test_prepare_needs_no_pandas(tmp_path):
    """The data side is `pip install -e .` (make sample): apache-beam 2.62 brings no pandas, so
    nothing `prepare` runs may import it (pyarrow's to_pandas_dtype did, in the shard writer)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "class NoPandas:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'pandas':\n"
            "            raise ModuleNotFoundError(\"No module named 'pandas'\")\n"
            "sys.meta_path.insert(0, NoPandas())\n"
            "from tokenmill.cli import main\n"
            f"sys.exit(main(['prepare', '--output', {str(tmp_path / 'out')!r}, '--quiet']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("others_off", [False, True])
def test_extract_disabled_drops_raw_html_as_extract_disabled(tmp_path, others_off):
    """extract.enabled=false: a record with raw HTML has no text to give (it used to reach
    normalize as normalize:empty, or crash on None text with the later stages off); text
    records go on."""
    from pathlib import Path

    sample = Path(__file__).resolve().parent.parent / "tokenmill" / "sample"
    off = ["language", "quality", "pii", "normalize", "dedup"] if others_off else []
    rc, rows, _ = run_prepare(tmp_path / "out", [sample], sets=["extract.enabled=false", *(f"{s}.enabled=false" for s in off)])
    assert rc == 0
    pages = [r for r in rows if "/pages/" in str(r["source"])]  # HTML files
    assert pages and all(r["dropped_by"] == "extract:disabled" for r in pages), {r["dropped_by"] for r in pages}
    assert not any((r["dropped_by"] or "").startswith("normalize:") for r in rows)
    assert any(r["dropped_by"] is None for r in rows)  # the text records

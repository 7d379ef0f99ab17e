"""Text from data reaches the terminal as text: no escape sequence (a hidden OSC 8 hyperlink, a
cleared screen, a recoloured line), no direction override, no Rich markup read from it and no
MarkupError after an output is published. Every command that prints data is run on a prepared
output whose ids, URLs, text, input file names and report hold all of these."""

import json
import random
import shutil

import pytest
from conftest import prepare

from tokenmill.cli import main
from tokenmill.transforms.tokenization import train_tokenizer

OSC8 = "\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\"
HOSTILE = f"[link=https://evil.example]x[/link] [/] [bold]b :warning: {OSC8} \x1b[2J\x1b[31mred \x9b1m \u202eabc\x07"
BAD_NAME = "bad \x1b]8;;evil\x1b\\click\x1b]8;;\x1b\\ \u202e.jsonl.gz"  # no "/", and no "[" (a glob)
WORDS = ("garden weather spring tomato bean river mountain city train music paper window table light market "
         "coffee bread winter summer autumn forest ocean letter street doctor school morning evening").split()


def clean(s: str) -> None:
    """Nothing in ``s`` a terminal would act on, and the markup is shown, not read."""
    assert "\x1b" not in s and "\x9b" not in s and "\u202e" not in s and "\x07" not in s, repr(s)
    assert "Traceback" not in s and "MarkupError" not in s, s


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "3000")  # Rich wraps at the width: a line to search stays one line


# ---------------------------------------------------------------- the helper


def test_safe_shows_controls_and_overrides_as_escapes():
    from tokenmill.terminal import safe

    got = safe(HOSTILE)
    clean(got)
    assert "\\x1b]8;;https://evil.example/\\x1b\\click me" in got and "\\x9b1m" in got and "\\u202eabc\\x07" in got
    assert safe("a\nb\tc") == "a\\x0ab\\x09c"  # one line: a newline in an id cannot forge the next line
    assert safe("a\nb\tc\r", newlines=True) == "a\nb\tc\\x0d"  # a block of text keeps its lines
    assert safe("caf\u00e9 \u4e2d\u6587 ok") == "caf\u00e9 \u4e2d\u6587 ok"  # printable text is untouched
    assert safe(12) == "12"


def test_markup_prints_literally_through_rich():
    from io import StringIO

    from tokenmill.terminal import console, markup

    buf = StringIO()
    c = console(file=buf, width=400, force_terminal=False)
    c.print(f"[bold]{markup(HOSTILE)}[/]: {markup('ends in a backslash' + chr(92))}")
    out = buf.getvalue()
    clean(out)
    assert "[link=https://evil.example]x[/link] [/] [bold]b :warning:" in out and "\\x1b[2J" in out


# ---------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """A prepared output (by `tokenmill prepare` in its own process, so its workers' log lines
    are seen) of hostile records, plus an unreadable input whose name is hostile."""
    d = tmp_path_factory.mktemp("escape")
    rnd = random.Random(3)
    texts = [" ".join(rnd.choice(WORDS) for _ in range(80)) + f". {HOSTILE} end {i}." for i in range(6)]
    train_tokenizer(texts * 5, vocab_size=400).save(str(d / "tok.json"))
    src = d / "in"
    src.mkdir()
    with (src / "docs.jsonl").open("w") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"id": f"{HOSTILE} {i}", "url": f"https://example.com/{i}?{HOSTILE}", "text": text}) + "\n")
    (src / BAD_NAME).write_bytes(b"\x1f\x8b\x08\x00 not gzip at all")
    o = d / "out"
    rc, stdout, stderr = prepare(o, [src], "--set", "quality.enabled=false", "--set", f"tokenize.tokenizer={d / 'tok.json'}")
    return o, rc, stdout, stderr


def test_prepare_prints_no_escape_from_its_inputs(out):
    _, rc, stdout, stderr = out
    assert rc == 0, stderr
    clean(stdout)
    clean(stderr)
    assert "bad \\x1b]8;;evil\\x1b\\click" in stderr  # the broken file is named, visibly


def test_inspect_shows_hostile_ids_and_text_literally(out, capsys):
    assert main(["inspect", str(out[0])]) == 0
    cap = capsys.readouterr()
    clean(cap.out)
    clean(cap.err)
    assert "[link=https://evil.example]x[/link] [/] [bold]b" in cap.out  # the id, as it is


def test_report_of_a_hostile_report_and_path(out, tmp_path, capsys):
    """report.json is data too (an output someone published): its languages, reasons and inputs."""
    o = tmp_path / "o [/] [link=https://evil.example]x\x1b[2J"
    shutil.copytree(out[0], o)
    path = o / "report" / "report.json"
    report = json.loads(path.read_text())
    report["languages"] = {HOSTILE: 3, **report["languages"]}
    report["inputs_skipped"] = {HOSTILE: 1}
    report["pii_redactions"] = {HOSTILE: 1}
    report["decontamination"] = {HOSTILE: 1}
    for row in report["funnel"]:
        row["reasons"] = {HOSTILE: 1, **row["reasons"]}
    path.write_text(json.dumps(report))
    assert main(["report", str(o)]) == 0
    cap = capsys.readouterr()
    clean(cap.out)
    assert "[link=https://evil.example]x[/link] [/] [bold]b" in cap.out and "o [/] [link=" in cap.out


def test_inspect_of_a_hostile_manifest(out, tmp_path, capsys):
    o = tmp_path / "o"
    shutil.copytree(out[0], o)
    m = json.loads((o / "manifest.json").read_text())
    m["tokenmill_version"] = HOSTILE
    # a shard that is not there, named with no "/" (a manifest's paths stay inside OUT)
    m["splits"]["train"]["shards"][0]["file"] = "shards/[bold]b :warning: \x1b[2J\x1b[31mred \x9b1m \u202eabc.arrow"
    (o / "manifest.json").write_text(json.dumps(m))
    assert main(["inspect", str(o)]) == 1
    cap = capsys.readouterr()
    clean(cap.out)
    clean(cap.err)
    assert "[link=https://evil.example]x[/link] [/] [bold]b" in cap.out  # the version
    assert "FAIL" in cap.out and "shards/[bold]b :warning: \\x1b[2J\\x1b[31mred" in cap.out


def test_an_error_quoting_data_is_one_safe_line(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / HOSTILE)]) == 2
    err = capsys.readouterr().err
    clean(err)
    assert len(err.strip().splitlines()) == 1


def test_spikes_of_hostile_documents(out, tmp_path, capsys):
    import pyarrow.parquet as pq

    ids = [r["id"] for f in sorted((out[0] / "docs").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    run = tmp_path / "run"
    run.mkdir()
    (run / "spikes.jsonl").write_text(json.dumps({"step": 5, "loss": 9.0, "median": 3.0, "samples": [0, 8],
                                                  "docs": ids[:2] + [HOSTILE + " gone"]}) + "\n")
    assert main(["spikes", str(run), "--data", str(out[0])]) == 0
    cap = capsys.readouterr()
    clean(cap.out)
    assert "[link=https://evil.example]x[/link] [/]" in cap.out


def test_generate_prints_hostile_samples_visibly(tmp_path, capsys, monkeypatch):
    """A model trained on hostile text samples it back (its tokenizer's pieces hold ESC)."""
    pytest.importorskip("torch")
    import tokenmill.trainer.generate as gen

    monkeypatch.setattr(gen, "generate", lambda *a: (f" {HOSTILE}\nsecond line\tend", f"{tmp_path}/\x1b[2Jrun"))
    assert main(["generate", str(tmp_path), "--prompt", "[/] \x1b[31m"]) == 0
    cap = capsys.readouterr()
    clean(cap.out)
    clean(cap.err)
    assert "[/] \\x1b[31m [link=https://evil.example]x[/link]" in cap.out
    assert "\nsecond line\tend" in cap.out  # generated text keeps its lines


def test_compare_table_of_hostile_arm_names(capsys):
    pytest.importorskip("torch")
    from tokenmill.trainer.compare import print_table

    b = {"mean": 1.0, "min": 0.9, "max": 1.1}
    arm = {"name": HOSTILE, "eval_bpb": b, "tokenizer": {"vocab_size": 300}, "corpus_tokens": 10}
    print_table({"eval": {"docs": 1}, "tokens_per_arm": 10, "seeds": [0], "arms": [arm, {**arm, "name": "b"}],
                 "verdicts": [{"best": HOSTILE, "arm": "b", "gap_bpb": 0.1, "exceeds_spread": None}]})
    out = capsys.readouterr().out
    clean(out)
    assert "[/] [bold]b" in out

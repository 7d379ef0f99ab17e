"""Readers on real files: formats, splitting, and every kind of broken input."""

import gzip
import io
import json
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import read_all, shared
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from tokenmill.config import ReadConfig
from tokenmill.errors import UserError
from tokenmill.transforms.readers import Unit, detect_format, plan_units, read_unit, resolve_inputs


def test_detect_format():
    assert detect_format("a/b.warc.gz") == "warc"
    assert detect_format("CC-MAIN-x.warc.wet.gz") == "warc"
    assert detect_format("x.arc.gz") == "warc"
    assert detect_format("x.warc.wat.gz") is None
    assert detect_format("d.jsonl.zst") == "jsonl"
    assert detect_format("p.HTM.gz") == "html"
    assert detect_format("t.parquet") == "parquet"
    assert detect_format("image.png") is None


def test_resolve_folder_glob_file_and_missing(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("x")
    (tmp_path / "b.jsonl").write_text("{}\n")
    assert [f.rel for f in resolve_inputs([str(tmp_path)])] == ["b.jsonl", "sub/a.txt"]
    assert [f.rel for f in resolve_inputs([str(tmp_path / "sub" / "*.txt")])] == ["a.txt"]
    assert [f.rel for f in resolve_inputs([str(tmp_path / "b.jsonl")])] == ["b.jsonl"]
    with pytest.raises(UserError, match="input not found: .*nope"):
        resolve_inputs([str(tmp_path / "nope")])
    with pytest.raises(UserError, match="input not found"):
        resolve_inputs([str(tmp_path / "*.parquet")])


def _jsonl(path, n):
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"r{i}", "text": f"record number {i} " + "x" * (i % 37)}) + "\n")


def test_jsonl_split_into_ranges_reads_each_record_once(tmp_path):
    path = tmp_path / "big.jsonl"
    _jsonl(path, 500)
    whole = read_all(path)
    cfg = ReadConfig(split_bytes=97)  # tiny units: boundaries land mid-line everywhere
    (f,) = resolve_inputs([str(path)])
    units = list(plan_units(f, cfg))
    assert len(units) > 100
    split = [d for u in units for d in read_unit(u, cfg)]
    assert [d["id"] for d in split] == [d["id"] for d in whole] == [f"r{i}" for i in range(500)]


def test_jsonl_fields_configurable_and_html_field(tmp_path):
    path = tmp_path / "c.jsonl"
    first = json.dumps({"doc_id": 7, "body": "hello"}) + "\n"
    path.write_text(first + json.dumps({"html": "<p>hi</p>"}) + "\n")
    docs = read_all(path, ReadConfig(id_field="doc_id", text_field="body"))
    assert docs[0]["id"] == "7" and docs[0]["text"] == "hello"
    # No id field: the id is the file and the line's byte offset, stable however the file is split.
    assert docs[1]["html"] == "<p>hi</p>" and docs[1]["id"] == f"c.jsonl:{len(first)}"


def test_jsonl_bad_lines_counted_and_skipped(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [b'{"id":"ok1","text":"fine"}\n', b'{"id": "x", "text": "unterminated\n', b"[1,2,3]\n",
             b'{"id":"u","text":"\xff\xfe"}\n', b"\n", b'{"id":"nt"}\n', b'{"id":"ok2","text":"also fine"}\n']
    path.write_bytes(b"".join(lines))
    at = [sum(map(len, lines[:i])) for i in range(len(lines))]
    docs = read_all(path)
    assert [(d["id"], d["dropped_by"]) for d in docs] == [
        ("ok1", None), (f"bad.jsonl:{at[1]}", "read:invalid_json"), (f"bad.jsonl:{at[2]}", "read:not_an_object"),
        (f"bad.jsonl:{at[3]}", "read:invalid_utf8"), ("nt", "read:no_text_field"), ("ok2", None)]


def test_compressed_jsonl_and_truncated_gzip(tmp_path):
    lines = b"".join(json.dumps({"id": f"g{i}", "text": "t" * 50}).encode() + b"\n" for i in range(200))
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    assert len(read_all(tmp_path / "a.jsonl.zst")) == 200
    gz = gzip.compress(lines)
    (tmp_path / "t.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    docs = read_all(tmp_path / "t.jsonl.gz")
    assert docs[-1]["dropped_by"] == "read:truncated_file"
    good = [d for d in docs if not d["dropped_by"]]
    assert len(good) > 0 and [d["id"] for d in good] == [f"g{i}" for i in range(len(good))]


def test_oversized_record_skipped_while_streaming(tmp_path):
    path = tmp_path / "huge.jsonl"
    big = "w" * (50 * 1024 * 1024)  # a 50 MB single document
    with open(path, "w") as fh:
        fh.write(json.dumps({"id": "small", "text": "keep me"}) + "\n")
        fh.write(json.dumps({"id": "huge", "text": big}) + "\n")
        fh.write(json.dumps({"id": "after", "text": "me too"}) + "\n")
    del big
    docs = read_all(path)
    assert [(d["id"], d["dropped_by"]) for d in docs] == [
        ("small", None), ("huge.jsonl:35", "read:too_large"), ("after", None)]
    (tmp_path / "huge.txt").write_bytes(b"z" * (50 * 1024 * 1024))
    assert read_all(tmp_path / "huge.txt")[0]["dropped_by"] == "read:too_large"


def test_empty_and_unsupported_files(tmp_path):
    (tmp_path / "e.jsonl").write_bytes(b"")
    (tmp_path / "e.html").write_bytes(b"  \n")
    (tmp_path / "pic.png").write_bytes(b"\x89PNG")
    reasons = {d["id"]: d["dropped_by"] for d in read_all(tmp_path)}
    assert reasons == {"e.jsonl": "read:empty_file", "e.html": "read:empty_file"}  # the .png is skipped
    with pytest.raises(UserError, match="no reader for this file type"):
        resolve_inputs([str(tmp_path / "pic.png")])


def test_html_txt_and_gz_html(tmp_path):
    (tmp_path / "p.html.gz").write_bytes(gzip.compress(b"<p>hello</p>"))
    (tmp_path / "n.txt").write_bytes("\ufeffplain text".encode())
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9")
    docs = {d["id"]: d for d in read_all(tmp_path)}
    assert docs["p.html.gz"]["html"] == b"<p>hello</p>"
    assert docs["n.txt"]["text"] == "plain text"
    assert docs["bad.txt"]["dropped_by"] == "read:invalid_utf8"


def test_parquet_row_group_units(tmp_path):
    path = tmp_path / "d.parquet"
    table = pa.table({"id": [f"p{i}" for i in range(1000)], "text": [f"text {i}" for i in range(1000)]})
    pq.write_table(table, path, row_group_size=100)
    cfg = ReadConfig(split_bytes=1)  # one unit per row group
    (f,) = resolve_inputs([str(path)])
    units = list(plan_units(f, cfg))
    assert len(units) == 10 and all(isinstance(u, Unit) for u in units)
    docs = [d for u in units for d in read_unit(u, cfg)]
    assert [d["id"] for d in docs] == [f"p{i}" for i in range(1000)]
    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "noid.parquet")
    assert [d["id"] for d in read_all(tmp_path / "noid.parquet")] == ["noid.parquet:0", "noid.parquet:1"]


def test_corrupt_parquet(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1 this is not parquet at all")
    (d,) = read_all(tmp_path / "x.parquet")
    assert d["dropped_by"] == "read:corrupt_file"


def _warc(path, records):
    with open(path, "wb") as fh:
        w = WARCWriter(fh, gzip=True)
        for uri, ctype, status, body in records:
            http = StatusAndHeaders(status, [("Content-Type", ctype)], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(uri, "response", payload=io.BytesIO(body), http_headers=http))
            w.write_record(w.create_warc_record(uri, "request", payload=io.BytesIO(b"GET / HTTP/1.1\r\n\r\n")))


def test_warc_reads_html_and_text_responses_and_rows_the_rest(tmp_path):
    path = tmp_path / "c.warc.gz"
    _warc(path, [
        ("http://a/", "text/html; charset=windows-1252", "200 OK", b"<p>caf\xe9</p>"),
        ("http://b/i.png", "image/png", "200 OK", b"\x89PNG...."),
        ("http://c/t", "text/plain", "200 OK", b"plain words"),
        ("http://d/", "text/html", "404 Not Found", b"<p>gone</p>"),
    ])
    docs = read_all(path)
    assert [(d["url"], d["dropped_by"]) for d in docs] == [
        ("http://a/", None), ("http://b/i.png", "read:unsupported_media_type"), ("http://c/t", None),
        ("http://d/", "read:http_404")]
    assert docs[0]["html"] == b"<p>caf\xe9</p>" and docs[0]["encoding"] == "windows-1252"
    assert docs[0]["id"].startswith("urn:uuid:") and docs[2]["text"] == "plain words"


def _gzip_member_ends(data: bytes) -> list[int]:
    ends, pos = [], 0
    while pos < len(data):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        d.decompress(data[pos:])
        pos = len(data) - len(d.unused_data)
        ends.append(pos)
    return ends


@pytest.mark.parametrize("where", ["mid_member", "in_trailer"])
def test_truncated_warc_keeps_records_before_the_break(tmp_path, where):
    path = tmp_path / "t.warc.gz"
    _warc(path, [(f"http://x/{i}", "text/html", "200 OK", b"<p>" + b"words " * 500 + b"</p>") for i in range(20)])
    data = path.read_bytes()
    ends = _gzip_member_ends(data)
    # A cut exactly at a member boundary leaves a valid, shorter WARC that nothing can tell
    # from a whole one, so the cut is placed inside a member (one record per member): halfway
    # through it, or 3 bytes short of its end (inside the CRC/size trailer, which warcio
    # itself does not check).
    k = len(ends) * 3 // 5
    cut = (ends[k - 1] + ends[k]) // 2 if where == "mid_member" else ends[k] - 3
    (tmp_path / "cut.warc.gz").write_bytes(data[:cut])
    docs = read_all(tmp_path / "cut.warc.gz")
    assert docs[-1]["dropped_by"] == "read:truncated_file"
    assert 5 <= len([d for d in docs if not d["dropped_by"]]) < 20


def test_warc_with_a_damaged_last_trailer_is_corrupt(tmp_path):
    path = tmp_path / "t.warc.gz"
    _warc(path, [(f"http://x/{i}", "text/html", "200 OK", b"<p>" + b"words " * 50 + b"</p>") for i in range(3)])
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF  # the CRC-32 of the last member
    (tmp_path / "bad.warc.gz").write_bytes(bytes(data))
    docs = read_all(tmp_path / "bad.warc.gz")
    assert docs[-1]["dropped_by"] == "read:corrupt_file"
    assert len([d for d in docs if not d["dropped_by"]]) == 3  # the last member is a request record


def test_real_warc_files():
    cc = shared("warc", "commoncrawl_whirlwind")
    docs = read_all(cc / "whirlwind.warc.gz")
    assert any(d["url"] == "https://an.wikipedia.org/wiki/Escopete" and d["html"] for d in docs)
    wet = read_all(cc / "whirlwind.warc.wet.gz")
    assert wet and wet[0]["text"] and "Escopete" in wet[0]["text"]
    clipped = read_all(shared("warc", "resiliparse", "clipped.warc.gz"))
    assert clipped[-1]["dropped_by"] in ("read:truncated_file", "read:corrupt_file")
    old = read_all(shared("warc", "ukwa", "IAH-20080430204825-00000-blackbook-truncated.warc.gz"))
    assert any(not d["dropped_by"] for d in old)


def _tasks_records(tasks, cfg):
    from tokenmill.transforms.readers import plan_task, read_task

    return [r for t in tasks for item in plan_task(t, cfg)
            for r in ([item] if isinstance(item, dict) else read_task(item, cfg))]


def test_tasks_cover_every_file_once_small_ones_in_runs(tmp_path):
    from tokenmill.transforms.readers import MIN_TASKS, files_in, write_input_list

    src = tmp_path / "pages"
    src.mkdir()
    n = 2 * MIN_TASKS + 7  # two files per task, and one shorter run at the end
    for i in range(n):
        (src / f"p{i:05d}.txt").write_text(f"page {i}")
    (src / "empty.txt").write_bytes(b"")
    files = resolve_inputs([str(src)])
    cfg = ReadConfig()
    tasks = write_input_list(files, str(tmp_path / "inputs.jsonl"), cfg)
    assert len(tasks) == (n + 1 + 1) // 2 and not any(t.split for t in tasks)
    by_path = lambda fs: sorted(fs, key=lambda f: f.path)  # noqa: E731
    assert by_path(f for t in tasks for f in files_in(t)) == by_path(files)
    # Biggest first (the local runner deals them to its workers in turn), ties in the list's order.
    assert [t.nbytes for t in tasks] == sorted((t.nbytes for t in tasks), reverse=True)
    assert [t.start for t in tasks if t.nbytes == tasks[-1].nbytes] == sorted(
        t.start for t in tasks if t.nbytes == tasks[-1].nbytes)
    records = _tasks_records(tasks, cfg)
    assert sorted(r["text"] for r in records if not r["dropped_by"]) == sorted(f"page {i}" for i in range(n))
    assert [r["dropped_by"] for r in records if r["dropped_by"]] == ["read:empty_file"]


def test_big_splittable_file_is_its_own_task_and_read_once(tmp_path):
    from tokenmill.transforms.readers import plan_task, write_input_list

    (tmp_path / "small.jsonl").write_text(json.dumps({"id": "s", "text": "small"}) + "\n")
    (tmp_path / "big.jsonl").write_text("".join(json.dumps({"id": f"b{i}", "text": "x" * 50}) + "\n" for i in range(500)))
    cfg = ReadConfig(split_bytes=1000)
    tasks = write_input_list(resolve_inputs([str(tmp_path)]), str(tmp_path / "out-inputs.jsonl"), cfg)
    assert [t.split for t in tasks] == [True, False]  # big.jsonl alone; small.jsonl in a run
    units = list(plan_task(tasks[0], cfg))
    assert len(units) > 20 and all(isinstance(u, Unit) for u in units)
    ids = [r["id"] for r in _tasks_records(tasks, cfg)]
    assert sorted(ids) == sorted([f"b{i}" for i in range(500)] + ["s"])


def test_every_format_is_one_entry_that_everything_reads():
    """A format is one FORMATS entry: its names detect it, its reader loads, its split rule and
    its size estimate come from the entry (a reader without an estimate cannot mis-size buckets)."""
    from tokenmill.transforms.buckets import estimate_token_bytes
    from tokenmill.transforms.readers.formats import FORMATS, INFLATE, format_of, reader, split_rule

    for f in FORMATS:
        assert callable(reader(f.name))
        for suffix in f.suffixes:
            name = "x" + suffix
            assert format_of(name) is f and detect_format(name) == f.name
            assert estimate_token_bytes(name, 1000) == 1000 * f.token_ratio * (INFLATE if f.inflates else 1)
            assert estimate_token_bytes(name + ".gz", 1000) == 1000 * f.token_ratio * INFLATE
            assert split_rule(name) == f.split
            assert split_rule(name + ".gz") == (f.split if f.split != "bytes" else None)  # no byte ranges in gzip

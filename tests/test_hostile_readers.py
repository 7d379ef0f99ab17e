"""Readers on hostile inputs, each built here from real bytes: every record read is one row,
kept or dropped with a ``read:<reason>``, and nothing raises."""

import gzip
import io
import json
import os
import re
import time
import zlib
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import read_all, run_prepare
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from tokenmill.config import ReadConfig
from tokenmill.errors import UserError
from tokenmill.transforms.doc import MAX_LABEL_CHARS, docs_schema, new_doc, to_row
from tokenmill.transforms.readers import (
    files_in,
    plan_units,
    read_task,
    read_unit,
    resolve_inputs,
    scan_inputs,
    write_input_list,
)


def rows(docs):
    return [(d["url"] or d["id"], d["dropped_by"]) for d in docs]


def assert_writable(docs, tmp_path):
    """The docs go to Parquet as the pipeline writes them (a lone surrogate would raise here)."""
    schema = docs_schema()
    pq.write_table(pa.Table.from_pylist([to_row(d, schema) for d in docs], schema), tmp_path / "rows.parquet")


# ---------------------------------------------------------------- WARC builders


def _warc(records, gz=True) -> bytes:
    """A WARC of (uri, content type, body, kind[, extra http headers]) records: kind is an HTTP
    status line (a response record) or a WARC type (resource, request, metadata, warcinfo)."""
    out = io.BytesIO()
    w = WARCWriter(out, gzip=gz)
    for uri, ctype, body, kind, *extra in records:
        if kind in ("resource", "request", "metadata", "warcinfo"):
            record = w.create_warc_record(uri, kind, payload=io.BytesIO(body), warc_content_type=ctype)
        else:
            http = StatusAndHeaders(kind, [("Content-Type", ctype), *(extra[0] if extra else [])], protocol="HTTP/1.1")
            record = w.create_warc_record(uri, "response", payload=io.BytesIO(body), http_headers=http)
        w.write_record(record)
    return out.getvalue()


def _members(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        d.decompress(data[pos:])
        end = len(data) - len(d.unused_data)
        out.append(data[pos:end])
        pos = end
    return out


def _set_length(data: bytes, gz: bool, index: int, length: bytes | None) -> bytes:
    """``data`` with the Content-Length of record ``index`` replaced by ``length`` (None: the
    header removed), in the bytes of the file as a tool with a bug would have written them."""
    if gz:
        members = _members(data)
        members[index] = gzip.compress(_set_length(gzip.decompress(members[index]), False, 0, length))
        return b"".join(members)
    m = list(re.finditer(rb"Content-Length: (\d+)\r\n", data))[index]
    if length is None:
        return data[: m.start()] + data[m.end() :]
    return data[: m.start(1)] + length + data[m.end(1) :]


def _length_of(data: bytes, gz: bool, index: int) -> int:
    plain = gzip.decompress(_members(data)[index]) if gz else data
    return int(re.findall(rb"Content-Length: (\d+)\r\n", plain)[0 if gz else index])


BODIES = [(f"page {i}\n" + "words and more words\n" * (i * 3 % 7 + 1)).encode() for i in range(5)]


def _pages(gz: bool) -> bytes:
    return _warc([(f"http://x/{i}", "text/plain", body, "200 OK") for i, body in enumerate(BODIES)], gz)


def _swallow_next(data: bytes, index: int) -> bytes:
    """A plain WARC whose record ``index`` claims exactly itself and the next record."""
    starts = [m.start(1) for m in re.finditer(rb"(?:^|\r\n\r\n)(WARC/1\.)", data)]
    extra = starts[index + 2] - starts[index + 1]  # "\r\n\r\n" before the next one, and it
    return _set_length(data, False, index, str(_length_of(data, False, index) + extra).encode())


LIES = {  # how record 2's Content-Length lies: a function of (its true length) -> new header value
    "short_by_5": lambda n: str(n - 5).encode(),
    "short_by_40": lambda n: str(n - 40).encode(),
    "long_by_5": lambda n: str(n + 5).encode(),  # cuts the next header's "WARC/1.0" in two
    "long_by_60": lambda n: str(n + 60).encode(),
    "long_by_400": lambda n: str(n + 400).encode(),  # over the next record and into the one after
    "past_the_end": lambda n: str(n + 10**9).encode(),
    "not_a_number": lambda n: b"12abc",
    "missing": lambda n: None,
}


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
@pytest.mark.parametrize("lie", list(LIES))
def test_warc_content_length_lies_cost_one_record(tmp_path, gz, lie):
    data = _pages(gz)
    data = _set_length(data, gz, 2, LIES[lie](_length_of(data, gz, 2)))
    path = tmp_path / ("w.warc.gz" if gz else "w.warc")
    path.write_bytes(data)
    docs = read_all(path)
    assert rows(docs) == [(f"http://x/{i}", "read:warc_length_mismatch" if i == 2 else None) for i in range(5)]
    assert [d["text"] for d in docs if not d["dropped_by"]] == [b.decode() for i, b in enumerate(BODIES) if i != 2]
    assert docs[2]["id"].startswith("urn:uuid:")


def test_warc_length_that_swallows_the_next_record_exactly(tmp_path):
    # The lie ends where the swallowed record ends, so the framing after it looks fine: the
    # "\r\n\r\nWARC/1." inside the block gives it away, and the swallowed record is read.
    (tmp_path / "w.warc").write_bytes(_swallow_next(_pages(False), 1))
    docs = read_all(tmp_path / "w.warc")
    assert rows(docs) == [(f"http://x/{i}", "read:warc_length_mismatch" if i == 1 else None) for i in range(5)]
    assert docs[2]["text"] == BODIES[2].decode()


def test_warc_last_record_longer_than_the_file_is_truncated(tmp_path):
    data = _pages(False)
    (tmp_path / "w.warc").write_bytes(_set_length(data, False, 4, str(_length_of(data, False, 4) + 99).encode()))
    docs = read_all(tmp_path / "w.warc")
    assert [d["dropped_by"] for d in docs] == [None] * 4 + ["read:truncated_file"]


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
def test_warc_lying_request_record_does_not_hide_the_response_after_it(tmp_path, gz):
    data = _warc([("http://a/", "text/plain", b"first page", "200 OK"),
                  ("http://b/", "application/http; msgtype=request", b"GET /b HTTP/1.1\r\n\r\n", "request"),
                  ("http://b/", "text/plain", b"second page", "200 OK"),
                  ("http://c/", "text/plain", b"third page", "200 OK")], gz)
    path = tmp_path / ("r.warc.gz" if gz else "r.warc")
    path.write_bytes(_set_length(data, gz, 1, str(_length_of(data, gz, 1) + 50).encode()))
    assert rows(read_all(path)) == [("http://a/", None), ("http://b/", None), ("http://c/", None)]


def test_warc_fuzzed_lengths_never_lose_a_record(tmp_path):
    for gz in (True, False):
        data = _pages(gz)
        true = _length_of(data, gz, 1)
        for length in range(max(0, true - 60), true + 700, 13):
            path = tmp_path / ("f.warc.gz" if gz else "f.warc")
            path.write_bytes(_set_length(data, gz, 1, str(length).encode()))
            docs = read_all(path)
            assert [d["url"] for d in docs] == [f"http://x/{i}" for i in range(5)], (gz, length)
            assert all(d["text"] == BODIES[i].decode() for i, d in enumerate(docs) if i != 1), (gz, length)


def test_warc_records_that_are_no_documents(tmp_path):
    data = _warc([("urn:info", "application/warc-fields", b"software: test\r\n", "warcinfo"),
                  ("http://a/", "application/http; msgtype=request", b"GET / HTTP/1.1\r\n\r\n", "request"),
                  ("http://a/", "text/html", b"<p>page</p>", "200 OK"),
                  ("http://a/", "application/warc-fields", b"fetchTimeMs: 12\r\n", "metadata"),
                  ("http://a/logo.png", "image/png", b"\x89PNG\r\n\x1a\n....", "200 OK"),
                  ("http://a/robots.txt", "text/x-robots", b"User-agent: *", "200 OK"),
                  ("http://a/notes.txt", "text/plain", b"a resource record", "resource")])
    (tmp_path / "m.warc.gz").write_bytes(data)
    # A response or resource of any media type is a record: a row. warcinfo/request/metadata
    # are no documents: Beam counters only (read.skipped.warc_<type>).
    assert rows(read_all(tmp_path / "m.warc.gz")) == [
        ("http://a/", None), ("http://a/logo.png", "read:unsupported_media_type"),
        ("http://a/robots.txt", "read:unsupported_media_type"), ("http://a/notes.txt", None)]


def test_warc_charsets_bodies_and_odd_headers(tmp_path):
    page = b"<p>" + b"hello world " * 100 + b"</p>"
    zipped = gzip.compress(page)
    gzip_body = [("Content-Encoding", "gzip")]
    data = _warc([
        ("http://utf7/", "text/plain; charset=utf-7", b"Hi +2ADYAA- there", "200 OK"),  # lone surrogates
        ("http://odd-label/", "text/plain; charset=x-unknown-foo", b"plain ascii text", "200 OK"),
        ("http://odd-label-latin1/", "text/plain; charset=x-unknown-foo", b"caf\xe9", "200 OK"),
        ("http://sjis/", "text/plain; charset=shift_jis", b"\x81\x00\xff", "200 OK"),
        ("http://utf8/", "text/plain; charset=UTF8", b"caf\xe9", "200 OK"),
        ("http://gzip-ok/", "text/html", zipped, "200 OK", gzip_body),
        ("http://gzip-corrupt/", "text/html", zipped[:20] + bytes(30) + zipped[50:], "200 OK", gzip_body),
        ("http://gzip-cut/", "text/html", zipped[: len(zipped) // 2], "200 OK", gzip_body),
        ("http://gzip-lie/", "text/html", page, "200 OK", gzip_body),  # says gzip, is not
        ("http://status/", "text/html", page, "abc not a status"),
        ("http://last/", "text/plain", b"the end", "200 OK"),
    ])
    (tmp_path / "c.warc.gz").write_bytes(data)
    docs = read_all(tmp_path / "c.warc.gz")
    assert rows(docs) == [
        ("http://utf7/", None), ("http://odd-label/", None), ("http://odd-label-latin1/", "read:unknown_charset"),
        ("http://sjis/", "read:invalid_encoding"), ("http://utf8/", "read:invalid_utf8"), ("http://gzip-ok/", None),
        ("http://gzip-corrupt/", "read:bad_content_encoding"), ("http://gzip-cut/", "read:bad_content_encoding"),
        ("http://gzip-lie/", None), ("http://status/", "read:http_bad_status"), ("http://last/", None)]
    assert docs[0]["text"] == "Hi \ufffd\ufffd there" and docs[1]["text"] == "plain ascii text"
    assert docs[5]["html"] == page == docs[8]["html"]
    assert_writable(docs, tmp_path)


def test_warc_bogus_record_ids_and_a_record_warcio_cannot_parse(tmp_path):
    data = _warc([(f"http://{c}/", "text/plain", b"words", "200 OK") for c in "abcd"], gz=False)
    ids = re.findall(rb"WARC-Record-ID: (<[^>]*>)", data)
    data = data.replace(ids[0], b"<>").replace(ids[1], b"<" + b"x" * 10_000_000 + b"\xff\xfe>")
    data = data.replace(b"WARC-Target-URI: http://c/\r\n", b"")  # a response with no target
    (tmp_path / "ids.warc").write_bytes(data)
    docs = read_all(tmp_path / "ids.warc")
    assert [(d["id"][:9], d["dropped_by"]) for d in docs] == [
        ("ids.warc#", None), ("x" * 9, None), ("ids.warc#", "read:corrupt_record"), ("urn:uuid:", None)]
    assert docs[0]["id"] == "ids.warc#0" and len(docs[1]["id"]) == MAX_LABEL_CHARS
    assert docs[3]["url"] == "http://d/"
    assert_writable(docs, tmp_path)


def test_warc_gzip_shapes(tmp_path):
    plain = _pages(False)
    (tmp_path / "whole.warc.gz").write_bytes(gzip.compress(plain))  # one member for all records
    assert [d["dropped_by"] for d in read_all(tmp_path / "whole.warc.gz")] == [None] * 5
    (tmp_path / "whole-lie.warc.gz").write_bytes(gzip.compress(_set_length(plain, False, 3, b"3")))
    assert [d["dropped_by"] for d in read_all(tmp_path / "whole-lie.warc.gz")] == [
        None, None, None, "read:warc_length_mismatch", None]
    (tmp_path / "padded.warc.gz").write_bytes(_pages(True) + bytes(64))  # junk after the last member
    assert [d["dropped_by"] for d in read_all(tmp_path / "padded.warc.gz")] == [None] * 5 + ["read:corrupt_file"]
    members = _members(_pages(True))
    members[3] = members[3][:10] + bytes(40) + members[3][50:]  # a damaged member in the middle
    (tmp_path / "damaged.warc.gz").write_bytes(b"".join(members))
    assert [d["dropped_by"] for d in read_all(tmp_path / "damaged.warc.gz")] == [None] * 3 + ["read:corrupt_file"]
    (tmp_path / "html.warc").write_bytes(b"<html><p>not a warc</p></html>\n")
    assert [d["dropped_by"] for d in read_all(tmp_path / "html.warc")] == ["read:corrupt_file"]


# ---------------------------------------------------------------- JSONL and Parquet


def test_json_values_of_every_shape_are_made_safe(tmp_path):
    lines = [
        r'{"id": "sur\ud800", "url": "http://x/\udfff", "text": "lone \ud800 and \udc00 surrogates"}',
        r'{"id": "pair", "text": "a real pair \ud83d\ude00"}',
        '{"id": "deep", "text": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "[" * 100_000,
        '{"id": "num", "text": 12.5}',
        '{"id": "list", "text": ["a", "b"]}',
        '{"id": {"nested": [1, 2]}, "url": 7, "text": "odd id and url types"}',
        json.dumps({"id": "i" * 10_000_000, "text": "a 10 MB id"}),
        json.dumps({"id": "nul", "text": "nul \x00 bytes \x00 inside"}),
        '{"id": 1' + "0" * 5000 + ', "text": "an int json will not convert"}',
        '\ufeff{"id": "bom", "text": "a byte order mark first"}',
    ]
    (tmp_path / "h.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    docs = read_all(tmp_path / "h.jsonl")
    assert [d["dropped_by"] for d in docs] == [
        None, None, "read:too_deep", "read:too_deep", "read:text_not_string", "read:text_not_string",
        None, None, None, "read:invalid_json", None]
    assert docs[0]["id"] == "sur\ufffd" and docs[0]["url"] == "http://x/\ufffd"
    assert docs[0]["text"] == "lone \ufffd and \ufffd surrogates" and docs[1]["text"] == "a real pair \U0001f600"
    assert docs[6]["id"] == "{'nested': [1, 2]}" and docs[6]["url"] == "7"
    assert len(docs[7]["id"]) == MAX_LABEL_CHARS and docs[8]["text"].count("\x00") == 2
    assert docs[10]["id"] == "bom"
    assert_writable(docs, tmp_path)


def test_new_doc_is_the_one_gate(tmp_path):
    nasty = "a\ud800b\udcffc"
    d = new_doc(nasty, "/in/caf\udce9.txt", url=nasty, text=nasty, html=nasty, encoding=nasty * 2000)
    assert d["id"] == d["url"] == d["text"] == d["html"] == "a\ufffdb\ufffdc"
    assert d["source"] == "/in/caf\\xe9.txt" and len(d["encoding"]) == MAX_LABEL_CHARS
    assert new_doc(b"\xffid", "s")["id"] == "\\xffid" and new_doc(3, "s", url=[1])["url"] == "[1]"
    assert_writable([d], tmp_path)


def test_compressed_jsonl_damage(tmp_path):
    lines = b"".join(json.dumps({"id": f"g{i}", "text": f"record {i} " * 20}).encode() + b"\n" for i in range(3000))
    gz = gzip.compress(lines)
    (tmp_path / "mid.jsonl.gz").write_bytes(gz[: len(gz) // 2] + bytes(64) + gz[len(gz) // 2 + 64 :])
    docs = read_all(tmp_path / "mid.jsonl.gz")
    assert docs[-1]["dropped_by"] == "read:corrupt_file" and docs[0]["id"] == "g0"
    zst = zstandard.ZstdCompressor().compress(lines)
    (tmp_path / "cut.jsonl.zst").write_bytes(zst[: len(zst) * 2 // 3])  # zstandard ends quietly here
    docs = read_all(tmp_path / "cut.jsonl.zst")
    assert docs[-1]["dropped_by"] == "read:truncated_file" and 0 < len(docs) < 3000
    zst = zstandard.ZstdCompressor(write_checksum=True).compress(lines)  # without one, damage can pass unseen
    (tmp_path / "bad.jsonl.zst").write_bytes(zst[: len(zst) // 2] + bytes(64) + zst[len(zst) // 2 + 64 :])
    assert read_all(tmp_path / "bad.jsonl.zst")[-1]["dropped_by"] == "read:corrupt_file"
    frames = b"".join(zstandard.ZstdCompressor(write_checksum=True).compress(lines[i : i + 5000])
                      for i in range(0, len(lines), 5000))
    (tmp_path / "frames.jsonl.zst").write_bytes(frames)
    assert [d["id"] for d in read_all(tmp_path / "frames.jsonl.zst")] == [f"g{i}" for i in range(3000)]
    (tmp_path / "fake.jsonl.gz").write_bytes(lines[:1000])  # named .gz, not gzip
    assert [d["dropped_by"] for d in read_all(tmp_path / "fake.jsonl.gz")] == ["read:corrupt_file"]


def _deflate_stream(head: bytes, filler: bytes, total: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [c.compress(head)] + [c.compress(filler * (1 << 20)) for _ in range(total >> 20)]
    return b"".join(out + [c.flush()])


def test_inflate_limit_stops_a_small_file_of_newlines(tmp_path):
    cfg = ReadConfig(max_inflated_bytes=1 << 20, max_inflate_ratio=10.0)
    first = b'{"id": "first", "text": "before the flood"}\n'
    (tmp_path / "nl.jsonl.gz").write_bytes(_deflate_stream(first, b"\n", 64 << 20))
    (tmp_path / "nl.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(first + b"\n" * (64 << 20)))
    (tmp_path / "x.jsonl.gz").write_bytes(_deflate_stream(first, b"x", 64 << 20))  # one endless line
    for name in ("nl.jsonl.gz", "nl.jsonl.zst", "x.jsonl.gz"):
        start = time.monotonic()
        docs = read_all(tmp_path / name, cfg)
        assert time.monotonic() - start < 20, name
        assert docs[0]["id"] == "first" and docs[-1]["dropped_by"] == "read:inflate_limit", name
        assert len(docs) <= 3, name
    # A WARC record that inflates to 64 MB of zeros: the records before it are kept.
    http = StatusAndHeaders("200 OK", [("Content-Type", "text/html")], protocol="HTTP/1.1")
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = http.to_bytes() + bytes(64 << 20)
    header = (b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: http://bomb/\r\n"
              b"WARC-Record-ID: <urn:bomb>\r\nContent-Type: application/http; msgtype=response\r\n"
              b"Content-Length: %d\r\n\r\n" % len(block))
    data = _warc([("http://ok/", "text/plain", b"a page", "200 OK")]) + bomb.compress(header + block + b"\r\n\r\n")
    (tmp_path / "bomb.warc.gz").write_bytes(data + bomb.flush())
    assert [d["dropped_by"] for d in read_all(tmp_path / "bomb.warc.gz", cfg)] == [None, "read:inflate_limit"]


def test_blank_line_runs_split_anywhere(tmp_path):
    # Runs of blank and space-only lines are skipped a buffer at a time: ids (byte offsets) and
    # unit boundaries must come out as if read line by line.
    parts = []
    for i in range(300):
        parts.append(json.dumps({"text": f"record {i}"}) + "\n")
        parts.append("\n" * (i % 5) + "  \n" * (i % 3) + ("\r\n" if i % 7 == 0 else ""))
    parts.append("\n" * 200_000)
    parts.append("   " + json.dumps({"text": "indented last"}) + "\n")
    (tmp_path / "b.jsonl").write_text("".join(parts))
    whole = read_all(tmp_path / "b.jsonl")
    assert len(whole) == 301 and all(not d["dropped_by"] for d in whole)
    cfg = ReadConfig(split_bytes=61)
    (f,) = resolve_inputs([str(tmp_path / "b.jsonl")])
    split = [d for u in plan_units(f, cfg) for d in read_unit(u, cfg)]
    assert [d["id"] for d in split] == [d["id"] for d in whole]


def test_parquet_shapes(tmp_path):
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
                   tmp_path / "empty.parquet")
    assert rows(read_all(tmp_path / "empty.parquet")) == [("empty.parquet", "read:empty_file")]
    pq.write_table(pa.table({"id": [b"b1", b"b2"], "text": [b"binary text", b"\xff\xfe"]}), tmp_path / "bin.parquet")
    assert rows(read_all(tmp_path / "bin.parquet")) == [("b1", None), ("b2", "read:invalid_utf8")]
    pq.write_table(pa.table({"id": [1, 2], "text": [3, 4]}), tmp_path / "int.parquet")
    assert rows(read_all(tmp_path / "int.parquet")) == [("1", "read:text_not_string"), ("2", "read:text_not_string")]
    pq.write_table(pa.table({"id": [{"a": 1}], "text": ["x" * 5000]}), tmp_path / "big.parquet")
    assert rows(read_all(tmp_path / "big.parquet", ReadConfig(max_record_bytes=1000))) == [
        ("{'a': 1}", "read:too_large")]


# ---------------------------------------------------------------- inputs


def _tree(tmp_path):
    """A folder with every way of reaching a file twice, and every kind of file not to read."""
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (src / "a.jsonl").write_text('{"id": "a", "text": "file a"}\n')
    (src / "sub" / "b.jsonl").write_text('{"id": "b", "text": "file b"}\n')
    (tmp_path / "elsewhere" / "c.jsonl").write_text('{"id": "c", "text": "file c"}\n')
    (tmp_path / "blob0123").write_text('{"id": "hf", "text": "a blob with no extension"}\n')
    os.symlink("a.jsonl", src / "alias.jsonl")  # a second name for a.jsonl
    os.symlink("sub", src / "sublink")  # a second path to sub/
    os.symlink("../elsewhere", src / "outside")  # a folder reached only through a link
    os.symlink("..", src / "sub" / "up")  # a loop
    os.symlink("missing.jsonl", src / "broken.jsonl")
    os.symlink("../blob0123", src / "hf.jsonl")  # as a Hugging Face cache links files
    os.mkfifo(src / "pipe.jsonl")  # opening it would hang
    (src / "README.md").write_text("not data")
    with open(os.path.join(os.fsencode(src), b"caf\xe9.txt"), "wb") as fh:  # not UTF-8
        fh.write(b"a file whose name is latin-1")
    return src


def test_scan_reads_each_file_once_and_counts_what_it_skips(tmp_path, monkeypatch):
    src = _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    scan = scan_inputs(["in", "./in/a.jsonl", "in/../in/sub/b.jsonl", str(src / "sub" / "b.jsonl"), "in/*.txt"])
    assert sorted(f.rel for f in scan.files) == ["a.jsonl", "caf\\xe9.txt", "hf.jsonl", "outside/c.jsonl",
                                                  "sub/b.jsonl"]
    assert all(os.path.realpath(f.path) == f.path for f in scan.files)
    assert scan.skipped == {"broken_link": 1, "not_regular_file": 1, "no_reader": 1, "duplicate": 5,
                            "duplicate_folder": 1, "symlink_loop": 1}
    assert resolve_inputs(["in"]) == scan_inputs(["in"]).files
    # The output folder reached through a link inside an input folder is not read back.
    os.symlink(tmp_path / "elsewhere", tmp_path / "out")
    assert "outside/c.jsonl" not in [f.rel for f in scan_inputs(["in"], exclude=["out"]).files]


def test_named_files_that_cannot_be_read_are_one_clear_error(tmp_path):
    src = _tree(tmp_path)
    for name, msg in [("pipe.jsonl", "not a regular file"), ("broken.jsonl", "broken symbolic link"),
                      ("README.md", "no reader")]:
        with pytest.raises(UserError, match=msg):
            scan_inputs([str(src / name)])


def test_a_file_name_that_is_not_utf8_travels_and_reads(tmp_path):
    src = _tree(tmp_path)
    files = resolve_inputs([str(src)])
    tasks = write_input_list(files, str(tmp_path / "inputs.jsonl"), ReadConfig())
    assert sorted(f.path for t in tasks for f in files_in(t)) == sorted(f.path for f in files)  # the real path comes back, byte for byte
    docs = {d["id"]: d for t in tasks for d in read_task(t, ReadConfig())}
    assert docs["caf\\xe9.txt"]["text"] == "a file whose name is latin-1"
    assert docs["caf\\xe9.txt"]["source"].endswith("/in/caf\\xe9.txt")
    assert docs["hf"]["source"].endswith("blob0123")


# ---------------------------------------------------------------- end to end


def test_hostile_folder_end_to_end(tmp_path):
    src = _tree(tmp_path)
    (src / "bad.jsonl").write_text(
        r'{"id": "surrogate", "text": "lone \ud800 surrogate in a perfectly ordinary sentence"}' + "\n"
        + '{"id": "deep", "text": ' + "[" * 50_000 + "\n"
        + '{"id": "number", "text": 42}\n')
    data = _pages(True)
    (src / "lies.warc.gz").write_bytes(_set_length(data, True, 2, str(_length_of(data, True, 2) - 9).encode()))
    (src / "swallow.warc").write_bytes(_swallow_next(_warc([(f"http://s/{i}", "text/plain", b"swallowed? " * 9,
                                                             "200 OK") for i in range(3)], gz=False), 0))
    (src / "charset.warc.gz").write_bytes(_warc([
        ("http://odd/", "text/plain; charset=x-unknown-foo", b"plain words under an odd label", "200 OK"),
        ("http://utf7/", "text/plain; charset=utf-7", b"seven +2ADYAA- bits", "200 OK"),
        ("http://img/", "image/png", b"\x89PNG", "200 OK")]))
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
                   src / "none.parquet")
    sets = [f"{s}.enabled=false" for s in ("language", "quality", "pii", "dedup", "tokenize", "shards")]
    rc, out_rows, report = run_prepare(tmp_path / "out", [src, src / "a.jsonl"], sets=sets)
    assert rc == 0
    ids = Counter(r["id"] for r in out_rows)
    assert max(ids.values()) == 1, [i for i, n in ids.items() if n > 1]
    got = {r["url"] or r["id"]: r["dropped_by"] for r in out_rows}
    urls = [f"http://x/{i}" for i in range(5)]
    want = {"a": None, "b": None, "c": None, "hf": None, "caf\\xe9.txt": None, "surrogate": None,
            **{u: "read:warc_length_mismatch" if u.endswith("2") else None for u in urls},
            "http://s/0": "read:warc_length_mismatch", "http://s/1": None, "http://s/2": None,
            "http://odd/": None, "http://utf7/": None, "http://img/": "read:unsupported_media_type",
            "none.parquet": "read:empty_file"}
    assert {k: got.get(k, "MISSING") for k in want} == want
    reasons = Counter(r["dropped_by"] for r in out_rows)
    assert reasons["read:too_deep"] == 1 and reasons["read:text_not_string"] == 1
    assert report["documents"]["read"] == len(out_rows)


# ---------------------------------------------------------------- names, folders, Parquet bombs, charsets


def test_a_file_whose_name_holds_glob_characters_is_read_by_that_name(tmp_path):
    for name in ("br[ack]et.jsonl", "star*.jsonl", "q?.jsonl"):
        (tmp_path / name).write_text(json.dumps({"id": name, "text": "words"}) + "\n")
    (tmp_path / "bret.jsonl").write_text(json.dumps({"id": "bret", "text": "words"}) + "\n")
    for name in ("br[ack]et.jsonl", "star*.jsonl", "q?.jsonl"):
        assert [d["id"] for d in read_all(tmp_path / name)] == [name]  # only that file, not a glob
    # A pattern that names no file as written is still a glob.
    assert {d["id"] for d in read_all(tmp_path / "b*.jsonl")} == {"br[ack]et.jsonl", "bret"}


def test_an_empty_folder_and_the_output_folder_are_not_called_missing(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="a folder with no files in it"):
        scan_inputs([str(tmp_path / "empty")])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(UserError, match="inside the output folder"):
        scan_inputs([str(tmp_path / "out")], exclude=[str(tmp_path / "out")])
    with pytest.raises(UserError, match="input not found"):
        scan_inputs([str(tmp_path / "nowhere")])


def test_a_dictionary_encoded_parquet_bomb_stops_at_the_inflate_limit(tmp_path):
    # 400 rows of one 10 KB string: a few KB on disk, 4 MB of text.
    text = ("lorem ipsum dolor sit amet " * 400)[:10_000]
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(400)], "text": pa.array([text] * 400).dictionary_encode()}),
                   tmp_path / "bomb.parquet", compression="zstd")
    assert (tmp_path / "bomb.parquet").stat().st_size < 20_000
    docs = read_all(tmp_path / "bomb.parquet", ReadConfig(max_inflated_bytes=100_000, max_inflate_ratio=2))
    assert Counter(d["dropped_by"] for d in docs) == {None: 10, "read:inflate_limit": 1}
    assert docs[-1]["id"] == "bomb.parquet:10"
    assert Counter(d["dropped_by"] for d in read_all(tmp_path / "bomb.parquet")) == {None: 400}  # defaults: all read


def test_parquet_without_a_text_column_gives_every_row_its_row(tmp_path):
    pq.write_table(pa.table({"id": [f"n{i}" for i in range(50)], "body": ["x"] * 50}), tmp_path / "ids.parquet",
                   row_group_size=20)
    pq.write_table(pa.table({"body": ["x"] * 7}), tmp_path / "bare.parquet")
    docs = read_all(tmp_path / "ids.parquet")
    assert [d["id"] for d in docs] == [f"n{i}" for i in range(50)]
    assert {d["dropped_by"] for d in docs} == {"read:no_text_field"}
    assert [d["id"] for d in read_all(tmp_path / "bare.parquet")] == [f"bare.parquet:{i}" for i in range(7)]


@pytest.mark.parametrize("label", ["cp037", "cp500", "unicode_escape", "raw_unicode_escape", "idna", "hex"])
def test_charset_labels_that_are_no_web_charset_are_ignored(label, tmp_path):
    from tokenmill.transforms.extract import extract_html
    from tokenmill.transforms.readers.json_and_text import decode_text

    words = "Caf\xe9 na\xefve r\xe9sum\xe9: the quiet river runs past the old mill at C:\\new folder."
    page = f"<html><head><meta charset={label}></head><body><p>{words}</p></body></html>".encode("latin-1")
    r = extract_html(page)
    assert r.reason is None and r.encoding == "cp1252" and r.text == words
    assert decode_text(words.encode(), label) == (words, None)  # UTF-8 under the odd label: read
    assert decode_text("plain text".encode("utf-16"), "utf-16") == ("plain text", None)  # still honoured


def test_a_loop_of_symlinks_in_a_folder_is_one_counted_skip(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text('{"id": "a", "text": "file a"}\n')
    os.symlink("loop.jsonl", src / "loop.jsonl")  # resolves to itself: stat fails with ELOOP
    scan = scan_inputs([str(src)])
    assert [f.rel for f in scan.files] == ["a.jsonl"] and scan.skipped == {"symlink_loop": 1}
    with pytest.raises(UserError, match="loop of symbolic links"):
        scan_inputs([str(src / "loop.jsonl")])  # named, it is one clear error

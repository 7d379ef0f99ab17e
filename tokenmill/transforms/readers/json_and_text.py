"""The readers of records that are JSON objects (JSONL lines, Parquet rows) and of one-document
files (HTML, txt), and charset decoding."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from typing import Any

from tokenmill.config import ReadConfig
from tokenmill.transforms.doc import new_doc

from .formats import compression
from .streams import (
    STREAM_ERRORS,
    InflateLimit,
    broken,
    inflate_limit,
    open_decompressed,
    open_raw,
    read_capped,
    read_line,
    skip_blank_lines,
    stream_reason,
)
from .tasks import Unit

# Python codecs that are no charset a document is written in: they turn a backslash, a dot or
# a hyphen of plain text into something else.
_NOT_CHARSETS = frozenset(("unicode-escape", "raw-unicode-escape", "idna", "punycode", "undefined"))


def _codec(charset: str) -> str | None:
    """Python's name for a charset label, or None when it names no text encoding, or one in which
    ASCII is not ASCII (EBCDIC's cp037/cp500: a label no browser honours, and it turns a page of
    Latin-1 into garbage that would be kept as text). UTF-16 and -32 are the exceptions."""
    try:
        info = codecs.lookup(charset)
    except (LookupError, ValueError, TypeError):
        return None
    if not getattr(info, "_is_text_encoding", True) or info.name in _NOT_CHARSETS:
        return None
    if not info.name.startswith(("utf-16", "utf-32")) and not _ascii_compatible(info.name):
        return None
    return info.name


def _ascii_compatible(name: str) -> bool:
    probe = b"<p>Text: a-z, 0-9.</p>\n"
    try:
        return probe.decode(name) == probe.decode("ascii")
    except (UnicodeError, LookupError):
        return False


def decode_text(data: bytes, charset: str | None) -> tuple[str | None, str | None]:
    """(text, None), or (None, reason). A label Python does not know (``x-unknown``, ``binary``)
    falls back to UTF-8, so ASCII under an odd label reads; bytes that fit neither are
    ``unknown_charset``, and ``invalid_utf8`` is said only where UTF-8 was what they had to be."""
    codec = _codec(charset) if charset else "utf-8"
    for name in dict.fromkeys(c for c in (codec, "utf-8") if c):
        try:
            return data.decode(name).removeprefix("\ufeff"), None
        except (UnicodeError, LookupError):
            pass
    if codec is None:
        return None, "unknown_charset"
    return None, "invalid_utf8" if codec == "utf-8" else "invalid_encoding"


def _record_from_mapping(obj: dict, cfg: ReadConfig, default_id: str, source: str) -> dict[str, Any]:
    """A JSON object or Parquet row to a doc. Values of any type are taken: ``new_doc`` makes ids
    and urls text; a text that is no string is a drop."""
    rid = obj.get(cfg.id_field)
    rid = default_id if rid is None or rid == "" else rid
    url = obj.get(cfg.url_field)
    text = obj.get(cfg.text_field)
    if isinstance(text, bytes):  # a Parquet binary column
        text, bad = decode_text(text, None)
        if bad:
            return new_doc(rid, source, url=url, dropped_by=f"read:{bad}")
    html = obj.get(cfg.html_field) if cfg.html_field else None
    if isinstance(text, str) and text.strip():
        kind, value = "text", text
    elif isinstance(html, (str, bytes)) and html:
        kind, value = "html", html
    else:
        reason = "no_text_field" if text is None or isinstance(text, str) else "text_not_string"
        return new_doc(rid, source, url=url, dropped_by=f"read:{reason}")
    if len(value) > cfg.max_record_bytes:  # a Parquet cell (a JSONL line is capped as it is read)
        return new_doc(rid, source, url=url, dropped_by="read:too_large")
    return new_doc(rid, source, url=url, **{kind: value})


def _json_record(line: bytes, cfg: ReadConfig, default_id: str, source: str) -> dict[str, Any]:
    try:
        obj = json.loads(line.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError:
        return new_doc(default_id, source, dropped_by="read:invalid_utf8")
    except RecursionError:  # nested deeper than the interpreter's stack: [[[[...
        return new_doc(default_id, source, dropped_by="read:too_deep")
    except ValueError:
        return new_doc(default_id, source, dropped_by="read:invalid_json")
    if not isinstance(obj, dict):
        return new_doc(default_id, source, dropped_by="read:not_an_object")
    return _record_from_mapping(obj, cfg, default_id, source)


def read_jsonl(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    f = unit.file
    limit = inflate_limit(f, cfg) if compression(f.rel) else None  # a plain file's size bounds it
    # Compressed files are never split: they stop past their inflate limit.
    stop = unit.end if unit.end is not None else limit + 1 if limit is not None else 1 << 62
    with open_decompressed(f) as fh:
        pos = 0
        if unit.start > 0:
            # Start after the first newline at or past start-1: the previous unit owns the
            # line that straddles the boundary (it reads while a line *starts* before its end).
            fh.seek(unit.start - 1)
            _, skipped = read_line(fh, cfg.max_record_bytes)
            pos = unit.start - 1 + skipped
        while pos < stop:
            default_id = f"{f.rel}:{pos}"  # byte offset: the same however the file is split
            try:
                blank = skip_blank_lines(fh, stop - pos)
                budget = None if limit is None else limit - pos
                line, n = (b"", blank) if blank else read_line(fh, cfg.max_record_bytes, budget)
            except STREAM_ERRORS as e:
                yield broken(default_id, f, stream_reason(e), e)
                return
            if n == 0:
                return
            pos += n
            if line is None:
                yield new_doc(default_id, f.path, dropped_by="read:too_large")
            elif line.strip():
                yield _json_record(line, cfg, default_id, f.path)
        if limit is not None and pos > limit:
            yield broken(f"{f.rel}:{pos}", f, "inflate_limit", InflateLimit(f"inflates past {limit} bytes"))


# Rows per Arrow batch: a batch is decoded whole (and then made Python objects), so this many
# cells of up to max_record_bytes are held at once.
_PARQUET_BATCH = 64


def read_parquet(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    """Rows of a row-group range. Dictionary and RLE encoding make Parquet a compressed format
    too (one 1 MB string repeated 2,000 times is a 5 KB file), so the text read is held to the
    inflate limit; past it the rest of the unit is one row, read:inflate_limit."""
    import pyarrow.parquet as pq

    f = unit.file
    row = unit.first_row
    limit, inflated = inflate_limit(f, cfg), 0
    try:
        with open_raw(f.path) as fh:
            pf = pq.ParquetFile(fh)
            wanted = {cfg.id_field, cfg.url_field, cfg.text_field, cfg.html_field} - {None}
            columns = [c for c in pf.schema_arrow.names if c in wanted]
            groups = list(range(unit.start, unit.end or pf.metadata.num_row_groups))
            if not columns:  # not even an id: each row still gets its row (read:no_text_field)
                for _ in range(sum(pf.metadata.row_group(g).num_rows for g in groups)):
                    yield new_doc(f"{f.rel}:{row}", f.path, dropped_by="read:no_text_field")
                    row += 1
                return
            for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, row_groups=groups, columns=columns):
                for obj in batch.to_pylist():
                    inflated += sum(len(v) for v in (obj.get(cfg.text_field), obj.get(cfg.html_field or ""))
                                    if isinstance(v, (str, bytes)))
                    if inflated > limit:
                        yield broken(f"{f.rel}:{row}", f, "inflate_limit",
                                      InflateLimit(f"its text passes {limit} bytes"))
                        return
                    yield _record_from_mapping(obj, cfg, f"{f.rel}:{row}", f.path)
                    row += 1
    except Exception as e:  # a corrupt page or footer: keep what was read, say where it broke
        yield broken(f"{f.rel}:{row}", f, "corrupt_file", e)


def _read_whole(unit: Unit, cfg: ReadConfig) -> tuple[bytes | None, dict | None]:
    """The bytes of a one-document file, or a dropped doc saying why not."""
    f = unit.file
    try:
        with open_decompressed(f) as fh:
            data = read_capped(fh, cfg.max_record_bytes)
    except STREAM_ERRORS as e:
        return None, broken(f.rel, f, stream_reason(e), e)
    if data is None:
        return None, new_doc(f.rel, f.path, dropped_by="read:too_large")
    if not data.strip():
        return None, new_doc(f.rel, f.path, dropped_by="read:empty_file")
    return data, None


def read_html(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    data, bad = _read_whole(unit, cfg)
    yield bad or new_doc(unit.file.rel, unit.file.path, html=data)


def read_txt(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    data, bad = _read_whole(unit, cfg)
    if bad:
        yield bad
        return
    text, bad = decode_text(data, None)
    yield new_doc(unit.file.rel, unit.file.path, text=text, dropped_by=bad and f"read:{bad}")

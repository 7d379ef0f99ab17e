"""The document record that flows through every stage, and the cleaned-docs Parquet schema.

A document is a plain ``dict`` (cheap to pickle between Beam workers, no class to import on
the worker). Stages never delete a dropped document: they set ``dropped_by`` to
``"stage:reason"`` and pass it on, so the docs Parquet holds one row per record read.

Transient keys (not written): ``html`` (raw bytes or str to extract), ``encoding`` (a charset
hint from HTTP headers or the file).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from typing import Any, TypedDict

import pyarrow as pa
import pyarrow.parquet as pq


class Doc(TypedDict, total=False):
    """A document as it flows through the stages (a plain dict at run time). The fields up to
    ``dropped_by`` are the docs Parquet's base columns, in this order; stages add theirs (their
    ``SPEC.fields``)."""

    id: str | None
    url: str | None
    source: str
    text: str | None
    lang: str | None
    lang_score: float | None
    dup_cluster: str | None
    dup_cluster_size: int | None
    dropped_by: str | None
    # Transient, never written: the raw page to extract, and a charset hint from HTTP or the file.
    html: bytes | str | None
    encoding: str | None


TRANSIENT_KEYS = ("html", "encoding")
_ARROW = {"str": pa.string(), "float": pa.float32(), "int": pa.int32()}


def _arrow_type(annotation) -> pa.DataType:
    text = getattr(annotation, "__forward_arg__", annotation)  # TypedDict keeps ForwardRefs
    return _ARROW[text.split("|")[0].strip()]


BASE_FIELDS: list[pa.Field] = [pa.field(name, _arrow_type(t)) for name, t in Doc.__annotations__.items()
                               if name not in TRANSIENT_KEYS]


def docs_schema(extra_fields: list[pa.Field] | None = None) -> pa.Schema:
    fields = list(BASE_FIELDS)
    if extra_fields:
        fields[-3:-3] = extra_fields  # signals sit before dup_cluster / dup_cluster_size / dropped_by
    return pa.schema(fields)


# Every record is born in ``new_doc``, so every string an input gives it is made writable there:
# one lone surrogate (a JSON \ud800 escape, a UTF-7 charset, a file name that is not UTF-8)
# makes Arrow's Parquet writer and the tokenizer raise, and would end the job.
_SURROGATES = re.compile("[\ud800-\udfff]")
# Ids, urls and charset labels longer than this keep a head and a hash of the whole (still unique):
# a 10 MB id would otherwise be copied into every stage, shuffle and report sample.
MAX_LABEL_CHARS = 2048


def clean_text(s: str) -> str:
    """``s`` with each lone surrogate replaced by U+FFFD (a valid string is returned as it is)."""
    if s.isascii():  # O(1) in CPython: most strings stop here
        return s
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", s)


def path_text(path: str) -> str:
    """A file path as text: the bytes of a name that is not UTF-8 (which Python carries as
    surrogate escapes) become ``\\xNN``, so the name stays recognisable."""
    if path.isascii():
        return path
    try:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that is no escaped byte
        return clean_text(path)


def label(value: Any) -> str | None:
    """An id, url or charset label from an input as bounded, writable text, whatever its type
    (JSON gives numbers, lists and objects too; Parquet gives bytes)."""
    if value is None or isinstance(value, str):
        s = value
    elif isinstance(value, bytes):
        s = value.decode("utf-8", "backslashreplace")
    else:
        try:
            s = str(value)
        except RecursionError:  # a list nested hundreds deep: repr gives up before json.loads did
            s = f"<{type(value).__name__} nested too deep>"
    if s is None:
        return None
    s = clean_text(s)
    if len(s) > MAX_LABEL_CHARS:
        digest = hashlib.sha1(s.encode()).hexdigest()[:16]
        s = f"{s[: MAX_LABEL_CHARS - 24]}...sha1:{digest}"
    return s


def new_doc(
    id: Any,
    source: str,
    *,
    url: Any = None,
    text: str | None = None,
    html: bytes | str | None = None,
    encoding: str | None = None,
    dropped_by: str | None = None,
) -> Doc:
    """A record as read. Every string from the input passes here and leaves writable and
    bounded (see ``clean_text``, ``label``); ``text`` and ``html`` are not bounded here: the
    readers cap a record at ``max_record_bytes``."""
    doc: Doc = dict.fromkeys(Doc.__annotations__)  # every field, None until a stage sets it
    doc.update(id=label(id), url=label(url), source=path_text(source),
               text=None if text is None else clean_text(text),
               html=clean_text(html) if isinstance(html, str) else html, encoding=label(encoding),
               dropped_by=dropped_by)
    return doc


def stored(x: float) -> float:
    """``x`` as the docs Parquet keeps it (float32). Decisions are taken on this value, so a row's
    values are exactly what its filters saw, and refilter decides the same from them."""
    import numpy as np

    return float(np.float32(x))


def drop(doc: dict[str, Any], stage: str, reason: str) -> dict[str, Any]:
    """Mark ``doc`` as dropped by ``stage`` for ``reason`` (first drop wins)."""
    if not doc.get("dropped_by"):
        doc["dropped_by"] = f"{stage}:{reason}"
    return doc


def is_dropped(doc: dict[str, Any]) -> bool:
    return bool(doc.get("dropped_by"))


def to_row(doc: dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """The Parquet row for ``doc``: only schema columns, transient keys left out."""
    return {name: doc.get(name) for name in schema.names}


class DocsFile:
    """One docs Parquet file (zstd), streamed: rows are buffered up to ``row_group_bytes`` of
    text and written as a row group, so memory is one row group whatever the file's size.
    Written under a temporary name and renamed on ``close``.

    Rows wait as Arrow record batches of ``batch_rows``, not as Python dicts: held as Python
    rows, the texts' many heap blocks pin the worker's heap and the peak grows with the row
    group's size; held in Arrow, it does not (bench/MEASUREMENTS.md: docs rows wait in Arrow).
    The files are byte-identical to writing the rows in one go."""

    def __init__(self, path: str, schema: pa.Schema, row_group_bytes: int = 8 << 20, batch_rows: int = 256):
        from tokenmill.transforms.atomic_file import TempFile

        self._file = TempFile(path)
        self._writer = pq.ParquetWriter(self._file.fh, schema, compression="zstd")
        self._schema, self._limit, self._batch_rows = schema, row_group_bytes, batch_rows
        self._rows: list[dict[str, Any]] = []
        self._batches: list[pa.RecordBatch] = []
        self._bytes = 0

    def add(self, doc: dict[str, Any]) -> None:
        self._rows.append(to_row(doc, self._schema))
        self._bytes += len(doc.get("text") or "") + 200
        if len(self._rows) >= self._batch_rows:
            self._to_arrow()
        if self._bytes >= self._limit:
            self._flush()

    def _to_arrow(self) -> None:
        if self._rows:
            self._batches.append(pa.RecordBatch.from_pylist(self._rows, schema=self._schema))
            self._rows = []

    def _flush(self) -> None:
        self._to_arrow()
        if self._batches:
            # One chunk per column: page boundaries then depend on the rows alone, not on batching.
            table = pa.Table.from_batches(self._batches, schema=self._schema).combine_chunks()
            self._writer.write_table(table, row_group_size=table.num_rows)
        self._batches, self._bytes = [], 0

    def abandon(self) -> None:
        with contextlib.suppress(Exception):  # its footer goes to a file about to be deleted
            self._writer.close()
        self._file.abandon()

    def close(self) -> None:
        self._flush()
        self._writer.close()
        self._file.commit()

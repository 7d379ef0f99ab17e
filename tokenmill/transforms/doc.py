"""The document record that flows through every stage, and the cleaned-docs Parquet schema.

A document is a plain ``dict`` (cheap to pickle between Beam workers, no class to import on
the worker). Stages never delete a dropped document: they set ``dropped_by`` to
``"stage:reason"`` and pass it on, so the docs Parquet holds one row per record read.

Transient keys (not written): ``html`` (raw bytes or str to extract), ``encoding`` (a charset
hint from HTTP headers or the file).
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pyarrow as pa
import zstandard

from tokenmill.memory import tame_allocators

TRANSIENT_KEYS = ("html", "encoding")
# zstd contexts are not thread-safe, and Beam's multi_threading mode shares a process.
_zstd = threading.local()

# Set where documents are defined, so it holds on every worker of every runner.
tame_allocators()

# Columns of OUT/docs/*.parquet in order. Later stages (quality signals) add their columns
# through ``extra_fields``.
BASE_FIELDS: list[pa.Field] = [
    pa.field("id", pa.string()),
    pa.field("url", pa.string()),
    pa.field("source", pa.string()),
    pa.field("text", pa.string()),
    pa.field("lang", pa.string()),
    pa.field("lang_score", pa.float32()),
    pa.field("dup_cluster", pa.string()),
    pa.field("dropped_by", pa.string()),
]


def docs_schema(extra_fields: list[pa.Field] | None = None) -> pa.Schema:
    fields = list(BASE_FIELDS)
    if extra_fields:
        fields[-2:-2] = extra_fields  # signals sit before dup_cluster / dropped_by
    return pa.schema(fields)


def new_doc(
    id: str,
    source: str,
    *,
    url: str | None = None,
    text: str | None = None,
    html: bytes | str | None = None,
    encoding: str | None = None,
    dropped_by: str | None = None,
) -> dict[str, Any]:
    return {
        "id": id,
        "url": url,
        "source": source,
        "text": text,
        "html": html,
        "encoding": encoding,
        "lang": None,
        "lang_score": None,
        "dup_cluster": None,
        "dropped_by": dropped_by,
    }


def drop(doc: dict[str, Any], stage: str, reason: str) -> dict[str, Any]:
    """Mark ``doc`` as dropped by ``stage`` for ``reason`` (first drop wins)."""
    if not doc.get("dropped_by"):
        doc["dropped_by"] = f"{stage}:{reason}"
    return doc


def is_dropped(doc: dict[str, Any]) -> bool:
    return bool(doc.get("dropped_by"))


def pack(doc: dict[str, Any]) -> bytes:
    """``doc`` as compact bytes, for a shuffle that must carry whole documents (dedup's join).
    Beam's local runner holds 5-10x the bytes it shuffles; zstd takes the pickles to about
    half (dedup alone on 20,000 survivors, local runner: 1,871 -> 1,606 MB peak). Level -1, not
    1: on bench/stages.py's 8,092 docs 10.0 MB instead of 8.5 (of 16.8) at half the CPU
    (44 + 16 ms against 81 + 35 to compress + decompress), and the same peak in
    bench/scaling.py's survivor-heavy 20k run."""
    return _zstd_contexts().c.compress(pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL))


def unpack(blob: bytes) -> dict[str, Any]:
    return pickle.loads(_zstd_contexts().d.decompress(blob))


def _zstd_contexts():
    if not hasattr(_zstd, "c"):
        _zstd.c, _zstd.d = zstandard.ZstdCompressor(level=-1), zstandard.ZstdDecompressor()
    return _zstd


def partition_dropped(doc: dict[str, Any], _n: int) -> int:
    """For ``beam.Partition(partition_dropped, 2)``: 0 for a live doc, 1 for a dropped one."""
    return int(is_dropped(doc))


def to_row(doc: dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """The Parquet row for ``doc``: only schema columns, transient keys left out."""
    return {name: doc.get(name) for name in schema.names}

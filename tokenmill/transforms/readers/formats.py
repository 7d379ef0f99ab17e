"""Every input format, declared once: the names that tell it, its reader, how a big file of it
is cut into units of work, and what an input byte of it is worth in token bytes (to size the
buckets before anything is read). ``detect_format``, the readers' dispatch, the split plan and
``buckets.estimate_token_bytes`` all read ``FORMATS``: a new format is one entry here (and its
reader function).

A name is matched once its compression suffix is taken off (``.gz``, ``.zst``, ``.zstd``: the
codecs the readers decompress); the entries are tried in order, the first that matches wins.
"""

from __future__ import annotations

import importlib
import posixpath
from collections.abc import Callable
from dataclasses import dataclass

# What the readers decompress, by suffix; ``COMPRESSED`` also names codecs a file may be stored
# with that no reader takes, which still say its bytes inflate.
CODECS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
COMPRESSED = (*CODECS, ".bz2", ".xz")
# Token bytes per input byte, for sizing only (a wrong guess changes shard sizes, not output
# content): text ~0.4 (about 4.5 characters a token, 2 bytes each); HTML and WARC ~0.05 (the main
# text is a small part of a page's bytes); compressed bytes inflate ~4x.
TEXT_RATIO, MARKUP_RATIO, INFLATE = 0.4, 0.05, 4.0
# WARC metadata records (WAT): JSON about pages, no text to train on.
NO_READER = (".wat",)


@dataclass(frozen=True)
class Format:
    name: str  # the reader's name (Unit.fmt)
    suffixes: tuple[str, ...]  # of the file name, its compression suffix taken off
    reader: str  # "module:function" in this package, imported on first use
    token_ratio: float  # token bytes per (inflated) input byte
    # How a file bigger than read.split_bytes is cut: "bytes" (line-aligned byte ranges, when
    # the file is not compressed), "row_groups" (runs of Parquet row groups), None (whole).
    split: str | None = None
    inflates: bool = False  # compressed by its own format (Parquet): sized as compressed bytes
    contains: tuple[str, ...] = ()  # also matched when the name holds one of these anywhere

    def matches(self, name: str) -> bool:
        return name.endswith(self.suffixes) or any(c in name for c in self.contains)


FORMATS: tuple[Format, ...] = (
    # WET: WARC framing around plain-text payloads, so it is sized as text.
    Format("warc", (".wet",), "warc:read_warc", TEXT_RATIO),
    Format("warc", (".warc", ".arc"), "warc:read_warc", MARKUP_RATIO, contains=(".warc.",)),
    Format("jsonl", (".jsonl", ".ndjson", ".json"), "json_and_text:read_jsonl", TEXT_RATIO, split="bytes"),
    Format("parquet", (".parquet",), "json_and_text:read_parquet", TEXT_RATIO, split="row_groups", inflates=True),
    Format("html", (".html", ".htm", ".xhtml"), "json_and_text:read_html", MARKUP_RATIO),
    Format("txt", (".txt",), "json_and_text:read_txt", TEXT_RATIO),
)
_BY_NAME = {f.name: f for f in FORMATS}


def compression(path: str) -> str | None:
    """The codec a reader decompresses ``path`` with, by its suffix, or None."""
    p = path.lower()
    return next((codec for suffix, codec in CODECS.items() if p.endswith(suffix)), None)


def format_of(path: str, codecs: tuple[str, ...] = tuple(CODECS)) -> Format | None:
    """The format entry for ``path`` by its name (``codecs``: the suffixes taken off first)."""
    name = posixpath.basename(path).lower()
    for suffix in codecs:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if name.endswith(NO_READER):
        return None
    return next((f for f in FORMATS if f.matches(name)), None)


def detect_format(path: str) -> str | None:
    """The reader for ``path`` by its name, or None when no reader handles it."""
    f = format_of(path)
    return f.name if f else None


def reader(name: str) -> Callable:
    """The reader function of format ``name``."""
    module, _, function = _BY_NAME[name].reader.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)


def split_rule(path: str) -> str | None:
    """How a big file at ``path`` is cut ("bytes", "row_groups"), or None (read whole): byte
    ranges need an uncompressed file."""
    f = format_of(path)
    if f is None or f.split is None or (f.split == "bytes" and compression(path) is not None):
        return None
    return f.split


def estimate_token_bytes(path: str, size: int) -> float:
    """Token bytes ``size`` input bytes at ``path`` will give, roughly (see FORMATS)."""
    f = format_of(path, COMPRESSED)
    compressed = path.lower().endswith(COMPRESSED) or (f is not None and f.inflates)
    return size * (INFLATE if compressed else 1.0) * (f.token_ratio if f else TEXT_RATIO)

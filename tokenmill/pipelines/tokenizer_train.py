"""``tokenmill tokenizer train``: a tokenizer.json (BPE, WordPiece or Unigram) trained on
cleaned documents: a prepared OUT folder (its surviving docs) or raw inputs, which go through
the same read -> extract -> normalize cores as the pipeline."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator

import pyarrow.parquet as pq

from tokenmill.config import load_config
from tokenmill.errors import UserError
from tokenmill.format import exists, join, local_view
from tokenmill.transforms.extract import extract_doc
from tokenmill.transforms.normalize import normalize_text
from tokenmill.transforms.readers import Unit, plan_units, read_unit, resolve_inputs
from tokenmill.transforms.tokenization import train_tokenizer


def prepared_texts(out: str) -> Iterator[str]:
    for path in sorted(glob.glob(os.path.join(out, "docs", "*.parquet"))):
        table = pq.read_table(path, columns=["text", "dropped_by"])
        for text, dropped in zip(table.column("text").to_pylist(), table.column("dropped_by").to_pylist()):
            if text and not dropped:
                yield text


def raw_texts(paths: list[str]) -> Iterator[str]:
    cfg = load_config()
    for f in resolve_inputs(paths):
        for unit in plan_units(f, cfg.read):
            if not isinstance(unit, Unit):
                continue
            for doc in read_unit(unit, cfg.read):
                if doc.get("dropped_by"):
                    continue
                doc = extract_doc(doc, cfg.extract)
                if not doc.get("dropped_by") and doc.get("text"):
                    yield normalize_text(doc["text"], cfg.normalize)


def input_texts(inputs: list[str], max_docs: int) -> Iterator[str]:
    """Cleaned texts of ``inputs`` (an OUT folder's kept docs, or raw inputs through the cores),
    at most ``max_docs``."""
    n = 0
    for path in inputs:
        if "://" in path and exists(join(path, "manifest.json")):  # a prepared OUT on an object store
            path = local_view(path, files=True)
        source = prepared_texts(path) if os.path.isdir(os.path.join(path, "docs")) else raw_texts([path])
        for text in source:
            yield text
            n += 1
            if n >= max_docs:
                return


def train_from_inputs(inputs: list[str], output: str, kind: str, vocab_size: int, max_docs: int) -> int:
    def texts() -> Iterator[str]:
        return input_texts(inputs, max_docs)

    counted = []
    tok = train_tokenizer((counted.append(1) or t for t in texts()), vocab_size=vocab_size, kind=kind)
    if not counted:
        raise UserError(f"no text found in {', '.join(inputs)}")
    tok.save(output)
    return len(counted)

"""Writing the output format from the pipeline: shard files streamed to OUT/shards under a
temporary name and renamed, and the manifest, written last, after every shard, so a crashed run
never leaves an output that looks complete. The format itself is tokenmill/format.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.beamfs import FileSystems
from tokenmill.format import ShardWriter, build_manifest, load_manifest, shard_name, shard_schema
from tokenmill.transforms.atomic_file import TempFile
from tokenmill.transforms.stage_base import Stage


class _HashingSink:
    """A binary file that hashes and counts what goes through it (for the manifest's sha256)."""

    def __init__(self, fh):
        self._fh, self.sha, self.size, self.closed = fh, hashlib.sha256(), 0, False

    def write(self, data) -> int:
        data = bytes(data)
        self._fh.write(data)
        self.sha.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if not self.closed:
            self._fh.close()
            self.closed = True


class ShardFile:
    """One shard written straight to OUT/shards (a temporary name, renamed on ``close``), its
    manifest entry returned by ``close``."""

    def __init__(self, out: str, split: str, index: int, count: int, schema: pa.Schema, batch_tokens: int):
        self.split, self.name = split, shard_name(split, index, count)
        self._file = TempFile(FileSystems.join(out, "shards", self.name))
        self._sink = _HashingSink(self._file.fh)
        self._writer = ShardWriter(pa.PythonFile(self._sink, mode="w"), schema, batch_tokens)

    def add(self, doc_id: str, tokens: np.ndarray) -> None:
        self._writer.add(doc_id, tokens)

    def abandon(self) -> None:
        with contextlib.suppress(Exception):  # its footer goes to a file about to be deleted
            self._writer.close()
        self._file.abandon()

    def close(self) -> dict[str, Any]:
        self._writer.close()
        self._sink.close()
        self._file.commit()
        return {"split": self.split, "file": f"shards/{self.name}", "docs": self._writer.docs,
                "tokens": self._writer.tokens, "bytes": self._sink.size, "sha256": self._sink.sha.hexdigest()}


def write_atomically(path: str, data: bytes) -> None:
    f = TempFile(path)
    try:
        f.fh.write(data)
    except BaseException:
        f.abandon()
        raise
    f.commit()


def write_shard(key: tuple[str, int, int], rows: list[tuple[str, np.ndarray]], out: str, dtype: str,
                tok: dict[str, Any], batch_tokens: int) -> dict[str, Any]:
    """A shard of ``rows`` in any order (sorted here as the pipeline sorts: by id), for tests and
    benches that make shards without running ``prepare``."""
    split, index, count = key
    shard = ShardFile(out, split, index, count, shard_schema(np.dtype(dtype), tok), batch_tokens)
    for doc_id, tokens in sorted(rows, key=lambda r: (r[0], r[1].tobytes())):
        shard.add(doc_id, tokens)
    return shard.close()


def write_manifest(shards: list[dict], out: str, tok: dict, dtype: str, config: dict, version: str,
                   extractor: dict | None = None) -> dict:
    manifest = build_manifest(shards, tok, dtype, config, version, extractor)
    write_atomically(FileSystems.join(out, "manifest.json"), json.dumps(manifest, indent=2).encode("utf-8"))
    return manifest


def warn_if_empty(out: str) -> None:
    """The launcher's warning, once a job has published OUT, that no document survived. Not the
    manifest step's: a worker's log may be on another host, and a runner that goes on with other
    stages after one failed (Prism) would have it said before the job's error."""
    if not any(split["docs"] for split in load_manifest(out)["splits"].values()):
        import logging

        logging.getLogger("tokenmill").warning("no documents survived: the manifest is empty and there are no shards")


# The finish phase writes the shards from the tokenized survivors: nothing is dropped here, and
# nothing stored, that refilter would not write again.
SPEC = Stage("shards", "shards", phase="later", funnel=False, refilter="rerun")

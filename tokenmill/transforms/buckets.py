"""Buckets: documents wait in files, not in a shuffle, while dedup decides on small records.

The clean phase streams every live document into candidate files under the run's stage
folder and sends on a ``Locator`` (id, node key, file, offset) keyed by the document's bucket,
a hash of its id. The finish phase gets, per bucket, its locators and dedup's verdicts (small
records through one GroupByKey), reads the documents back in id order, applies the verdicts,
tokenizes the survivors and writes the bucket's shards. A worker holds one bucket's locators
and one batch of documents, whatever the corpus size.

The bucket count is fixed up front from the input size (``bucket_count``), so the shard count
does not wait for token totals.
"""

from __future__ import annotations

import math
import os
import pickle
import threading
import uuid
from collections import OrderedDict
from typing import Any, NamedTuple

import xxhash
import zstandard

from tokenmill.beamfs import CompressionTypes, FileSystems
from tokenmill.transforms.readers.formats import estimate_token_bytes  # noqa: F401 - sized here

TMP = ".tmp"  # under the run's stage folder; removed before the output is published

# At least this many buckets: the finish phase runs one bucket per worker at a time, and a small
# job of one bucket would leave all but one worker idle.
MIN_BUCKETS = 4
MAX_BUCKETS = 100_000
# zstd contexts are not thread-safe, and Beam's multi_threading mode shares a process.
_zstd = threading.local()


def bucket_count(files, target_bytes: int, explicit: int = 0) -> int:
    """Buckets (= shards per split) for inputs ``files`` (with ``path`` and ``size``): about
    ``target_bytes`` of tokens each, or ``explicit`` when set."""
    if explicit:
        return explicit
    est = sum(estimate_token_bytes(f.rel, f.size) for f in files)  # the name that tells the format
    return min(MAX_BUCKETS, max(MIN_BUCKETS, math.ceil(est / target_bytes)))


def bucket_of(doc_id: str | None, buckets: int) -> int:
    return xxhash.xxh3_64_intdigest((doc_id or "").encode("utf-8", "surrogatepass")) % buckets


def pack(doc: dict[str, Any]) -> bytes:
    """``doc`` as compact bytes, a frame of the candidate files: a zstd-compressed pickle, at
    level -1, which trades a slightly larger frame for less CPU than level 1
    (bench/MEASUREMENTS.md: candidate-file frames)."""
    return zstd_contexts().c.compress(pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL))


def unpack(blob: bytes) -> dict[str, Any]:
    return pickle.loads(zstd_contexts().d.decompress(blob))


def zstd_contexts():
    if not hasattr(_zstd, "c"):
        _zstd.c, _zstd.d = zstandard.ZstdCompressor(level=-1), zstandard.ZstdDecompressor()
    return _zstd


class Locator(NamedTuple):
    """Where a live document waits: sorted by (id, tie) in its bucket."""

    id: str
    tie: int  # a hash of the stored bytes: a total order among records with one id
    key: bytes | None  # its dedup node key, None if it takes no part
    file: str
    offset: int
    length: int


class CandidateWriter:
    """Append-only candidate files for one bundle, rolled at ``roll_bytes``. A new file per
    bundle: a retried bundle never writes into a file a committed one points to (its own
    files are orphans, removed with the folder)."""

    def __init__(self, folder: str, roll_bytes: int = 64 << 20):
        self._folder, self._roll = folder, roll_bytes
        self._fh, self._name, self._pos = None, "", 0

    def add(self, frame: bytes) -> tuple[str, int]:
        if self._fh is None or self._pos >= self._roll:
            self.close()
            self._name = FileSystems.join(self._folder, f"{uuid.uuid4().hex}.bin")
            self._fh = FileSystems.create(self._name, compression_type=CompressionTypes.UNCOMPRESSED)
            self._pos = 0
        at = self._pos
        self._fh.write(frame)
        self._pos += len(frame)
        return self._name, at

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class CandidateReader:
    """Reads frames back by (file, offset, length), a few files kept open."""

    def __init__(self, keep_open: int = 16):
        self._open: OrderedDict[str, object] = OrderedDict()
        self._keep = keep_open

    def read(self, loc: Locator) -> bytes:
        return self.read_at(loc.file, loc.offset, loc.length)

    def read_at(self, file: str, offset: int, length: int, kind: str = "candidate") -> bytes:
        """``length`` bytes at ``offset`` of ``file``, a temporary ``kind`` file of this run."""
        fh = self._open.pop(file, None)
        if fh is None:
            fh = FileSystems.open(file, compression_type=CompressionTypes.UNCOMPRESSED)
            while len(self._open) >= self._keep:
                self._open.popitem(last=False)[1].close()
        self._open[file] = fh
        fh.seek(offset)
        data = fh.read(length)
        if len(data) != length:
            raise OSError(f"{file}: {len(data)} bytes at offset {offset}, expected {length} "
                          f"(a temporary {kind} file was changed during the run)")
        return data

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()


def localize(locators: list[Locator], reader: CandidateReader, tmp_dir: str | None = None) -> tuple[list[Locator], str]:
    """Copies the frames of ``locators`` into one local temporary file, reading each candidate
    file once front to back (file, then offset order), and returns the locators pointing there
    with the file's path (the caller removes it). The finish phase reads a bucket in id order,
    which jumps around its candidate files: fine on a local disk, one ranged request per
    document on gs:// or s3://."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="tokenmill-bucket-", suffix=".bin", dir=tmp_dir)
    moved: dict[tuple[str, int], int] = {}
    try:
        with os.fdopen(fd, "wb") as out:
            pos = 0
            for loc in sorted(locators, key=lambda lc: (lc.file, lc.offset)):
                data = reader.read(loc)
                out.write(data)
                moved[loc.file, loc.offset] = pos
                pos += len(data)
    except BaseException:
        os.remove(path)
        raise
    return [loc._replace(file=path, offset=moved[loc.file, loc.offset]) for loc in locators], path

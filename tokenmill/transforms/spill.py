"""Shuffles through files: a bundle writes its records for each partition into a temporary
file of its own, and only a ``SpillRef`` (file, chunks, count) crosses the GroupByKey; the
group's step reads the records back (``Unspilled``).

Why: Beam's local runners hold every grouped record in memory until its stage runs, and
FnApiRunner copies a shuffle's input again while cutting it into one part per worker; cluster
runners ship it by the byte. A reference is ~150 bytes for any number of records, so the
runner's share of the decide and finish phases does not grow with the corpus (bench/MEASUREMENTS.md:
shuffles through files).

A retried bundle writes a new file, and only refs sent by a committed bundle are read, so an
orphan is never read; the files go with the run's temporary folder. A group's order of refs is
the runner's, as a GroupByKey's order of values always is: its readers do not depend on it.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import GlobalWindows

from tokenmill.transforms.buckets import CandidateReader, CandidateWriter, zstd_contexts


class SpillRef(NamedTuple):
    """One partition's records in one bundle's spill file."""

    path: str
    chunks: tuple[tuple[int, int], ...]  # (offset, length) of each zstd frame of pickles
    records: int


class Spiller:
    """A bundle's spill file. ``add(partition, record)`` buffers the record's pickle; a
    partition's buffer becomes a chunk (a zstd frame) at ``chunk_bytes``, every buffer when they
    hold ``budget_bytes`` together, so memory is bounded whatever the partition count."""

    def __init__(self, folder: str, chunk_bytes: int = 1 << 20, budget_bytes: int = 16 << 20):
        self._chunk, self._budget = chunk_bytes, budget_bytes
        self._buffers: dict[int, list[bytes]] = {}
        self._sizes: dict[int, int] = {}
        self._chunks: dict[int, list[tuple[int, int]]] = {}
        self._counts: dict[int, int] = {}
        self._held = 0
        self._path = ""
        # One file for the whole bundle (never rolled): a ref names one file.
        self._writer = CandidateWriter(folder, roll_bytes=sys.maxsize)

    def add(self, partition: int, record: Any) -> None:
        data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        self._buffers.setdefault(partition, []).append(data)
        self._sizes[partition] = self._sizes.get(partition, 0) + len(data)
        self._counts[partition] = self._counts.get(partition, 0) + 1
        self._held += len(data)
        if self._sizes[partition] >= self._chunk:
            self._flush(partition)
        if self._held >= self._budget:
            for q in list(self._buffers):
                self._flush(q)

    def _flush(self, partition: int) -> None:
        parts = self._buffers.pop(partition, None)
        if not parts:
            return
        frame = zstd_contexts().c.compress(b"".join(parts))
        self._path, at = self._writer.add(frame)
        self._chunks.setdefault(partition, []).append((at, len(frame)))
        self._held -= self._sizes.pop(partition)

    def close(self) -> list[tuple[int, SpillRef]]:
        """Writes what is buffered and closes the file: (partition, ref) per partition, in order."""
        for q in list(self._buffers):
            self._flush(q)
        self._writer.close()
        refs = [(q, SpillRef(self._path, tuple(self._chunks[q]), self._counts[q])) for q in sorted(self._chunks)]
        self._chunks, self._counts = {}, {}
        return refs


def read_spill(ref: SpillRef) -> Iterator[Any]:
    """A ref's records, in the order they were added."""
    d, reader = zstd_contexts().d, CandidateReader(keep_open=1)
    try:
        for offset, length in ref.chunks:
            buf = io.BytesIO(d.decompress(reader.read_at(ref.path, offset, length, kind="spill")))
            end = buf.getbuffer().nbytes
            while buf.tell() < end:
                yield pickle.load(buf)
    finally:
        reader.close()


class Unspilled:
    """A group's values with every ``SpillRef`` replaced by its records; iterable more than once
    (each pass reads the files again, nothing is held)."""

    def __init__(self, items: Iterable[Any]):
        self._items = items

    def __iter__(self) -> Iterator[Any]:
        for item in self._items:
            if isinstance(item, SpillRef):
                yield from read_spill(item)
            else:
                yield item


def emit_refs(spiller: Spiller | None, tag: str | None = None) -> Iterator[Any]:
    """For a DoFn's ``finish_bundle``: the spiller's (partition, ref) records as outputs (on
    ``tag``, else the main output). The pipeline is batch, so every record is in the global window."""
    if spiller is None:
        return
    for kv in spiller.close():
        wv = GlobalWindows.windowed_value(kv)
        yield TaggedOutput(tag, wv) if tag else wv


class SpillFn(beam.DoFn):
    """Records -> (partition, SpillRef), one per partition a bundle wrote to, for a GroupByKey
    whose groups are read back with ``Unspilled``. ``partition_of(record)`` names its group."""

    def __init__(self, folder: str, partition_of):
        self._folder, self._partition_of = folder, partition_of

    def start_bundle(self):
        self._spiller = Spiller(self._folder)

    def process(self, record):
        self._spiller.add(self._partition_of(record), record)
        return ()

    def finish_bundle(self):
        yield from emit_refs(self._spiller)

"""The two ends of the bucket design (transforms/buckets): the clean phase's last step, which
stashes documents and sends on small records, and the finish phase, one bucket at a time.

``finish_bucket`` is the pure core (a test calls it without Beam); the DoFns only wire it in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import xxhash
from apache_beam.io.filesystems import FileSystems
from apache_beam.pvalue import TaggedOutput

from tokenmill.config import JobConfig
from tokenmill.format import shard_schema, split_of
from tokenmill.memory import GiveBack
from tokenmill.transforms import boilerplate
from tokenmill.transforms import doc as docmod
from tokenmill.transforms.buckets import (
    TMP,
    CandidateReader,
    CandidateWriter,
    Locator,
    bucket_of,
    localize,
    pack,
    unpack,
)
from tokenmill.transforms.dedup import Recorder, Verdict, VerdictBook, node_id, rehydrated
from tokenmill.transforms.progress import reporter
from tokenmill.transforms.shards import ShardFile
from tokenmill.transforms.spill import Spiller, Unspilled, emit_refs
from tokenmill.transforms.stage import count
from tokenmill.transforms.tokenize import Encoder, SampleItem, sample_key

NODES, SAMPLE, SHARDS, LINES = "nodes", "sample", "shards", "lines"
KEPT, DUPLICATES, FILTERED = "kept", "duplicates", "filtered"  # the docs Parquet files


def candidates_folder(out: str) -> str:
    return FileSystems.join(out, TMP, "candidates")


def spill_folder(out: str) -> str:
    """Where spilled small records wait (spill): locators, dedup's signatures and band keys."""
    return FileSystems.join(out, TMP, "spill")


class StashFn(beam.DoFn):
    """Clean phase, last step. Every document is written to a candidate file and becomes
    small records: its locator, spilled by bucket (main: (bucket, SpillRef) per bucket when the
    bundle ends), and, for a live one, its dedup node ('nodes') and, when a tokenizer is to be
    trained, a sample text ('sample'). Dropped documents wait too, so that every docs Parquet
    file is written by its bucket, sorted by id: the same bytes on every runner."""

    def __init__(self, cfg: JobConfig, out: str, buckets: int, sample: bool, progress: str | None = None):
        self._cfg, self._folder, self._buckets, self._sample = cfg, candidates_folder(out), buckets, sample
        self._spill_folder = spill_folder(out)
        self._progress_folder = progress

    def setup(self):
        self._recorder = Recorder(self._cfg.dedup) if self._cfg.dedup.enabled else None

    def start_bundle(self):
        self._writer = CandidateWriter(self._folder)
        self._locators = Spiller(self._spill_folder)
        self._progress = reporter(self._progress_folder)

    def process(self, doc):
        live = not docmod.is_dropped(doc)
        if self._progress:
            self._progress.add(passed=int(live), filtered=int(not live))
        node = self._recorder(doc) if self._recorder and live else None
        if node is not None:
            yield TaggedOutput(NODES, node)
            if self._cfg.quality.mode == "tag":  # stored for refilter, which does not compute it again
                doc["minhash"] = node.sig
        if self._cfg.boilerplate.enabled and live:
            keys = boilerplate.line_keys(doc, self._cfg.boilerplate.min_chars)
            if len(keys):
                yield TaggedOutput(LINES, keys)
        frame = pack(doc)
        file, offset = self._writer.add(frame)
        tie = _tie(doc)
        if self._sample and live:  # where its text waits: the sample travels as small records
            chars = min(len(doc.get("text") or ""), self._cfg.tokenize.train_max_chars)
            # The content hash breaks ties between records that share an id: a file name would not
            # be the same from one run to the next.
            yield TaggedOutput(SAMPLE, SampleItem((*sample_key(doc), tie), chars, (file, offset, len(frame))))
        loc = Locator(doc.get("id") or "", tie, node.key if node else None, file, offset, len(frame))
        self._locators.add(bucket_of(doc.get("id"), self._buckets), loc)

    def finish_bundle(self):
        self._writer.close()  # before the refs go: a ref's reader finds its candidate files whole
        yield from emit_refs(self._locators)
        if self._progress:
            self._progress.flush()


def progress_folder(out: str) -> str:
    """Where the workers' progress files go: the stage's temporary folder, never published."""
    return FileSystems.join(out, TMP, "progress")


def _tie(doc: dict) -> int:
    """Orders records that share an id, from their content (not from the stored bytes, which
    depend on the pickle and zstd versions of the worker)."""
    parts = (doc.get(k) or "" for k in ("text", "url", "source", "dropped_by"))
    return xxhash.xxh3_64_intdigest("\x1f".join(parts).encode("utf-8", "surrogatepass"))


class SampleReader:
    """The tokenizer sample's texts, read back from the candidate files (cut to ``max_chars``,
    as counted when drawn)."""

    def __init__(self, max_chars: int):
        self._max_chars, self._reader = max_chars, None

    def __call__(self, where: tuple[str, int, int]) -> str:
        if self._reader is None:
            self._reader = CandidateReader()
        file, offset, length = where
        doc = unpack(self._reader.read(Locator("", 0, None, file, offset, length)))
        return (doc.get("text") or "")[: self._max_chars]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def verdict_bucket(v: Verdict, buckets: int, mode: str) -> int:
    """The bucket of the document a verdict is about (its id, from the node key)."""
    return bucket_of(node_id(v.key, mode), buckets)


class ShardOpener:
    """Opens a bucket's shard of a split (named by the bucket) for finish_bucket."""

    def __init__(self, out: str, bucket: int, buckets: int, encoder: Encoder, val_fraction: float, batch_tokens: int):
        self.val_fraction = val_fraction
        self._args = (out, bucket, buckets, shard_schema(np.dtype(encoder.dtype), encoder.info), batch_tokens)

    def __call__(self, split: str) -> ShardFile:
        out, bucket, buckets, schema, batch_tokens = self._args
        return ShardFile(out, split, bucket, buckets, schema, batch_tokens)


def finish_bucket(
    locators: Iterable[Locator],
    verdicts: Iterable[Verdict],
    reader: CandidateReader,
    encoder: Encoder | None,
    shard_opener: ShardOpener | None,
    docs_opener,
    batch_size: int,
    repeats: dict[int, int] | None = None,
    lines: tuple[boilerplate.Sketch, Any] | None = None,
    batch_chars: int = 1 << 18,
    give_back: GiveBack | None = None,
) -> Iterator[tuple[str, Any]]:
    """One bucket: its documents in (id, tie) order with dedup's verdicts applied, each written
    to its docs Parquet file (``docs_opener(KEPT | DUPLICATES | FILTERED)`` opens one) and given
    back as (that name, doc); survivors tokenized in batches and, with a ``shard_opener``,
    streamed into the bucket's shards, whose manifest entries come last as (SHARDS, meta).
    ``repeats`` (dedup.keep=rehydrate): a cluster's survivor goes into its shard that many
    times by the cluster's size (survivor.rehydrated). A batch ends at ``batch_size`` documents
    or ``batch_chars`` characters, whichever comes first. ``lines`` (sketch, BoilerplateConfig):
    survivors lose their boilerplate lines first; one left with no text is filtered as
    ``boilerplate:empty``. ``give_back`` (one per worker, shared by its buckets; a new one by
    default) returns freed pages to the OS at the start and between batches."""
    book = VerdictBook(verdicts)
    files: dict[str, Any] = {}
    shards: dict[str, ShardFile] = {}
    batch: list[dict] = []
    batch_text = 0
    # Freed pages go back to the OS now (what the decide phase left: 12-42 MB per worker at 60k
    # pages) and between encode batches, within 5% of the time.
    give_back = give_back or GiveBack()
    give_back()

    def write(branch: str, doc: dict) -> tuple[str, dict]:
        if branch not in files:
            files[branch] = docs_opener(branch)
        files[branch].add(doc)
        return branch, doc

    def flush():
        nonlocal batch_text
        batch_text = 0
        ids_list = encoder.encode(batch) if encoder else [None] * len(batch)
        for d, ids in zip(batch, ids_list):
            if ids is not None and shard_opener is not None:
                split = split_of(d["id"], shard_opener.val_fraction)
                if split not in shards:
                    shards[split] = shard_opener(split)
                for _ in range(rehydrated(d.get("dup_cluster_size") or 1, repeats) if repeats else 1):
                    shards[split].add(d["id"], ids)
        out = [write(KEPT, d) for d in batch]
        batch.clear()
        give_back()
        return out

    try:
        for loc in sorted(locators, key=lambda lc: (lc.id, lc.tie, lc.key or b"")):
            doc = unpack(reader.read(loc))
            if docmod.is_dropped(doc):  # by a clean-phase stage
                yield write(FILTERED, doc)
                continue
            if docmod.is_dropped(book.apply(doc, loc.key)):
                count(f"dropped.{doc['dropped_by']}")
                yield write(DUPLICATES, doc)
                continue
            if lines is not None:
                n_lines, n_chars = boilerplate.strip(doc, *lines)
                doc["boilerplate_chars"], doc["boilerplate_lines"] = n_chars, n_lines
                if n_lines:
                    count("boilerplate.lines_cut", n_lines)
                    count("boilerplate.chars_cut", n_chars)
                if not doc["text"].strip():
                    docmod.drop(doc, boilerplate.STAGE, "empty")
                    count("dropped.boilerplate:empty")
                    yield write(FILTERED, doc)
                    continue
            batch.append(doc)
            batch_text += len(doc["text"])
            if len(batch) >= batch_size or batch_text >= batch_chars:
                yield from flush()
        if batch:
            yield from flush()
    except BaseException:  # a failed (or abandoned) bucket leaves no temporary file behind
        for writer in [*files.values(), *shards.values()]:
            writer.abandon()
        raise
    for branch in sorted(files):
        files[branch].close()
    for split in sorted(shards):
        yield SHARDS, shards[split].close()


class FinishFn(beam.DoFn):
    """Finish phase: (bucket, [locators and verdicts]) -> the bucket's docs Parquet files and
    shards; every document comes out (main, for the report) and every shard's manifest entry
    ('shards'). The tokenizer JSON comes as a side input when tokenizing."""

    def __init__(self, cfg: JobConfig, out: str, buckets: int, schema, progress: str | None = None):
        self._cfg, self._out, self._buckets, self._schema = cfg, out, buckets, schema
        self._progress_folder = progress
        self._encoder: Encoder | None = None

    def setup(self):
        self._give_back = GiveBack()  # its 5% share holds for the worker, whatever the bucket count

    def _encoder_for(self, tok_json: str | None) -> Encoder | None:
        # Built once per worker: the side input is the same str object bundle after bundle.
        if tok_json is None:
            return None
        if self._encoder is None or (tok_json is not self._encoder.json and tok_json != self._encoder.json):
            self._encoder = Encoder(tok_json, self._cfg.tokenize.eos_token)
        return self._encoder

    def process(self, kv, tok_json: str | None = None, sketch: boilerplate.Sketch | None = None):
        bucket, items = kv
        encoder = self._encoder_for(tok_json)
        s = self._cfg.shards
        opener = (ShardOpener(self._out, bucket, self._buckets, encoder, s.val_fraction, s.batch_tokens)
                  if encoder is not None and s.enabled else None)
        reader = CandidateReader()

        def docs_file(branch: str) -> docmod.DocsFile:
            name = f"{branch}-{bucket:05d}-of-{self._buckets:05d}.parquet"
            return docmod.DocsFile(FileSystems.join(self._out, "docs", name), self._schema)

        progress = reporter(self._progress_folder)
        # A bucket's group holds refs to its spilled Locators, and its Verdicts.
        locators, verdicts, local_copy = [], [], None
        for v in Unspilled(items):
            (locators if isinstance(v, Locator) else verdicts).append(v)
        try:
            if locators and "://" in locators[0].file:  # remote candidates: one sequential pass first
                locators, local_copy = localize(locators, reader)
            for tag, value in finish_bucket(locators, verdicts,
                                            reader, encoder, opener, docs_file, self._cfg.tokenize.batch_size,
                                            d.repeats if (d := self._cfg.dedup).enabled and d.keep == "rehydrate" else None,
                                            (sketch, self._cfg.boilerplate) if sketch is not None else None,
                                            self._cfg.tokenize.batch_chars, self._give_back):
                if tag == SHARDS:
                    yield TaggedOutput(tag, value)
                    continue
                if progress:
                    dropped = value.get("dropped_by") or ""
                    progress.add(kept=int(not dropped), duplicates=int(dropped.startswith("dedup:")))
                yield value
        finally:
            reader.close()
            if local_copy:
                os.remove(local_copy)
        if progress:
            progress.add(buckets=1)
            progress.flush()

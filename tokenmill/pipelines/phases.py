"""The two ends of the bucket design (transforms/buckets): the clean phase's last step, which
stashes documents and sends on small records, and the finish phase, one bucket at a time.

``BucketFinisher`` is the pure core (a test calls it without Beam, through ``finish_bucket``); the
DoFns only wire it in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import xxhash
from apache_beam.pvalue import TaggedOutput

from tokenmill.beamfs import FileSystems
from tokenmill.config import JobConfig
from tokenmill.format import shard_schema, split_of
from tokenmill.memory import GiveBack
from tokenmill.transforms import boilerplate, dedup, stages, tokenization
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
from tokenmill.transforms.dedup import Verdict, VerdictBook, node_id, rehydrated
from tokenmill.transforms.progress_counts import reporter
from tokenmill.transforms.shards import ShardFile
from tokenmill.transforms.spill import Spiller, Unspilled, emit_refs
from tokenmill.transforms.stage_base import count
from tokenmill.transforms.tokenization import Encoder

# The later stages' outputs from StashFn (their Stash tags), and the finish phase's shard entries.
NODES, LINES, SAMPLE = dedup.NODES, boilerplate.LINES, tokenization.SAMPLE
SHARDS = "shards"
KEPT, DUPLICATES, FILTERED = "kept", "duplicates", "filtered"  # the docs Parquet files


def candidates_folder(out: str) -> str:
    return FileSystems.join(out, TMP, "candidates")


def spill_folder(out: str) -> str:
    """Where spilled small records wait (spill): locators, dedup's signatures and band keys."""
    return FileSystems.join(out, TMP, "spill")


class StashFn(beam.DoFn):
    """Clean phase, last step. Every document is written to a candidate file and becomes
    small records: its locator, spilled by bucket (main: (bucket, SpillRef) per bucket when the
    bundle ends), and, for a live one, what each later stage the config turns on takes from it
    (its ``Stash``, on its own tagged output: dedup's node on 'nodes', boilerplate's line keys on
    'lines', tokenize's sample item on 'sample'). Dropped documents wait too, so that every docs
    Parquet file is written by its bucket, sorted by id: the same bytes on every runner."""

    def __init__(self, cfg: JobConfig, out: str, buckets: int, progress: str | None = None):
        self._cfg, self._folder, self._buckets = cfg, candidates_folder(out), buckets
        self._spill_folder = spill_folder(out)
        self._progress_folder = progress

    def setup(self):
        self._stashes = [stash for spec, section in stages.enabled(self._cfg, "later")
                         if spec.stash is not None and (stash := spec.stash(section, self._cfg)) is not None]

    def start_bundle(self):
        self._writer = CandidateWriter(self._folder)
        self._locators = Spiller(self._spill_folder)
        self._progress = reporter(self._progress_folder)

    def process(self, doc):
        live = not docmod.is_dropped(doc)
        if self._progress:
            self._progress.add(passed=int(live), filtered=int(not live))
        # Taken before the document is stored: a stage may store a column with it (dedup's MinHash).
        taken = [(stash, stash.take(doc)) for stash in self._stashes] if live else []
        frame = pack(doc)
        file, offset = self._writer.add(frame)
        key = next((k for stash, t in taken if (k := stash.key(t)) is not None), None)
        loc = Locator(doc.get("id") or "", _tie(doc), key, file, offset, len(frame))
        for stash, t in taken:
            record = stash.place(t, doc, loc)
            if record is not None:
                yield TaggedOutput(stash.tag, record)
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
    """Opens a bucket's shard of a split (named by the bucket) for BucketFinisher."""

    def __init__(self, out: str, bucket: int, buckets: int, encoder: Encoder, val_fraction: float, batch_tokens: int):
        self.val_fraction = val_fraction
        self._args = (out, bucket, buckets, shard_schema(np.dtype(encoder.dtype), encoder.info), batch_tokens)

    def __call__(self, split: str) -> ShardFile:
        out, bucket, buckets, schema, batch_tokens = self._args
        return ShardFile(out, split, bucket, buckets, schema, batch_tokens)


class _DocsFiles:
    """A bucket's docs Parquet files, one per branch (KEPT, DUPLICATES, FILTERED), each opened
    by ``opener(branch)`` when its first document comes."""

    def __init__(self, opener):
        self._open = opener
        self._files: dict[str, Any] = {}

    def write(self, branch: str, doc: dict) -> tuple[str, dict]:
        if branch not in self._files:
            self._files[branch] = self._open(branch)
        self._files[branch].add(doc)
        return branch, doc

    def close(self) -> None:
        for branch in sorted(self._files):
            self._files[branch].close()

    def abandon(self) -> None:
        for writer in self._files.values():
            writer.abandon()


class _Shards:
    """A bucket's shards, one per split (opened by ``opener`` on first use); ``repeats``: a
    survivor goes in as many times as rehydration says for its cluster's size."""

    def __init__(self, opener: ShardOpener, repeats: dict[int, int] | None):
        self._open, self._repeats = opener, repeats
        self._shards: dict[str, ShardFile] = {}

    def add(self, doc: dict, ids) -> None:
        split = split_of(doc["id"], self._open.val_fraction)
        if split not in self._shards:
            self._shards[split] = self._open(split)
        copies = rehydrated(doc.get("dup_cluster_size") or 1, self._repeats) if self._repeats else 1
        for _ in range(copies):
            self._shards[split].add(doc["id"], ids)

    def close(self) -> Iterator[tuple[str, Any]]:
        """Each shard's manifest entry, as (SHARDS, meta), splits in name order."""
        for split in sorted(self._shards):
            yield SHARDS, self._shards[split].close()

    def abandon(self) -> None:
        for writer in self._shards.values():
            writer.abandon()


class BucketFinisher:
    """One bucket: its documents in (id, tie) order with dedup's verdicts applied, each written
    to its docs Parquet file (``docs_opener(KEPT | DUPLICATES | FILTERED)`` opens one) and given
    back as (that name, doc); survivors tokenized in batches and, with a ``shard_opener``,
    streamed into the bucket's shards, whose manifest entries come last as (SHARDS, meta).

    ``repeats`` (dedup.keep=rehydrate): a cluster's survivor goes into its shard that many
    times by the cluster's size (survivor.rehydrated). A batch ends at ``batch_size`` documents
    or ``batch_chars`` characters, whichever comes first. ``lines`` (sketch, BoilerplateConfig):
    survivors lose their boilerplate lines first; one left with no text is filtered as
    ``boilerplate:empty``. ``give_back`` (one per worker, shared by its buckets; a new one by
    default) returns freed pages to the OS at the start and between batches.

    One object per bucket: ``run`` once."""

    def __init__(self, reader: CandidateReader, docs_opener, encoder: Encoder | None = None,
                 shard_opener: ShardOpener | None = None, *, batch_size: int, batch_chars: int = 1 << 18,
                 repeats: dict[int, int] | None = None, lines: tuple[boilerplate.Sketch, Any] | None = None,
                 give_back: GiveBack | None = None):
        self._reader, self._encoder, self._lines = reader, encoder, lines
        self._batch_size, self._batch_chars = batch_size, batch_chars
        self._docs = _DocsFiles(docs_opener)
        self._shards = _Shards(shard_opener, repeats) if shard_opener is not None else None
        self._give_back = give_back or GiveBack()
        self._batch: list[dict] = []
        self._batch_text = 0

    def run(self, locators: Iterable[Locator], verdicts: Iterable[Verdict]) -> Iterator[tuple[str, Any]]:
        book = VerdictBook(verdicts)
        # Freed pages go back to the OS now (what the decide phase left: bench/MEASUREMENTS.md)
        # and between encode batches, within 5% of the time.
        self._give_back()
        try:
            for loc, doc in self._in_order(locators):
                branch = self._judged(doc, book, loc.key) or self._cut_boilerplate(doc)
                if branch:
                    yield self._docs.write(branch, doc)
                    continue
                self._batch.append(doc)
                self._batch_text += len(doc["text"])
                if len(self._batch) >= self._batch_size or self._batch_text >= self._batch_chars:
                    yield from self._flush()
            if self._batch:
                yield from self._flush()
        except BaseException:  # a failed (or abandoned) bucket leaves no temporary file behind
            self._docs.abandon()
            if self._shards is not None:
                self._shards.abandon()
            raise
        self._docs.close()
        if self._shards is not None:
            yield from self._shards.close()

    def _in_order(self, locators: Iterable[Locator]) -> Iterator[tuple[Locator, dict]]:
        """The bucket's documents read back in (id, tie, node key) order."""
        for loc in sorted(locators, key=lambda lc: (lc.id, lc.tie, lc.key or b"")):
            yield loc, unpack(self._reader.read(loc))

    @staticmethod
    def _judged(doc: dict, book: VerdictBook, key: bytes | None) -> str | None:
        """FILTERED for a document a clean-phase stage dropped, DUPLICATES for one dedup's
        verdict drops (``book`` sets its cluster fields either way), else None."""
        if docmod.is_dropped(doc):
            return FILTERED
        if docmod.is_dropped(book.apply(doc, key)):
            count(f"dropped.{doc['dropped_by']}")
            return DUPLICATES
        return None

    def _cut_boilerplate(self, doc: dict) -> str | None:
        """Cuts a survivor's boilerplate lines (with ``lines``); FILTERED if no text is left."""
        if self._lines is None:
            return None
        n_lines, n_chars = boilerplate.strip(doc, *self._lines)
        doc["boilerplate_chars"], doc["boilerplate_lines"] = n_chars, n_lines
        if n_lines:
            count("boilerplate.lines_cut", n_lines)
            count("boilerplate.chars_cut", n_chars)
        if not doc["text"].strip():
            docmod.drop(doc, boilerplate.STAGE, "empty")
            count("dropped.boilerplate:empty")
            return FILTERED
        return None

    def _flush(self) -> list[tuple[str, dict]]:
        """Tokenizes the batch (the encoder sets each document's token count), streams the
        tokens into the shards, then writes the documents as KEPT."""
        batch = self._batch
        self._batch_text = 0
        ids_list = self._encoder.encode(batch) if self._encoder else [None] * len(batch)
        if self._shards is not None:
            for doc, ids in zip(batch, ids_list):
                if ids is not None:
                    self._shards.add(doc, ids)
        # a document the tokenizer failed on is dropped (Encoder.encode marked it)
        out = [self._docs.write(FILTERED if docmod.is_dropped(doc) else KEPT, doc) for doc in batch]
        batch.clear()
        self._give_back()
        return out


def finish_bucket(locators: Iterable[Locator], verdicts: Iterable[Verdict], reader: CandidateReader,
                  encoder: Encoder | None, shard_opener: ShardOpener | None, docs_opener, batch_size: int,
                  **options) -> Iterator[tuple[str, Any]]:
    """``BucketFinisher(...).run(locators, verdicts)`` in one call (``options``: its keyword
    arguments: batch_chars, repeats, lines, give_back)."""
    finisher = BucketFinisher(reader, docs_opener, encoder, shard_opener, batch_size=batch_size, **options)
    return finisher.run(locators, verdicts)


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
            finisher = BucketFinisher(
                reader, docs_file, encoder, opener, batch_size=self._cfg.tokenize.batch_size,
                batch_chars=self._cfg.tokenize.batch_chars,
                repeats=d.repeats if (d := self._cfg.dedup).enabled and d.keep == "rehydrate" else None,
                lines=(sketch, self._cfg.boilerplate) if sketch is not None else None, give_back=self._give_back)
            for tag, value in finisher.run(locators, verdicts):
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

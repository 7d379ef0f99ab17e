"""finish_bucket, the finish phase's pure core, without Beam: a bucket's documents come back in
id order into its docs files and shards; a bucket that fails half-way (a candidate file gone)
leaves neither a final file nor a temporary one behind."""

import glob
import os

import pytest

from tokenmill.pipelines.phases import ShardOpener, _tie, finish_bucket
from tokenmill.transforms import doc as docmod
from tokenmill.transforms.buckets import CandidateReader, CandidateWriter, Locator, pack
from tokenmill.transforms.tokenization import Encoder, train_tokenizer


def stash(tmp_path, n: int = 40):
    """n documents written the way the Stash step writes them; small files, so there are several."""
    writer = CandidateWriter(str(tmp_path / "candidates"), roll_bytes=2_000)
    locators, docs = [], []
    for i in reversed(range(n)):
        d = docmod.new_doc(f"doc-{i:03d}", f"https://example.com/{i}", text=f"document number {i} " * 20)
        frame = pack(d)
        file, offset = writer.add(frame)
        locators.append(Locator(d["id"], _tie(d), None, file, offset, len(frame)))
        docs.append(d)
    writer.close()
    return locators, docs


class CountingEncoder(Encoder):
    """A real encoder that records the characters of each batch it is given."""

    def encode(self, docs):
        self.batches = getattr(self, "batches", []) + [sum(len(d["text"]) for d in docs)]
        return super().encode(docs)


def run(tmp_path, locators, docs, **kw):
    out = tmp_path / "out"
    tok = train_tokenizer([d["text"] for d in docs], vocab_size=300, min_frequency=1)
    encoder = kw.pop("encoder", None) or Encoder(tok.to_str(), None)
    opener = ShardOpener(str(out), 0, 1, encoder, 0.1, 1 << 10)
    schema = docmod.docs_schema()

    def docs_file(branch):
        return docmod.DocsFile(str(out / "docs" / f"{branch}-00000-of-00001.parquet"), schema)

    reader = CandidateReader()
    try:
        return out, list(finish_bucket(locators, [], reader, encoder, opener, docs_file, batch_size=7, **kw))
    finally:
        reader.close()


def test_a_bucket_is_written_in_id_order(tmp_path):
    locators, docs = stash(tmp_path)
    out, items = run(tmp_path, locators, docs)
    kept = [d["id"] for tag, d in items if tag == "kept"]
    assert kept == sorted(d["id"] for d in docs)
    assert {m["split"] for tag, m in items if tag == "shards"} <= {"train", "val"}
    assert os.path.exists(out / "docs" / "kept-00000-of-00001.parquet")
    assert not glob.glob(str(out / "**" / "*.tmp-*"), recursive=True)


def test_a_failed_bucket_leaves_no_file_behind(tmp_path):
    locators, docs = stash(tmp_path)
    files = sorted({loc.file for loc in locators})
    assert len(files) > 3
    os.remove(files[0])  # the first file holds the last ids: the bucket fails after writing some
    with pytest.raises(OSError):
        run(tmp_path, locators, docs)
    out = tmp_path / "out"
    left = [p for p in glob.glob(str(out / "**" / "*"), recursive=True) if os.path.isfile(p)]
    assert left == []


def test_a_remote_bucket_is_read_once_in_file_order(tmp_path):
    """localize (what the finish phase does for gs:// or s3:// candidates) reads every file front
    to back once into one local file; the bucket written from it is the same."""
    from tokenmill.transforms.buckets import localize

    locators, docs = stash(tmp_path)

    class Recording(CandidateReader):
        def __init__(self):
            super().__init__()
            self.reads = []

        def read(self, loc):
            self.reads.append((loc.file, loc.offset))
            return super().read(loc)

    reader = Recording()
    moved, path = localize(locators, reader, tmp_dir=str(tmp_path))
    reader.close()
    assert reader.reads == sorted(reader.reads) and len(reader.reads) == len(locators)
    assert {loc.file for loc in moved} == {path}
    check = CandidateReader()
    assert [check.read(a) for a in moved] == [check.read(b) for b in locators]
    check.close()
    direct = run(tmp_path / "a", locators, docs)[1]
    via_copy = run(tmp_path / "b", moved, docs)[1]
    assert [(t, d["id"]) for t, d in direct if t != "shards"] == [(t, d["id"]) for t, d in via_copy if t != "shards"]
    assert [m["sha256"] for t, m in direct if t == "shards"] == [m["sha256"] for t, m in via_copy if t == "shards"]


def test_batches_end_at_a_character_budget_without_changing_the_output(tmp_path):
    """tokenize.batch_chars bounds the text in one encode_batch call (the tokenizer's working
    memory follows it); the documents and shards written are the same."""
    locators, docs = stash(tmp_path)
    tok = train_tokenizer([d["text"] for d in docs], vocab_size=300, min_frequency=1)
    counting = CountingEncoder(tok.to_str(), None)
    small = run(tmp_path / "small", locators, docs, encoder=counting, batch_chars=1000)[1]
    whole = run(tmp_path / "whole", locators, docs)[1]
    doc_len = max(len(d["text"]) for d in docs)  # ~400 characters: 3 to a batch, not batch_size's 7
    assert max(counting.batches) < 1000 + doc_len and len(counting.batches) >= 40 // 3
    assert [(t, d["id"], d.get("n_tokens")) for t, d in small if t != "shards"] == \
        [(t, d["id"], d.get("n_tokens")) for t, d in whole if t != "shards"]
    assert [m["sha256"] for t, m in small if t == "shards"] == [m["sha256"] for t, m in whole if t == "shards"]

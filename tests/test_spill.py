"""Shuffles through files (transforms/spill): records round-trip by partition, memory stays
within the budget, and the clean phase's stash sends refs, not a record per document."""

import os

import pytest

from tokenmill.config import JobConfig
from tokenmill.transforms.buckets import Locator
from tokenmill.transforms.spill import Spiller, SpillRef, Unspilled, read_spill


def test_records_come_back_by_partition_in_order(tmp_path):
    s = Spiller(str(tmp_path), chunk_bytes=200, budget_bytes=1000)  # many chunks, budget flushes too
    want: dict[int, list] = {}
    for i in range(2000):
        q = (i * 7) % 13
        rec = (f"id{i}", i, b"x" * (i % 50)) if q % 2 else Locator(f"d{i}", i, None, "f", i, 3)
        s.add(q, rec)
        want.setdefault(q, []).append(rec)
    refs = s.close()
    assert [q for q, _ in refs] == sorted(want)
    assert len({ref.path for _, ref in refs}) == 1  # one file per bundle, whatever the partition count
    for q, ref in refs:
        assert ref.records == len(want[q]) and len(ref.chunks) > 1
        assert list(read_spill(ref)) == want[q]
    assert s._held == 0 and not s._buffers


def test_budget_bounds_what_is_buffered(tmp_path):
    s = Spiller(str(tmp_path), chunk_bytes=1 << 20, budget_bytes=10_000)
    for i in range(5000):  # 5,000 partitions, none reaching a chunk: the budget flushes them all
        s.add(i, b"y" * 20)
        assert s._held < 10_000
    assert sum(ref.records for _, ref in s.close()) == 5000


def test_unspilled_mixes_refs_and_values_and_iterates_twice(tmp_path):
    s = Spiller(str(tmp_path))
    for i in range(10):
        s.add(0, i)
    [(_, ref)] = s.close()
    u = Unspilled(["a", ref, "b"])
    assert list(u) == ["a", *range(10), "b"]
    assert list(u) == list(u)


def test_nothing_added_writes_no_file(tmp_path):
    assert Spiller(str(tmp_path)).close() == []
    assert os.listdir(tmp_path) == []


def test_a_changed_spill_file_is_one_clear_error(tmp_path):
    s = Spiller(str(tmp_path))
    s.add(0, "x" * 1000)
    [(_, ref)] = s.close()
    with open(ref.path, "r+b") as fh:
        fh.truncate(5)
    with pytest.raises(OSError, match="spill file was changed"):
        list(read_spill(ref))


def test_stash_sends_refs_per_bucket_not_a_record_per_document(tmp_path):
    """The clean phase's last step: 500 documents in a bundle leave at most one ref per bucket on
    the main output (the GroupByKey into the finish phase), whatever the document count."""
    from tokenmill.pipelines.phases import StashFn
    from tokenmill.transforms.doc import new_doc

    cfg = JobConfig.model_validate({"inputs": ["x"], "output": str(tmp_path / "out")})
    fn = StashFn(cfg, str(tmp_path / "out"), buckets=4)
    fn.setup()
    fn.start_bundle()
    per_doc = []
    for i in range(500):
        per_doc += list(fn.process(new_doc(f"d{i}", "test", text=f"document number {i} " * 20)))
    main = [o for o in per_doc if not hasattr(o, "tag")]
    assert main == []  # nodes travel on their own tag; no locator leaves per document
    refs = [wv.value for wv in fn.finish_bundle()]
    assert 1 <= len(refs) <= 4 and all(isinstance(r, SpillRef) for _, r in refs)
    locs = list(Unspilled(r for _, r in refs))
    assert sorted(loc.id for loc in locs) == sorted(f"d{i}" for i in range(500))


def test_verdicts_reach_their_buckets_as_refs(tmp_path):
    """Dedup's verdicts go to the finish phase the way locators do: per bundle, one ref per
    bucket, each holding exactly the verdicts of the documents in that bucket."""
    import functools

    from tokenmill.pipelines.phases import verdict_bucket
    from tokenmill.transforms.buckets import bucket_of
    from tokenmill.transforms.dedup import Verdict
    from tokenmill.transforms.dedup.survivor import node_id, node_key
    from tokenmill.transforms.doc import new_doc
    from tokenmill.transforms.spill import SpillFn

    keys = [node_key(new_doc(f"d{i}", "test", text="x" * i), bytes(16)) for i in range(300)]
    verdicts = [Verdict(k, "d0", "dedup:near" if i else None, 3) for i, k in enumerate(keys)]
    fn = SpillFn(str(tmp_path / "spill"), functools.partial(verdict_bucket, buckets=5, mode="quality"))
    fn.start_bundle()
    assert [o for v in verdicts for o in fn.process(v)] == []
    refs = [wv.value for wv in fn.finish_bundle()]
    assert len(refs) == 5 and all(isinstance(r, SpillRef) for _, r in refs)
    for bucket, ref in refs:
        assert list(Unspilled([ref])) == [v for v in verdicts if bucket_of(node_id(v.key), 5) == bucket]

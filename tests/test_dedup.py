"""Exact + near-duplicate removal (tokenmill.transforms.dedup): the pure cores and the components
(end to end on Beam: test_dedup_pipeline.py)."""

from __future__ import annotations

import random
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline  # not a test class
from apache_beam.testing.util import assert_that, equal_to
from dedup_helpers import _doc, _edit, _kept, _text, _vocab, run_dedup
from pydantic import ValidationError

from tokenmill.config import DedupConfig, JobConfig
from tokenmill.transforms.dedup import (
    EXACT,
    NEAR,
    ConnectedComponents,
    Edges,
    Limits,
    MinHasher,
    attach_signature,
    band_blobs,
    band_hashes,
    bucket_edges,
    choose_survivor,
    edge_blobs,
    exact_hash,
    exact_jaccard,
    exact_reps,
    exact_verdicts,
    jaccard_estimate,
    node_hash,
    node_id,
    node_key,
    normalise_exact,
    shingles,
    signature_blobs,
    size_bucket,
    sized,
    star_forest,
    tokens,
    union_find_components,
    verify_edges,
    verify_in_group,
    verify_local,
)
from tokenmill.transforms.dedup.lsh import BandBlob, pack_keys

# --------------------------------------------------------------------------- pure cores


def test_normalisation_and_tokens():
    assert normalise_exact("  Hello\n\tWORLD  ") == "hello world"
    assert exact_hash("Hello  world") == exact_hash("hello\nWORLD ")
    assert exact_hash("hello world") != exact_hash("hello world!")
    assert len(exact_hash(None)) == 16
    assert tokens("Don't PANIC: 42 towels, v3.14!") == ["don", "t", "panic", "00", "towels", "v0", "00"]
    assert exact_hash("a\ud800b")  # a lone surrogate does not crash


def test_shingles_short_texts():
    assert shingles([], 5) == []
    assert shingles(["a", "b"], 5) == ["a b"]  # too short for one 5-gram: the whole text
    assert shingles(list("abcde"), 5) == ["a b c d e"]
    assert shingles(list("abcdef"), 5) == ["a b c d e", "b c d e f"]
    h = MinHasher(16)
    assert h.signature([]) is None
    assert h.text_signature("!!! ...", 5) is None
    assert h.text_signature("Hello, world", 5) == h.text_signature("hello world!", 5)
    assert h.text_signature("one", 5) == h.signature(["one"])


def test_signature_estimates_jaccard():
    rng = random.Random(1)
    vocab = _vocab(rng)
    h = MinHasher(256, seed=3)
    a = _text(rng, vocab, 400)
    b = a[:300] + _text(rng, vocab, 100)
    sa, sb = shingles(a, 5), shingles(b, 5)
    exact = exact_jaccard(sa, sb)
    est = jaccard_estimate(h.signature(sa), h.signature(sb))
    assert abs(est - exact) < 0.1
    assert jaccard_estimate(h.signature(sa), h.signature(sa)) == 1.0
    # text_signature builds the same shingles as bytes: the same signature
    assert h.text_signature(" ".join(a), 5) == h.signature(sa)
    assert len(h.signature(sa)) == 256 * 4
    assert MinHasher(256, seed=3).signature(sa) == h.signature(sa)  # deterministic across instances
    assert MinHasher(256, seed=4).signature(sa) != h.signature(sa)


def test_signature_is_datasketchs_minhash_bit_for_bit():
    """MinHasher does datasketch's arithmetic itself (faster); the values must stay datasketch's,
    across its slices (219 shingles at 112 permutations, 81 at 300) and for non-ASCII text."""
    import xxhash
    from datasketch import MinHash

    from tokenmill.transforms.dedup.minhash import permutations

    for num_perm, seed in ((112, 1), (300, 5), (7, 123)):
        theirs = MinHash(num_perm=num_perm, seed=seed, scheme="affine32").permutations
        assert all((ours == t).all() and ours.dtype == t.dtype for ours, t in zip(permutations(num_perm, seed), theirs))
    rng = random.Random(7)
    vocab = _vocab(rng) + ["café", "naïve", "日本語", "٣٤٥"]
    for num_perm in (112, 300):
        h = MinHasher(num_perm, seed=5)
        for n_words in (1, 3, 5, 85, 86, 219 + 4, 220 + 4, 1000):
            sh = shingles(_text(rng, vocab, n_words), 5)
            m = MinHash(num_perm=num_perm, seed=5, hashfunc=xxhash.xxh32_intdigest)
            m.update_batch([s.encode("utf-8") for s in sh])
            assert h.signature(sh) == np.asarray(m.hashvalues, dtype="<u4").tobytes(), (num_perm, n_words)


def _sig_matrix(sigs: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(sigs), dtype="<u4").reshape(len(sigs), -1)


def test_exact_reps():
    """Copies (same h, the last 16 bytes of a node key) merge into their smallest key."""
    ha, hb = exact_hash("a"), exact_hash("b")
    nodes = [(b"3" + ha, "sa3"), (b"1" + hb, "sb1"), (b"2" + ha, "sa2"), (b"5" + ha, "sa5")]
    assert sorted(exact_reps(nodes)) == [(b"1" + hb, "sb1"), (b"2" + ha, "sa2")]
    assert exact_reps([]) == []


def test_copies_do_not_count_towards_a_bucket(tmp_path):
    """Copies of one text that meet only in LSH (different batches) link to their smallest node
    and leave the all-pairs-or-star choice to the distinct texts: with 15 copies of b in
    batches of one, d must still be found a near duplicate of b, as when they share a batch."""
    ha, hb = exact_hash("a"), exact_hash("b")
    keys = [b"1" + ha, b"2" + hb, b"3" + hb, b"4" + ha, b"4" + ha]  # the last: one record read twice
    blob = BandBlob(np.zeros(5, np.uint64).tobytes(), np.arange(5, dtype=np.uint32).tobytes(), *pack_keys(keys))
    edges, big = bucket_edges([blob], 2)  # 2 distinct texts: all pairs, no star
    assert big == 0 and edges.key_pairs() == [(keys[0], keys[1]), (keys[0], keys[3]), (keys[1], keys[2])]

    docs = [_doc("a", "apple cloud kite"), _doc("d", "cloud kite lemon")]
    docs += [_doc(f"b{i:02}", "cloud drum kite") for i in range(15)]
    cfg = DedupConfig(ngram=1, bands=2, rows=3, verify_threshold=0.8, survivor="first_id")
    out, _ = run_dedup(docs, cfg, tmp_path, limits=Limits(batch_nodes=1))  # copies far apart in a corpus
    assert out["d"]["dropped_by"] == "dedup:near_duplicate" and out["d"]["dup_cluster"] == "b00"
    assert _kept(out["b00"]) and _kept(out["a"]) and out["a"]["dup_cluster"] is None
    assert all(out[f"b{i:02}"]["dropped_by"] == "dedup:exact_duplicate" for i in range(1, 15))


def test_band_hashes():
    h = MinHasher(14 * 8)
    s1 = h.signature(["a b c"])
    keys = band_hashes(_sig_matrix([s1]), 14, 8)[0]
    assert keys.dtype == np.uint64 and len(set(keys.tolist())) == 14  # the band index keeps equal bands apart
    same = np.frombuffer(s1, dtype="<u4").reshape(14, 8)
    # Equal rows in every band still give 14 different keys.
    flat = np.tile(same[0], 14).astype("<u4").tobytes()
    assert len(set(band_hashes(_sig_matrix([flat]), 14, 8)[0].tolist())) == 14
    s2 = bytearray(s1)
    s2[0] ^= 1  # first value of band 0 differs
    both = band_hashes(_sig_matrix([s1, bytes(s2), s1]), 14, 8)
    assert both[1][0] != keys[0] and (both[1][1:] == keys[1:]).all() and (both[2] == keys).all()


def _near_family(rng, h, n_words=200, copies=3, edits=4):
    vocab = _vocab(rng)
    base = _text(rng, vocab, n_words)
    texts = [base] + [_edit(rng, vocab, base, edits) for _ in range(copies)]
    return [h.text_signature(" ".join(t), 5) for t in texts]


@pytest.mark.parametrize("partitions", [1, 3, 64])
def test_packed_lsh_and_verification(partitions):
    """The packed LSH and join cores: a family of near copies is linked, unrelated docs are not,
    a big bucket becomes a star, a pair colliding in many bands is one candidate, verification
    agrees with jaccard_estimate, and the star forests keep the components; the same whatever
    the partitioning and the batches."""
    blob_edges = 3  # edges split over many blobs per group
    rng = random.Random(7)
    h = MinHasher(14 * 8)
    fam = _near_family(rng, h)
    others = [h.text_signature(" ".join(_text(rng, _vocab(rng), 200)), 5) for _ in range(30)]
    same = [h.signature(["one and the same"])] * 5  # a bucket of 5 in every band
    sigs = fam + others + same
    keys = [f"k{i:03d}".encode() for i in range(len(sigs))]

    def group(items):
        out: dict[int, list] = {}
        for q, blob in items:
            assert 0 <= q < partitions
            out.setdefault(q, []).append(blob)
        return out.values()

    def batches(fn, batch):
        return [kv for i in range(0, len(keys), batch) for kv in fn(keys[i : i + batch], sigs[i : i + batch])]

    def candidates(batch, max_pairs):
        edges, big = set(), 0
        for blobs in group(batches(lambda k, s: band_blobs(k, s, 14, 8, partitions), batch)):
            e, b = bucket_edges(blobs, max_pairs)
            assert e.keys == sorted(set(e.keys)) and (e.index[:, 0] < e.index[:, 1]).all()
            e = e.key_pairs()
            assert len(e) == len(set(e))
            edges |= set(e)
            big += b
        return edges, big

    edges, big = candidates(len(keys), 16)
    fam_keys, same_keys = set(keys[:4]), set(keys[-5:])
    assert all(a < b for a, b in edges) and big == 0
    assert {(a, b) for a, b in edges if a in same_keys} == {
        (a, b) for a in same_keys for b in same_keys if a < b
    }
    assert {(keys[0], k) for k in keys[1:4]} <= edges
    assert not any((a in fam_keys) != (b in fam_keys) for a, b in edges)
    assert candidates(7, 16)[0] == edges
    # Buckets of more than 4: a star to the smallest node.
    star, big = candidates(len(keys), 4)
    assert big > 0
    assert {(a, b) for a, b in star if a in same_keys} == {(min(same_keys), k) for k in sorted(same_keys)[1:]}

    # Verification through the two joins keeps exactly the pairs whose estimate reaches t.
    sig_of = dict(zip(keys, sigs))
    sig_blobs = batches(lambda k, s: signature_blobs(k, s, partitions), 5)
    for t in (0.5, 0.8, 0.95):
        attached = []
        for blobs in group(sig_blobs + list(edge_blobs(Edges.from_pairs(sorted(edges)), partitions, blob_edges))):
            attached += attach_signature(blobs, 112, partitions, blob_edges)
        kept, rejected = set(), 0
        for blobs in group(sig_blobs + attached):
            k, r = verify_edges(blobs, 112, t)
            kept |= set(k)
            rejected += r
        assert kept == {(a, b) for a, b in edges if jaccard_estimate(sig_of[a], sig_of[b]) >= t}
        assert len(kept) + rejected == len(edges)
        # One LSH partition: its group holds the signature blobs beside the band blobs.
        one = [blob for _, blob in batches(lambda k, s: band_blobs(k, s, 14, 8, 1), 5)]
        local, local_rejected = verify_local(one + [b for _, b in sig_blobs], Edges.from_pairs(sorted(edges)), 112, t)
        assert set(local.key_pairs()) == kept and local_rejected == rejected
        if partitions == 1:  # one join group: join 1 verifies by itself
            blobs = [b for _, b in sig_blobs + list(edge_blobs(Edges.from_pairs(sorted(edges)), 1))]
            whole, whole_rejected = verify_in_group(blobs, 112, t)
            assert set(whole.key_pairs()) == kept and whole_rejected == rejected
            assert dict(whole.labels()) == union_find_components(kept)
    # A star forest keeps the components and sends every node to its component's minimum.
    forest = star_forest(edges)
    assert union_find_components(forest) == union_find_components(edges)
    assert all(r == min(k for k, c in union_find_components(edges).items() if c == r) for _, r in forest)
    empty, big = bucket_edges([], 16)
    assert len(empty) == 0 and big == 0


def test_survivor_order():
    q_hi = _doc("z", "short", quality_score=0.9)
    q_lo = _doc("a", "a much longer text here", quality_score=0.1)
    no_q = _doc("0", "the longest text of them all, by far", quality_score=None)
    nan_q = _doc("1", "x", quality_score=float("nan"))
    assert choose_survivor([q_lo, no_q, q_hi, nan_q]) is q_hi  # quality first, absent/NaN last
    assert choose_survivor([q_lo, no_q, nan_q]) is q_lo
    assert choose_survivor([no_q, nan_q]) is no_q  # no quality: longest
    assert choose_survivor([q_lo, no_q, q_hi], mode="longest") is no_q
    assert choose_survivor([q_lo, no_q, q_hi], mode="first_id") is no_q  # "0" < "a" < "z"
    same_a, same_b = _doc("b", "same text"), _doc("a", "same text")
    assert choose_survivor([same_a, same_b]) is same_b  # then the smallest id
    neg = _doc("n", "t", quality_score=-2.0)
    assert choose_survivor([neg, _doc("m", "t", quality_score=-1.0)])["id"] == "m"
    assert choose_survivor([neg, _doc("m", "t")]) is neg
    for mode in ("quality", "longest", "first_id"):
        for ident in ("doc-1", "a\x00b", "ünïcode", ""):
            key = node_key(_doc(ident, "text"), exact_hash("text"), mode)
            assert node_id(key, mode) == ident
    # byte order of the keys is string order of the ids, NUL included
    ids = ["a", "a\x00", "a\x00b", "a\x01", "ab", "b"]
    keys = [node_key(_doc(i, "t"), exact_hash("t"), "first_id") for i in ids]
    assert sorted(keys) == keys


def test_exact_verdicts_from_mixed_records():
    """Several exact groups' records in any order (as a spilled join group gives them), read
    twice: the same verdicts whatever the order."""
    def key(i, text):
        return node_key(_doc(i, text), exact_hash(text), "first_id")

    a1, a2, a3 = key("a1", "alpha"), key("a2", "Alpha"), key("a3", "ALPHA ")  # one exact group
    lone = key("b", "beta")  # no copies, no component: unique, no verdict
    c = key("c", "gamma")  # in a component whose smallest node is d: a near duplicate...
    d = key("d", "delta")  # ...and d survives, labelled with itself
    records = [(node_hash(k), (0, k)) for k in (a3, a1, lone, c, a2, c, d)]
    records += [(node_hash(c), (2, d)), (node_hash(c), (2, d)), (node_hash(d), (2, d))]
    want = sorted([
        (a1, "a1", None), (a2, "a1", EXACT), (a3, "a1", EXACT),
        (c, "d", NEAR), (c, "d", EXACT),  # a second record with the very same key is a copy
        (d, "d", None),
    ])
    for seed in range(4):
        random.Random(seed).shuffle(records)
        got = list(exact_verdicts(records, "first_id"))
        assert sorted((v.key, v.cluster, v.reason) for v in got) == want
        assert {v.label for v in got if v.cluster == "d"} == {d}
        sizes = {(v.key, v.reason): v.size for v in sized(got)}
        assert sizes[(a2, EXACT)] == 3 and sizes[(c, NEAR)] == 3 and sizes[(d, None)] == 3
        assert [v.label for v in sized(got)] == [v.label for v in got]  # kept for the cluster statistics
    assert list(exact_verdicts([], "first_id")) == []


def test_union_find_reference_and_sizes():
    comps = union_find_components([(3, 4), (4, 5), (1, 2), (9, 9)])
    assert comps == {1: 1, 2: 1, 3: 3, 4: 3, 5: 3, 9: 9}
    assert [size_bucket(n) for n in (2, 3, 4, 5, 8, 9, 16, 17)] == [
        "2",
        "3-4",
        "3-4",
        "5-8",
        "5-8",
        "9-16",
        "9-16",
        "17-32",
    ]


def test_config():
    cfg = DedupConfig()
    assert (cfg.enabled, cfg.ngram, cfg.bands, cfg.rows, cfg.verify, cfg.survivor) == (
        True,
        5,
        14,
        8,
        True,
        "quality",
    )
    assert JobConfig.model_validate({"dedup": {"enabled": True, "max_rounds": 3}}).dedup.max_rounds == 3
    for bad in (
        {"bands": 0},
        {"rows": -1},
        {"ngram": 0},
        {"verify_threshold": 1.5},
        {"survivor": "random"},
        {"max_rounds": -1},
        {"bucket_all_pairs_max": 1},
        {"bands": 512, "rows": 512},
        {"shingle": 5},
    ):
        with pytest.raises(ValidationError):
            DedupConfig.model_validate(bad)


# --------------------------------------------------------------------------- components


def _random_graph(rng: random.Random, n: int, m: int) -> list[tuple[int, int]]:
    return [(rng.randrange(n), rng.randrange(n)) for _ in range(m)]


def _path(nodes: list) -> list[tuple]:
    return [(nodes[i], nodes[i + 1]) for i in range(len(nodes) - 1)]


def _expected(edges):
    # ConnectedComponents ignores self-loops (Dedup never emits one); the reference keeps them.
    return sorted(union_find_components([(a, b) for a, b in edges if a != b]).items())


@pytest.mark.slow
def test_components_equal_union_find():
    rng = random.Random(7)
    cases = {
        "sparse": _random_graph(rng, 300, 200),  # many small trees, self-loops, duplicates
        "dense": _random_graph(rng, 200, 400),  # one giant component and stragglers
        "stars": [(0, i) for i in range(1, 60)] + [(i, 100) for i in range(60, 99)] + [(59, 60)],
        "path": [(i, i + 1) for i in range(0, 120)],  # the worst case for label propagation
        "shuffled_path": _path(rng.sample(range(1000), 150)),
        "self_loops": [(1, 1), (2, 2), (2, 3), (4, 4), (3, 4)],
        "strings": [(f"n{rng.randrange(80)}", f"n{rng.randrange(80)}") for _ in range(70)],
    }
    with BeamTestPipeline() as p:
        for name, edges in cases.items():
            got = (
                p | f"Create_{name}" >> beam.Create(edges) | f"CC_{name}" >> ConnectedComponents(max_rounds=6)
            )
            assert_that(got, equal_to(_expected(edges)), label=f"Check_{name}")


def test_components_finish_when_rounds_run_out():
    # A shuffled path of 400 nodes needs several rounds; with 0 and 1 round the residual
    # union-find has to finish the job, and the residual counter says so.
    rng = random.Random(11)
    order = rng.sample(range(10_000), 400)
    edges = _path(order) + _random_graph(rng, 10_000, 300)
    p = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"]))
    for rounds in (0, 1, 8):
        got = (
            p
            | f"Create{rounds}" >> beam.Create(edges)
            | f"CC{rounds}" >> ConnectedComponents(max_rounds=rounds)
        )
        assert_that(got, equal_to(_expected(edges)), label=f"Check{rounds}")
    result = p.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in result.metrics().query()["counters"]}
    assert counters.get("cc_residual_edges", 0) > 0
    assert counters.get("cc_round0_large_star_changed", 0) > 0


def test_signatures_do_not_load_datasketch():
    """Importing datasketch (and scipy) cost every worker 0.4 s: the pipeline does without it."""
    code = ("import sys; from tokenmill.transforms.dedup.minhash import MinHasher; "
            "MinHasher(112).text_signature('a b c d e f g', 5); print('datasketch' in sys.modules, 'scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]

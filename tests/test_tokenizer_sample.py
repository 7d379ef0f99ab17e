"""The tokenizer's training sample: bounded in documents and characters, the same whatever the
runner's bundling (merge order), and each exact copy of a text once. Items are (key,
characters, where); here ``where`` is the text itself."""

import random

from tokenmill.transforms.tokenization import SampleFn, sample_prefix, unique_texts


def corpus(n=500, seed=0):
    rng = random.Random(seed)
    texts = ["x" * rng.randint(1, 300) for _ in range(n)]
    return [((rng.getrandbits(64).to_bytes(8, "big"), f"d{i}"), len(t), t) for i, t in enumerate(texts)]


def run_combine(items, parts, fn, seed):
    rng = random.Random(seed)
    accs = [fn.create_accumulator() for _ in range(parts)]
    for item in items:
        acc = rng.choice(accs)
        fn.add_input(acc, item)
    rng.shuffle(accs)
    while len(accs) > 1:  # merge in a random tree
        k = rng.randint(2, len(accs))
        accs = [fn.merge_accumulators(accs[:k])] + accs[k:]
    return fn.extract_output(accs[0])


def test_sample_is_the_bounded_smallest_prefix_in_any_merge_order():
    items = corpus()
    want = sample_prefix(items, 120, 9_000)
    assert sum(c for _, c, _ in want) <= 9_000 and len(want) <= 120
    assert want == sorted(items)[:len(want)]  # the smallest keys, nothing skipped
    nxt = sorted(items)[len(want)]
    assert sum(c for _, c, _ in want) + nxt[1] > 9_000 or len(want) == 120  # and as long as allowed
    fn = SampleFn(120, 9_000)
    for parts, seed in ((1, 0), (3, 1), (7, 2), (20, 3)):
        assert run_combine(items, parts, fn, seed) == want


def test_a_part_keeps_the_item_that_ends_the_prefix():
    """The global prefix of a(5), z(8), y(2) under 10 chars is [a]; a part {a, z} that dropped z
    would let y in when merged with a part {y}."""
    fn = SampleFn(10, 10)
    a, z, y = ((b"a", "a"), 5, "a"), ((b"m", "z"), 8, "z"), ((b"y", "y"), 2, "y")
    parts = [fn._cut({"items": [a, z], "chars": 0}), fn._cut({"items": [y], "chars": 0})]
    assert fn.extract_output(fn.merge_accumulators(parts)) == [a] == sample_prefix([a, z, y], 10, 10)


def test_one_document_always_and_the_doc_cap():
    items = corpus(50)
    assert len(sample_prefix(items, 5, 10**9)) == 5
    assert len(sample_prefix([((b"a", "a"), 500, "y")], 5, 10)) == 1  # a lone long document is kept


def test_exact_copies_count_once_in_key_order():
    sample = [((b"\x03", "c"), 4, "same"), ((b"\x01", "a"), 4, "same"), ((b"\x02", "b"), 5, "other")]
    assert list(unique_texts(t for _, _, t in sorted(sample))) == ["same", "other"]

"""The grouped sample order (tokenmill/trainer/order.py: data.shuffle_shards, data.lanes): a pure
function of (seed, g); every window of a lane once per epoch, none across a shard's end; a rank
reads only its own lanes' shards; a group's windows before the next group's; the loader on it
resumes exactly. Shards are written with the pipeline's own writer (trainer_helpers)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainer_helpers import make_output  # noqa: E402

from tokenmill.data import PackedDataset, batch_indices  # noqa: E402
from tokenmill.errors import UserError  # noqa: E402
from tokenmill.trainer import windows as D  # noqa: E402
from tokenmill.trainer.order import Order, deal_lanes  # noqa: E402

SEQ = 16


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return make_output(tmp_path_factory.mktemp("order") / "o", 600, seed=3, n_shards=8)


def dataset(out, order, seed=7):
    m = D.open_output(out)
    return D.PackedWindows([D.split_stream(out, m, "train")], SEQ, seed, order=order)


def shard_windows(stream) -> set[int]:
    """Every whole window of every shard, by its first token: what an epoch of all lanes covers."""
    starts = np.concatenate([[0], np.cumsum(stream.tokens_per_shard())])
    return {int(starts[f]) + w * SEQ for f, n in enumerate(stream.tokens_per_shard()) for w in range((n - 1) // SEQ)}


def test_default_order_is_unchanged_by_the_option():
    assert not Order().grouped and not Order(0, 1, 8).grouped and Order(2, 1).grouped and Order(0, 2).grouped


def test_grouped_order_is_pure_and_covers_every_window_of_a_lane_once_per_epoch(out):
    order = Order(group=2, lanes=2, chunk=3)
    ds = dataset(out, order)
    stream = ds.streams[0]
    lanes = ds.lanes[0]
    total = sum(lw.windows for lw in lanes)
    assert len(shard_windows(stream)) == total > 0
    n = 3 * total
    first = [ds.locate(g) for g in range(n)]
    again = dataset(out, order)
    assert [again.locate(g) for g in reversed(range(n))][::-1] == first  # no hidden iteration state
    by_lane: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    for g, (_, epoch, start) in enumerate(first):
        by_lane[order.lane(g)[0]].append((epoch, start))
    starts = np.concatenate([[0], np.cumsum(stream.tokens_per_shard())])
    for lane, seen in by_lane.items():
        mine = {f for f in lanes[lane].shards}
        W = lanes[lane].windows
        epoch0 = [s for e, s in seen[:W]]
        assert {e for e, _ in seen[:W]} == {0} and len(set(epoch0)) == W  # each window once in its epoch
        assert [s for e, s in seen[W:2 * W]] != epoch0 and sorted(s for _, s in seen[W:2 * W]) == sorted(epoch0)
        for s in epoch0:  # the window lies inside one shard of this lane
            f = int(np.searchsorted(starts, s, side="right")) - 1
            assert f in mine and s + SEQ + 1 <= starts[f + 1]
    assert set(s for _, _, s in first) == shard_windows(stream)
    other = dataset(out, order, seed=8)
    assert [other.locate(g) for g in range(50)] != first[:50]


def test_a_group_is_read_before_the_next(out):
    order = Order(group=2, lanes=1, chunk=1)
    ds = dataset(out, order)
    lw = ds.lanes[0][0]
    starts = np.concatenate([[0], np.cumsum(ds.streams[0].tokens_per_shard())])
    shard_of = [int(np.searchsorted(starts, ds.locate(g)[2], side="right")) - 1 for g in range(lw.windows)]
    groups, seen = [], set()
    for f in shard_of:  # runs of at most 2 distinct shards, never revisited
        if f not in seen:
            if not groups or len(groups[-1]) == 2:
                groups.append(set())
            groups[-1].add(f)
            seen.add(f)
    runs = [next(i for i, grp in enumerate(groups) if f in grp) for f in shard_of]
    assert runs == sorted(runs) and len(groups) == 4


def test_each_rank_reads_only_its_own_lanes_and_the_union_does_not_depend_on_the_world(out):
    B = 2
    order = Order(group=1, lanes=4, chunk=B)
    ds = dataset(out, order)
    starts = np.concatenate([[0], np.cumsum(ds.streams[0].tokens_per_shard())])
    lane_of = {f: lane for lane, fs in enumerate(deal_lanes(7, 0, 8, 4)) for f in fs}

    def shards(world: int, rank: int, steps: int) -> set[int]:
        got = set()
        for j in range(steps):
            for g in batch_indices(0, j, B, rank, world):
                got.add(int(np.searchsorted(starts, ds.locate(g)[2], side="right")) - 1)
        return got

    for world in (2, 4):
        per_rank = [shards(world, r, 200) for r in range(world)]
        for r, got in enumerate(per_rank):
            assert {lane_of[f] % world for f in got} == {r}, (world, r, got)
        assert all(not a & b for i, a in enumerate(per_rank) for b in per_rank[i + 1:])
    # sample g is the same window whatever the world: only who reads it changes
    again = dataset(out, order)
    assert [ds.locate(g) for g in range(64)] == [again.locate(g) for g in range(64)]


def test_more_lanes_than_shards_is_one_line(out):
    with pytest.raises(UserError, match=r"data.lanes 9: .* 8 shard\(s\) .* lane 8 would get none"):
        dataset(out, Order(group=0, lanes=9, chunk=1))


def test_the_loader_on_a_grouped_order_resumes_exactly(out):
    order = Order(group=2, lanes=2, chunk=4)
    kw = dict(seq_len=SEQ, seed=1, rank=1, world=2, batch_size=4, order=order)
    whole = iter(PackedDataset(out, **kw))
    want = [next(whole)["tokens"] for _ in range(12)]
    later = iter(PackedDataset(out, first_sample=6 * 4 * 2, **kw))
    assert all(torch.equal(a, next(later)["tokens"]) for a in want[6:])

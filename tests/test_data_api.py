"""tokenmill.data.PackedDataset, the loader as a library: resumes mid-epoch through torchdata's
StatefulDataLoader with the same batches, order independent of workers, ranks that split the
stream, checksums verified at construction, mixtures, document masks."""

import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

from trainer_helpers import make_output  # noqa: E402

from tokenmill.data import PackedDataset  # noqa: E402
from tokenmill.errors import UserError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


@pytest.fixture(scope="module")
def outs(tmp_path_factory):
    root = tmp_path_factory.mktemp("data_api")
    return make_output(root / "a", 300, seed=11), make_output(root / "b", 200, seed=12)


def take(it, n):
    return [next(it)["tokens"].clone() for _ in range(n)]


@pytest.mark.parametrize("workers, in_dataset", [(0, True), (2, True), (0, False), (2, False)])
def test_stateful_dataloader_resumes_mid_epoch_with_the_same_batches(outs, workers, in_dataset):
    """Batches made by the dataset (batch_size=4, the loader's None) or by the loader from
    single samples: either way the resumed loader goes on with the same batches."""
    def make():
        ds = PackedDataset(outs[0], seq_len=32, seed=4, batch_size=4 if in_dataset else 1)
        return stateful.StatefulDataLoader(ds, batch_size=None if in_dataset else 4, num_workers=workers)

    loader = make()
    it = iter(loader)
    take(it, 5)
    state = loader.state_dict()
    want = take(it, 7)
    resumed = make()
    resumed.load_state_dict(state)
    got = take(iter(resumed), 7)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert want[0].shape == (4, 33) and want[0].dtype == torch.int64


def test_order_does_not_depend_on_workers_and_ranks_split_the_stream(outs):
    from torch.utils.data import DataLoader

    def batches(workers, rank=0, world=1, n=6):
        ds = PackedDataset(outs[0], seq_len=32, seed=2, rank=rank, world=world, batch_size=2)
        return take(iter(DataLoader(ds, batch_size=None, num_workers=workers)), n)

    one = batches(0)
    assert all(torch.equal(a, b) for a, b in zip(one, batches(2))) and all(torch.equal(a, b) for a, b in zip(one, batches(3)))
    # world 2: batch j of rank r is global batch 2j + r (rank 0 and 1 together: one world-1 step of 4)
    single = torch.stack(batches(0, n=6))
    r0, r1 = torch.stack(batches(0, 0, 2, n=3)), torch.stack(batches(1, 1, 2, n=3))
    assert torch.equal(single[0::2], r0) and torch.equal(single[1::2], r1)


def test_checksums_mixtures_masks_and_state_checks(outs, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(outs[0], bad)
    shard = next((bad / "shards").glob("train-*.arrow"))
    data = bytearray(shard.read_bytes())
    data[200] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match="sha256"):
        PackedDataset(str(bad), seq_len=32)
    PackedDataset(str(bad), seq_len=32, verify_checksums=False)  # sizes only: it opens

    mix = PackedDataset(list(outs), seq_len=16, seed=0, weights=[3, 1])
    sources = [mix.windows.locate(g)[0] for g in range(400)]
    assert 250 < sources.count(0) < 350

    item = next(iter(PackedDataset(outs[0], seq_len=32, doc_mask=True)))
    assert set(item) == {"tokens", "positions", "doc_ids"} and item["positions"].shape == (32,)

    ds = PackedDataset(outs[0], seq_len=32, seed=1)
    with pytest.raises(UserError, match="seed"):
        ds.load_state_dict({**ds.state_dict(), "seed": 2})
    with pytest.raises(UserError, match="rank"):
        PackedDataset(outs[0], seq_len=32, rank=2, world=2)

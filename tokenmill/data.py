"""tokenmill's loader as a library, for any PyTorch trainer (HF Trainer, litgpt, torchtitan, a
loop of your own); ``tokenmill train`` uses the same class.

    from tokenmill.data import PackedDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = PackedDataset("out/", seq_len=1024, seed=0, rank=rank, world=world, batch_size=8)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    for batch in loader:            # batch["tokens"]: [8, 1025] int64 (inputs = [:, :-1], targets = [:, 1:])
        ...
    state = loader.state_dict()     # with the model's checkpoint; later:
    loader.load_state_dict(state)   # the same batches go on, exactly

What it gives:
- Packed windows of ``seq_len + 1`` tokens cut from the documents joined by EOS, memory-mapped
  from the shards (no copy of a shard in memory, no decoding).
- Order: global sample ``g`` is a pure function of ``(seed, g)`` (a permutation per epoch,
  and per mixture source, see tokenmill/trainer/windows.py); rank ``r`` of ``world`` takes the
  batches ``j*world + r`` of ``batch_size`` consecutive samples, so every rank sees other data
  and the union does not depend on the world size's batching.
- Checksums of every shard verified against the manifest when the dataset is made
  (``verify_checksums=False``: sizes only).
- Mixtures: several outputs with ``weights``.
- Outputs on an object store (s3://, gs://): each shard fetched into a bounded local cache when
  first read, checked against the manifest's sha256. ``order=Order(group=N, lanes=L,
  chunk=batch_size)`` (tokenmill/trainer/order.py) bounds what a rank needs at once and, with L
  a multiple of ``world``, has every rank fetch only its own shards.
- ``state_dict``/``load_state_dict`` per DataLoader worker (what torchdata's
  StatefulDataLoader saves and restores), or ``first_sample`` to start at a global sample.

Batch in the dataset (``batch_size=B``, the DataLoader's ``batch_size=None``) for an order that
does not depend on ``num_workers``: a DataLoader that batches single samples (``batch_size=1``
here, B there, as HF Trainer does) lets each worker batch its own samples, so which samples
share a batch then depends on the number of workers (still the same for a rerun and a resume).
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import IterableDataset, get_worker_info

from tokenmill.errors import UserError
from tokenmill.trainer.order import Order
from tokenmill.trainer.windows import PackedWindows, check_compatible, open_output, split_stream

__all__ = ["PackedDataset", "batch_indices", "loader"]


def batch_indices(first_sample: int, j: int, batch_size: int, rank: int, world: int) -> list[int]:
    """Global sample indices of this rank's ``j``-th batch: batch ``j`` of every rank together
    is the contiguous range of ``batch_size * world`` samples after ``j`` such ranges."""
    start = first_sample + (j * world + rank) * batch_size
    return list(range(start, start + batch_size))


class PackedDataset(IterableDataset):
    """An endless stream of this rank's packed windows (``batch_size`` 1: one sample per item,
    for a DataLoader to batch) or of whole micro-batches (``batch_size`` > 1: give the
    DataLoader ``batch_size=None``). Items are dicts of tensors: ``tokens`` [T+1] (or [B, T+1])
    int64 and, with ``doc_mask``, ``positions`` and ``doc_ids`` [T] for per-document RoPE and
    attention. A shard that fails while being read yields ``{"error": line}`` (raised in a
    worker it would reach the trainer only as a traceback's text)."""

    def __init__(self, data: str | list[str], seq_len: int, seed: int = 0, rank: int = 0, world: int = 1,
                 batch_size: int = 1, weights: list[float] | None = None, doc_mask: bool = False,
                 split: str = "train", verify_checksums: bool = True, first_sample: int = 0,
                 windows: PackedWindows | None = None, order: Order | None = None):
        if not 0 <= rank < world or batch_size < 1 or seq_len < 1 or first_sample < 0:
            raise UserError(f"PackedDataset: need 0 <= rank < world, batch_size >= 1, seq_len >= 1, first_sample "
                            f">= 0 (got rank {rank}, world {world}, batch_size {batch_size}, seq_len {seq_len}, "
                            f"first_sample {first_sample})")
        if windows is None:  # the trainer passes its own (its ranks verified the checksums together)
            paths = [data] if isinstance(data, str) else list(data)
            manifests = [open_output(p, verify_checksums) for p in paths]
            tok = check_compatible(manifests, paths)
            streams = [split_stream(p, m, split) for p, m in zip(paths, manifests)]
            windows = PackedWindows(streams, seq_len, seed, weights, doc_mask, tok["vocab_size"], order)
        self.windows = windows
        self.seed, self.rank, self.world, self.batch_size, self.first = seed, rank, world, batch_size, first_sample
        self._next = 0  # this worker's next item (each DataLoader worker has its own copy)

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        while True:
            # Worker w makes items w, w + W, ...: a DataLoader takes them round-robin, so the
            # order never depends on the number of workers.
            j = self._next * workers + worker
            item = self.windows.__getitems__(batch_indices(self.first, j, self.batch_size, self.rank, self.world))
            self._next += 1
            if self.batch_size == 1 and "error" not in item:
                item = {k: v[0] for k, v in item.items()}
            yield item

    def state_dict(self) -> dict:
        """This worker's position (restore with the same num_workers: each worker's own items)."""
        return {"next": self._next, "first_sample": self.first, "seed": self.seed, "rank": self.rank,
                "world": self.world, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        diff = [k for k in ("first_sample", "seed", "rank", "world", "batch_size") if state.get(k) != mine[k]]
        if diff:
            raise UserError(f"PackedDataset state is for another stream ({', '.join(f'{k} {state.get(k)} != {mine[k]}' for k in diff)})")
        self._next = int(state["next"])

    def filler(self, n: int) -> dict:
        return self.windows.filler(n)

    def check_files(self) -> None:
        self.windows.check_files()


def loader(dataset: PackedDataset, num_workers: int, prefetch_factor: int, pin_memory: bool):
    """The trainer's DataLoader: whole micro-batches from the workers, in order."""
    from torch.utils.data import DataLoader

    extra = {"prefetch_factor": prefetch_factor, "persistent_workers": True,
             "worker_init_fn": _leave_sigterm_to_the_trainer} if num_workers else {}
    return DataLoader(dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, **extra)


def _leave_sigterm_to_the_trainer(_worker_id: int) -> None:
    """In a DataLoader worker: ignore SIGTERM. Schedulers (``timeout``, ``scancel``, Kubernetes)
    send it to the whole process group; the trainer then saves a checkpoint at the end of the
    step and stops its workers itself, while a worker that died of it would end the run with
    DataLoader's traceback and no checkpoint."""
    import signal

    from tokenmill.trainer.preflight import release_run_dir

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A forked worker shares the trainer's lock on RUN (an flock lives while any process holds
    # its file open): a trainer killed outright would leave its RUN locked until the workers noticed.
    release_run_dir()

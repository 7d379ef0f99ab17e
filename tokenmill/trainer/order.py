"""Which window each global sample reads, when the data is too big to have at hand at once.

The default order (``data.shuffle_shards`` 0, ``data.lanes`` 1) is one permutation over every
window of a split per epoch (windows.py): the best mix, but every step touches shards all over
the output, so a trainer that streams its shards from an object store would need all of them in
its cache. The grouped order gives each rank a working set it can fetch and bound, as a pure
function of ``(seed, g)``, so a resume is as exact as ever:

- Windows are cut per shard (``(tokens - 1) // seq_len`` of them, none across a shard's end:
  at most ``seq_len`` tokens a shard go unused), so a window needs exactly one shard.
- **Lanes** (``data.lanes`` L): every source's shards are dealt to L lanes (a seeded shuffle,
  dealt round-robin), and global samples in runs of ``chunk`` (the micro-batch) go to lane
  ``(g // chunk) % L``. Rank r of ``world`` takes micro-batches ``j*world + r``, so with L a
  multiple of the world size rank r only ever reads lanes r, r + world, ...: **every rank fetches
  only its own shards**. The order is a function of L, not of the world size: the same L on
  another number of ranks gives the same samples, only fetched by other ranks.
- **Groups** (``data.shuffle_shards`` N): in each epoch of a lane, its shards are shuffled and
  taken N at a time; the windows of a group are shuffled among themselves and read before the
  next group's. A rank needs the shards of its current group, and the next group's ahead.

Each lane is its own epoch cycle of the mixture's pattern (windows.mixture_block).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from tokenmill.errors import UserError


@dataclass(frozen=True)
class Order:
    group: int = 0  # shards per shuffle group; 0: all of a lane's shards in one group
    lanes: int = 1
    chunk: int = 1  # consecutive samples one lane takes (the trainer: its micro-batch)

    @property
    def grouped(self) -> bool:
        return self.group > 0 or self.lanes > 1

    def lane(self, g: int) -> tuple[int, int]:
        """(lane, index among that lane's samples) of global sample ``g``."""
        c, within = divmod(g, self.chunk)
        rnd, lane = divmod(c, self.lanes)
        return lane, rnd * self.chunk + within


def seed_words(*parts) -> list[int]:
    h = hashlib.blake2b(":".join(str(p) for p in parts).encode(), digest_size=16).digest()
    return [int.from_bytes(h[i:i + 4], "little") for i in range(0, 16, 4)]


def _rng(*parts) -> np.random.Generator:
    return np.random.default_rng(seed_words(*parts))


class LaneWindows:
    """The windows of one source's lane, grouped and shuffled per epoch: ``start(j)`` is the
    stream offset of the lane's ``j``-th window, ``group(j)`` the shards it belongs with."""

    def __init__(self, seed: int, source: int, lane: int, shards: list[int], shard_starts: list[int],
                 shard_tokens: list[int], seq_len: int, group: int):
        self.seed, self.source, self.lane, self.seq_len = seed, source, lane, seq_len
        self.shards = shards  # stream indices of this lane's shards, ascending
        self.starts = {f: shard_starts[f] for f in shards}
        self.counts = {f: max(0, (shard_tokens[f] - 1) // seq_len) for f in shards}
        self.group = group or len(shards)
        self.windows = sum(self.counts.values())
        self._epochs: dict[int, tuple[list[list[int]], np.ndarray]] = {}  # epoch -> (groups, cumulative windows)
        self._perm: dict[tuple[int, int], np.ndarray] = {}

    def _groups(self, epoch: int) -> tuple[list[list[int]], np.ndarray]:
        if epoch not in self._epochs:
            order = [self.shards[i] for i in _rng(self.seed, self.source, self.lane, epoch, "shards")
                     .permutation(len(self.shards))] if len(self.shards) > self.group else list(self.shards)
            groups = [order[i:i + self.group] for i in range(0, len(order), self.group)]
            if len(self._epochs) > 1:  # this epoch and the next: nothing grows with the run
                self._epochs.pop(min(self._epochs))
            self._epochs[epoch] = (groups, np.cumsum([sum(self.counts[f] for f in grp) for grp in groups]))
        return self._epochs[epoch]

    def locate(self, j: int) -> tuple[int, int, int]:
        """(epoch, group, stream offset) of the lane's ``j``-th window."""
        epoch, pos = divmod(j, self.windows)
        groups, cum = self._groups(epoch)
        t = int(np.searchsorted(cum, pos, side="right"))
        within = pos - (int(cum[t - 1]) if t else 0)
        perm = self._perm.get((epoch, t))
        if perm is None:
            if len(self._perm) > 4:  # the current group and the next: nothing grows with the run
                self._perm.clear()
            perm = self._perm[(epoch, t)] = _rng(self.seed, self.source, self.lane, epoch, t).permutation(
                int(cum[t]) - (int(cum[t - 1]) if t else 0))
        k = int(perm[within])
        for f in groups[t]:  # the k-th window of the group, shard after shard
            if k < self.counts[f]:
                return epoch, t, self.starts[f] + k * self.seq_len
            k -= self.counts[f]
        raise AssertionError("window outside its group")

    def group_shards(self, j: int) -> tuple[list[int], list[int]]:
        """The shards of the group of window ``j`` and of the group after it (the next epoch's
        first where ``j``'s is the epoch's last)."""
        epoch, pos = divmod(j, self.windows)
        groups, cum = self._groups(epoch)
        t = int(np.searchsorted(cum, pos, side="right"))
        now = list(groups[t])
        if t + 1 < len(groups):
            return now, list(groups[t + 1])
        return now, list(self._groups(epoch + 1)[0][0])


def deal_lanes(seed: int, source: int, n_shards: int, lanes: int) -> list[list[int]]:
    """Shard indices of each lane: a seeded shuffle dealt round-robin (counts differ by one at most)."""
    perm = _rng(seed, source, "lanes").permutation(n_shards)
    return [sorted(int(f) for f in perm[lane::lanes]) for lane in range(lanes)]


def lane_windows(seed: int, source: int, name: str, shard_tokens: list[int], seq_len: int,
                 order: Order) -> list[LaneWindows]:
    starts = np.concatenate([[0], np.cumsum(shard_tokens)[:-1]]).astype(np.int64).tolist() if shard_tokens else []
    lanes = [LaneWindows(seed, source, lane, shards, starts, shard_tokens, seq_len, order.group)
             for lane, shards in enumerate(deal_lanes(seed, source, len(shard_tokens), order.lanes))]
    empty = [lw.lane for lw in lanes if not lw.windows]
    if empty:
        full = sum(1 for n in shard_tokens if n > seq_len)
        raise UserError(f"data.lanes {order.lanes}: {name} has {full} shard(s) with a whole window of seq_len + 1 = "
                        f"{seq_len + 1} tokens, so lane {empty[0]} would get none: lower data.lanes (or prepare "
                        "with smaller shards.target_bytes)")
    return lanes

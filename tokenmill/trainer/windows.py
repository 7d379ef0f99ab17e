"""Streaming tokenmill shards into packed training windows.

What `prepare` wrote (manifest.json + uncompressed Arrow IPC shards) is memory-mapped; the
``tokens`` values of every record batch are numpy views into the map (zero copies), and
together they form one token stream per split. Each document already ends with EOS (the
tokenizer stage appends it), so the concatenation is "documents joined by EOS".

The stream is cut into windows of ``seq_len + 1`` tokens (inputs and shifted targets)
that overlap by one token: window ``w`` covers ``[w*seq_len, w*seq_len + seq_len + 1)``.

Order. Global sample ``g`` (0, 1, 2, ... over the whole run) maps to a window by a pure
function of ``(seed, g)``: with several prepared outputs, a fixed seeded pattern of
``MIX_BLOCK`` slots assigns ``g`` to a source and a source-local index ``j``; then
``epoch = j // W`` and the window is ``permutation(seed, source, epoch)[j % W]``. Step ``s``
of the run consumes the global batch ``[first + s*G, first + (s+1)*G)``; rank ``r`` takes
micro-batch ``m`` as the ``micro_batch`` indices starting at ``m*micro_batch*world +
r*micro_batch``. DataLoader workers fetch whole micro-batches and the DataLoader returns
them in sampler order, so the batches never depend on ``num_workers``. A checkpoint needs
only the number of samples consumed (and the seed) to resume exactly.

That is the default order; ``data.shuffle_shards`` / ``data.lanes`` choose the grouped order
of order.py instead (windows cut per shard, read a few shards at a time, each rank its own
lanes), for outputs on an object store bigger than the local cache.
"""

from __future__ import annotations

import numpy as np

from tokenmill.errors import UserError
from tokenmill.trainer.order import LaneWindows, Order, lane_windows, seed_words
from tokenmill.trainer.token_stream import (  # noqa: F401  (split_files, check_cache_fits: imported from here too)
    TokenStream,
    check_cache_fits,
    split_files,
    split_stream,
)

MIX_BLOCK = 10_000  # mixture weights are honoured to 1/MIX_BLOCK within every block of samples


# ---------------------------------------------------------------- manifests and verification


def open_output(out: str, verify_checksums: bool = True, part: tuple[int, int] = (0, 1)) -> dict:
    """The manifest of a prepared output, after checking its shards; one clear line otherwise.
    ``part`` (i, n): hash only the i-th of every n shards (each rank its own slice)."""
    from tokenmill.format import check_vocab, load_manifest, verify_output
    from tokenmill.store import is_store

    manifest = load_manifest(out)
    check_vocab(out, manifest)
    # Without checksums: every shard's size (for outputs too big to hash at every start). On a
    # store, the tokenizer now and each shard when it is fetched (split_stream).
    remote = is_store(out)
    problems = verify_output(out, manifest, part if verify_checksums else (0, 1), checksums=verify_checksums or remote,
                             shards=not remote)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise UserError(f"refusing to train on {out}: {problems[0]}{more}; re-run `tokenmill prepare` "
                        f"or check it with `tokenmill inspect {out}`")
    return manifest


def check_compatible(manifests: list[dict], paths: list[str]) -> dict:
    """All sources of a mixture must share one tokenizer; returns its manifest entry."""
    tok = manifests[0]["tokenizer"]
    for m, p in zip(manifests[1:], paths[1:]):
        if m["tokenizer"]["sha256"] != tok["sha256"]:
            raise UserError(f"{p} was tokenized with a different tokenizer than {paths[0]}: "
                            "a mixture needs one tokenizer (re-run prepare with --set tokenize.tokenizer=...)")
    return tok


# ---------------------------------------------------------------- one split as a token stream


def n_windows(n_tokens: int, seq_len: int) -> int:
    return max(0, (n_tokens - 1) // seq_len)


# ---------------------------------------------------------------- sample order (pure functions)


def epoch_permutation(seed: int, source: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed_words(seed, source, epoch)).permutation(n)


def mixture_block(weights: list[float], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fixed pattern of MIX_BLOCK slots: (source of each slot, its rank among that source's
    slots, slots per source). Counts by largest remainder so they sum to MIX_BLOCK exactly."""
    w = np.asarray(weights, dtype=np.float64) / sum(weights)
    raw = w * MIX_BLOCK
    counts = np.floor(raw).astype(np.int64)
    for k in np.argsort(-(raw - counts), kind="stable")[: MIX_BLOCK - counts.sum()]:
        counts[k] += 1
    labels = np.repeat(np.arange(len(w)), counts)
    labels = labels[np.random.default_rng(seed_words(seed, "mix")).permutation(MIX_BLOCK)]
    rank = np.zeros(MIX_BLOCK, dtype=np.int64)
    seen = np.zeros(len(w), dtype=np.int64)
    for i, k in enumerate(labels):
        rank[i] = seen[k]
        seen[k] += 1
    return labels, rank, counts


# ---------------------------------------------------------------- the training dataset


class PackedWindows:
    """Map-style dataset: global sample index -> one window of ``seq_len + 1`` token ids.

    ``__getitems__`` (what DataLoader calls with a micro-batch of indices) returns the batch
    as tensors: ``tokens`` [B, T+1] int64 and, with ``doc_mask``, ``positions`` and ``doc_ids``
    [B, T] for per-document attention and RoPE positions that restart at each document. A
    UserError (a shard that shrank, a token id >= ``vocab_size``) comes back as ``{"error":
    line}``: raised in a DataLoader worker, it would reach the loop as a traceback's text.
    """

    def __init__(self, streams: list[TokenStream], seq_len: int, seed: int, weights: list[float] | None = None,
                 doc_mask: bool = False, vocab_size: int | None = None, order: Order | None = None):
        self.streams, self.seq_len, self.seed, self.doc_mask = streams, seq_len, seed, doc_mask
        self.eos_id, self.vocab_size, self.order = streams[0].eos_id, vocab_size, order or Order()
        self.lanes: list[list[LaneWindows]] = []  # the grouped order (order.py): source -> its lanes
        if self.order.grouped:
            self.lanes = [lane_windows(seed, k, s.files[0] if s.files else f"source {k}", s.tokens_per_shard(),
                                       seq_len, self.order) if sum(s.tokens_per_shard()) > seq_len else []
                          for k, s in enumerate(streams)]
            self.windows = [sum(lw.windows for lw in lanes) for lanes in self.lanes]
        else:
            self.windows = [n_windows(len(s), seq_len) for s in streams]
        weights = list(weights) if weights else [1.0] * len(streams)
        self.weights = [w if n else 0.0 for w, n in zip(weights, self.windows)]
        if not sum(self.weights):
            raise UserError(f"the train split has fewer than seq_len+1 = {seq_len + 1} tokens"
                            f"{' in a shard' if self.order.grouped else ''}: lower data.seq_len or prepare more data")
        self._labels, self._rank, self._counts = mixture_block(self.weights, seed)
        self._perms: dict[int, tuple[int, np.ndarray]] = {}  # source -> (epoch, its permutation)

    def locate(self, g: int) -> tuple[int, int, int]:
        """(source, epoch, first token of the window) of global sample ``g``: a pure function of
        (seed, g) and the order."""
        lane, k, j = self._sample(g)
        if self.order.grouped:
            epoch, _, start = self.lanes[k][lane].locate(j)
            return k, epoch, start
        epoch, pos = divmod(j, self.windows[k])
        cached = self._perms.get(k)
        if cached is None or cached[0] != epoch:  # one permutation per (source, epoch), cached
            cached = self._perms[k] = (epoch, epoch_permutation(self.seed, k, epoch, self.windows[k]))
        return k, epoch, int(cached[1][pos]) * self.seq_len

    def batch(self, indices: list[int]) -> dict:
        windows = [(k, start) for k, _, start in map(self.locate, indices)]
        out = read_windows(self.streams, windows, self.seq_len, self.vocab_size)
        if self.order.grouped:
            self._plan(indices)
        return as_batch(out, self.eos_id, self.doc_mask)

    def _sample(self, g: int) -> tuple[int, int, int]:
        """(lane, source, index among that source's samples in the lane) of global sample ``g``."""
        lane, i = self.order.lane(g) if self.order.grouped else (0, g)
        block, slot = divmod(i, MIX_BLOCK)
        k = int(self._labels[slot])
        return lane, k, block * int(self._counts[k]) + int(self._rank[slot])

    def _plan(self, indices: list[int]) -> None:
        """After a grouped batch: unmap every shard outside its groups, fetch the next groups'."""
        keep: dict[int, set[int]] = {}
        ahead: dict[int, list[int]] = {}
        for g in indices:
            lane, k, j = self._sample(g)
            now, nxt = self.lanes[k][lane].group_shards(j)
            keep.setdefault(k, set()).update(now)
            ahead.setdefault(k, []).extend(f for f in nxt if f not in ahead[k])
        for k, stream in enumerate(self.streams):
            stream.release(keep.get(k, set()))
            if k in ahead:
                stream.prefetch(sorted(keep[k]) + ahead[k])

    def __getitems__(self, indices: list[int]) -> dict:
        try:
            return self.batch(indices)
        except UserError as e:
            return {"error": str(e)}

    def __getitem__(self, g: int) -> dict:
        return {k: v[0] for k, v in self.batch([g]).items()}

    def docs_of(self, g: int) -> list[str]:
        """Ids of the documents global sample ``g``'s window is cut from."""
        k, _, start = self.locate(g)
        return self.streams[k].docs_in(start, start + self.seq_len + 1)

    def filler(self, n: int) -> dict:
        """A batch of ``n`` all-EOS windows: what a rank whose data failed computes on, to stay in
        step with the others' collectives until the step's all-reduce stops them all."""
        return as_batch(np.full((n, self.seq_len + 1), self.eos_id, dtype=np.int64), self.eos_id, self.doc_mask)

    def check_files(self) -> None:
        for s in self.streams:
            s.check_files()


def read_windows(streams: list[TokenStream], windows: list[tuple[int, int]], seq_len: int,
                 vocab_size: int | None) -> np.ndarray:
    """Rows [n, seq_len + 1] of token ids: the window of stream ``k`` from token ``start`` for each
    (k, start), checked."""
    out = np.empty((len(windows), seq_len + 1), dtype=np.int64)
    for row, (k, start) in enumerate(windows):
        streams[k].read(start, out[row])
    check_ids(out, [(streams[k], start) for k, start in windows], vocab_size)
    return out


def check_ids(out: np.ndarray, where: list[tuple[TokenStream, int]], vocab_size: int | None) -> None:
    """Token ids past the embedding (shards of another tokenizer, an edited manifest) stop here,
    naming the shard, not as an IndexError (on GPU: a device-side assert) in the model. ``where``:
    the stream and start offset of each row."""
    if vocab_size is None or not out.size or out.max() < vocab_size:
        return
    row, col = (int(i) for i in np.argwhere(out >= vocab_size)[0])
    stream, start = where[row]
    raise UserError(f"{stream.file_at(start + col)}: token id {out[row, col]} is >= the manifest's vocab_size "
                    f"{vocab_size}: shards and manifest do not belong together; check with `tokenmill inspect`")


def as_batch(out: np.ndarray, eos_id: int, doc_mask: bool) -> dict:
    import torch

    batch = {"tokens": torch.from_numpy(out)}
    if doc_mask:
        positions, doc_ids = document_positions(out[:, :-1], eos_id)
        batch["positions"], batch["doc_ids"] = torch.from_numpy(positions), torch.from_numpy(doc_ids)
    return batch


def document_positions(inputs: np.ndarray, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row document ids and positions that restart after every EOS (the token after an
    EOS starts a new document)."""
    B, T = inputs.shape
    new_doc = np.zeros((B, T), dtype=bool)
    new_doc[:, 1:] = inputs[:, :-1] == eos_id
    doc_ids = np.cumsum(new_doc, axis=1, dtype=np.int64)
    idx = np.broadcast_to(np.arange(T, dtype=np.int64), (B, T))
    starts = np.maximum.accumulate(np.where(new_doc, idx, 0), axis=1)
    return idx - starts, doc_ids


# ---------------------------------------------------------------- validation


def val_indices(streams: list[TokenStream], seq_len: int, samples: int) -> list[tuple[int, int]]:
    """The first ``samples`` windows of the val split, source after source, in order: the same
    set whatever the world size, so val_loss is comparable across runs."""
    out = []
    for k, s in enumerate(streams):
        for w in range(n_windows(len(s), seq_len)):
            if len(out) == samples:
                return out
            out.append((k, w * seq_len))
    return out


def val_batches(streams: list[TokenStream], seq_len: int, samples: int, micro_batch: int, rank: int, world: int,
                doc_mask: bool = False, vocab_size: int | None = None):
    """This rank's validation micro-batches as (batch, weight [B]) pairs. Every rank runs the same
    number of forwards (FSDP all-gathers need all ranks); padding rows repeat a window with weight 0."""
    import torch

    items = val_indices(streams, seq_len, samples)
    if not items:
        return []
    mine = items[rank::world]
    per_rank = -(-len(items) // world)
    micro_batch = min(micro_batch, per_rank)  # no batch of mostly padding when samples < micro_batch
    n_batches = -(-per_rank // micro_batch)
    weights = [1.0] * len(mine) + [0.0] * (n_batches * micro_batch - len(mine))
    mine = mine + [items[0]] * (len(weights) - len(mine))
    eos = streams[0].eos_id
    batches = []
    for b in range(n_batches):
        out = read_windows(streams, mine[b * micro_batch:(b + 1) * micro_batch], seq_len, vocab_size)
        batches.append((as_batch(out, eos, doc_mask), torch.tensor(weights[b * micro_batch:(b + 1) * micro_batch])))
    return batches

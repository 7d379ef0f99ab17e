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
"""

from __future__ import annotations

import bisect
import hashlib
import os
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from tokenmill.errors import UserError

MIX_BLOCK = 10_000  # mixture weights are honoured to 1/MIX_BLOCK within every block of samples


# ---------------------------------------------------------------- manifests and verification


def open_output(out: str, verify_checksums: bool = True, part: tuple[int, int] = (0, 1)) -> dict:
    """The manifest of a prepared output, after checking its shards; one clear line otherwise.
    ``part`` (i, n): hash only the i-th of every n shards (each rank its own slice)."""
    from tokenmill.format import check_vocab, load_manifest, verify_output

    manifest = load_manifest(out)
    check_vocab(out, manifest)
    # Without checksums: every shard's size (for outputs too big to hash at every start).
    problems = verify_output(out, manifest, part if verify_checksums else (0, 1), checksums=verify_checksums)
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


@dataclass
class TokenStream:
    """The tokens of one split of one prepared output, as zero-copy views into mmapped shards."""

    files: list[str]
    eos_id: int
    _pid: int = -1
    _segments: list[np.ndarray] = field(default_factory=list)
    _starts: list[int] = field(default_factory=list)  # global offset of each segment
    _seg_file: list[int] = field(default_factory=list)  # index in files of each segment's shard
    _maps: list = field(default_factory=list)  # the open pa.MemoryMappedFile of each shard
    _sizes: list[int] = field(default_factory=list)  # each shard's size when mapped
    _batches: list = field(default_factory=list)  # each segment's record batch (ids, offsets)
    _n: int = 0

    def __getstate__(self):  # DataLoader workers (fork or spawn) reopen the maps themselves
        return {"files": self.files, "eos_id": self.eos_id}

    def __setstate__(self, state):
        self.__init__(state["files"], state["eos_id"])

    def _open(self) -> None:
        if self._pid == os.getpid():
            return
        segments, starts, seg_file, maps, sizes, batches, n = [], [], [], [], [], [], 0
        for f, path in enumerate(self.files):
            source = pa.memory_map(path, "r")
            maps.append(source)
            sizes.append(os.fstat(source.fileno()).st_size)
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                values = batch.column("tokens").values.to_numpy(zero_copy_only=True)
                if not len(values):
                    continue
                segments.append(values)
                batches.append(batch)
                starts.append(n)
                seg_file.append(f)
                n += len(values)
        self._segments, self._starts, self._seg_file, self._n = segments, starts, seg_file, n
        self._maps, self._sizes, self._batches, self._pid = maps, sizes, batches, os.getpid()

    def __len__(self) -> int:
        self._open()
        return self._n

    def check_file(self, f: int) -> None:
        """Touching a mapped page past the end of a shard truncated in place is a SIGBUS that
        kills the process without a word; fstat on the mapped file first turns it into one line."""
        size = os.fstat(self._maps[f].fileno()).st_size
        if size < self._sizes[f]:
            raise UserError(f"{self.files[f]} shrank from {self._sizes[f]} to {size} bytes while training read it "
                            "(truncated or rewritten in place?): restore it (`tokenmill inspect` checks it) and "
                            "rerun the same command to resume from the last checkpoint")

    def check_files(self) -> None:
        self._open()
        for f in range(len(self.files)):
            self.check_file(f)

    def file_at(self, pos: int) -> str:
        """The shard that holds token ``pos`` of the stream."""
        self._open()
        return self.files[self._seg_file[bisect.bisect_right(self._starts, pos) - 1]]

    def docs_in(self, start: int, stop: int) -> list[str]:
        """Ids of the documents whose tokens overlap ``[start, stop)``, in stream order (the
        shards' own offsets, memory-mapped: nothing is indexed up front)."""
        self._open()
        i = bisect.bisect_right(self._starts, start) - 1
        ids: list[str] = []
        while i < len(self._segments) and self._starts[i] < stop:
            tokens = self._batches[i].column("tokens")
            offsets = tokens.offsets.to_numpy() - tokens.offsets[0].as_py()
            lo = max(start - self._starts[i], 0)
            hi = min(stop - self._starts[i], len(self._segments[i]))
            first = int(np.searchsorted(offsets, lo, side="right")) - 1
            last = int(np.searchsorted(offsets, hi, side="left"))  # docs first .. last-1 overlap
            column = self._batches[i].column("id")
            ids.extend(column[d].as_py() for d in range(first, last))
            i += 1
        return ids

    def read(self, start: int, out: np.ndarray) -> None:
        """Copy tokens ``[start, start + len(out))`` into ``out`` (any integer dtype)."""
        self._open()
        i = bisect.bisect_right(self._starts, start) - 1
        off, done, want, checked = start - self._starts[i], 0, len(out), -1
        while done < want:
            if self._seg_file[i] != checked:  # once per shard a window touches (usually one)
                checked = self._seg_file[i]
                self.check_file(checked)
            seg = self._segments[i]
            take = min(want - done, len(seg) - off)
            out[done:done + take] = seg[off:off + take]
            done += take
            i, off = i + 1, 0


def split_files(out: str, manifest: dict, split: str) -> list[str]:
    return [os.path.join(out, s["file"]) for s in manifest["splits"][split]["shards"]]


def n_windows(n_tokens: int, seq_len: int) -> int:
    return max(0, (n_tokens - 1) // seq_len)


# ---------------------------------------------------------------- sample order (pure functions)


def _seed_words(*parts: int) -> list[int]:
    h = hashlib.blake2b(":".join(str(p) for p in parts).encode(), digest_size=16).digest()
    return [int.from_bytes(h[i:i + 4], "little") for i in range(0, 16, 4)]


def epoch_permutation(seed: int, source: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng(_seed_words(seed, source, epoch)).permutation(n)


def mixture_block(weights: list[float], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fixed pattern of MIX_BLOCK slots: (source of each slot, its rank among that source's
    slots, slots per source). Counts by largest remainder so they sum to MIX_BLOCK exactly."""
    w = np.asarray(weights, dtype=np.float64) / sum(weights)
    raw = w * MIX_BLOCK
    counts = np.floor(raw).astype(np.int64)
    for k in np.argsort(-(raw - counts), kind="stable")[: MIX_BLOCK - counts.sum()]:
        counts[k] += 1
    labels = np.repeat(np.arange(len(w)), counts)
    labels = labels[np.random.default_rng(_seed_words(seed, "mix")).permutation(MIX_BLOCK)]
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
                 doc_mask: bool = False, vocab_size: int | None = None):
        self.streams, self.seq_len, self.seed, self.doc_mask = streams, seq_len, seed, doc_mask
        self.eos_id, self.vocab_size = streams[0].eos_id, vocab_size
        self.windows = [n_windows(len(s), seq_len) for s in streams]
        weights = list(weights) if weights else [1.0] * len(streams)
        self.weights = [w if n else 0.0 for w, n in zip(weights, self.windows)]
        if not sum(self.weights):
            raise UserError(f"the train split has fewer than seq_len+1 = {seq_len + 1} tokens: "
                            "lower data.seq_len or prepare more data")
        self._labels, self._rank, self._counts = mixture_block(self.weights, seed)
        self._perms: dict[int, tuple[int, np.ndarray]] = {}  # source -> (epoch, its permutation)

    def locate(self, g: int) -> tuple[int, int, int]:
        """(source, epoch, window) of global sample ``g``: a pure function of (seed, g)."""
        block, slot = divmod(g, MIX_BLOCK)
        k = int(self._labels[slot])
        j = block * int(self._counts[k]) + int(self._rank[slot])
        epoch, pos = divmod(j, self.windows[k])
        cached = self._perms.get(k)
        if cached is None or cached[0] != epoch:  # one permutation per (source, epoch), cached
            cached = self._perms[k] = (epoch, epoch_permutation(self.seed, k, epoch, self.windows[k]))
        return k, epoch, int(cached[1][pos])

    def batch(self, indices: list[int]) -> dict:
        windows = [(k, w) for k, _, w in map(self.locate, indices)]
        return as_batch(read_windows(self.streams, windows, self.seq_len, self.vocab_size), self.eos_id, self.doc_mask)

    def __getitems__(self, indices: list[int]) -> dict:
        try:
            return self.batch(indices)
        except UserError as e:
            return {"error": str(e)}

    def __getitem__(self, g: int) -> dict:
        return {k: v[0] for k, v in self.batch([g]).items()}

    def docs_of(self, g: int) -> list[str]:
        """Ids of the documents global sample ``g``'s window is cut from."""
        k, _, w = self.locate(g)
        return self.streams[k].docs_in(w * self.seq_len, w * self.seq_len + self.seq_len + 1)

    def filler(self, n: int) -> dict:
        """A batch of ``n`` all-EOS windows: what a rank whose data failed computes on, to stay in
        step with the others' collectives until the step's all-reduce stops them all."""
        return as_batch(np.full((n, self.seq_len + 1), self.eos_id, dtype=np.int64), self.eos_id, self.doc_mask)

    def check_files(self) -> None:
        for s in self.streams:
            s.check_files()


def read_windows(streams: list[TokenStream], windows: list[tuple[int, int]], seq_len: int,
                 vocab_size: int | None) -> np.ndarray:
    """Rows [n, seq_len + 1] of token ids: window ``w`` of stream ``k`` for each (k, w), checked."""
    out = np.empty((len(windows), seq_len + 1), dtype=np.int64)
    for row, (k, w) in enumerate(windows):
        streams[k].read(w * seq_len, out[row])
    check_ids(out, [(streams[k], w * seq_len) for k, w in windows], vocab_size)
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
            out.append((k, w))
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

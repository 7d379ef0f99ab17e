"""Loader throughput: tokens/s per core of tokenmill's packed-window loader against a bare
numpy memmap of the same tokens, on a warm page cache.

    python bench/loader.py [--tokens 64_000_000] [--seq-len 2048] [--batch 8]

Both sides do the same work per micro-batch: pick `batch` windows of seq_len+1 tokens in a
seeded random order, copy them into one int64 [batch, seq_len+1] array, wrap it as a torch
tensor. tokenmill reads the Arrow shards `prepare` writes (mmapped, zero-copy views, windows
that cross record batches and files); the baseline reads one flat .bin file. One process,
one thread: the figure is per core. The end-to-end DataLoader figure (with workers) is
printed too, for reference.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
logging.basicConfig(level=logging.ERROR)  # Beam's import-time noise

from tokenmill.data import PackedDataset, loader  # noqa: E402
from tokenmill.private import cache_dir_or_temp  # noqa: E402
from tokenmill.trainer import windows as D  # noqa: E402
from tokenmill.transforms.shards import write_manifest, write_shard  # noqa: E402

EOS = 0


def build(out: str, n_tokens: int, n_shards: int, seed: int = 0, vocab: int = 50_000) -> str:
    """A prepared output of random EOS-terminated documents, plus the same stream as one flat
    uint16 file for the memmap baseline."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(out, "shards"), exist_ok=True)
    tok_text = '{"bench": true}'
    with open(os.path.join(out, "tokenizer.json"), "w") as fh:
        fh.write(tok_text)
    tok = {"sha256": hashlib.sha256(tok_text.encode()).hexdigest(), "vocab_size": vocab, "eos_id": EOS}
    lengths = np.clip(rng.lognormal(6.0, 1.0, size=n_tokens // 300).astype(np.int64), 16, 20_000)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), n_tokens)]
    stream = rng.integers(1, vocab, size=int(lengths.sum()), dtype=np.uint16)
    ends = np.cumsum(lengths)
    stream[ends - 1] = EOS
    rows = [(f"doc-{i:08d}", d) for i, d in enumerate(np.split(stream, ends[:-1]))]
    metas = []
    per = -(-len(rows) // n_shards)
    flat = []
    for k in range(n_shards):
        chunk = rows[k * per:(k + 1) * per]
        metas.append(write_shard(("train", k, n_shards), chunk, out, "uint16", tok, 1 << 20))
        flat.extend(t for _, t in sorted(chunk, key=lambda r: (r[0], r[1].tobytes())))  # shard row order
    write_manifest(metas, out, tok, "uint16", {}, "bench")
    np.concatenate(flat).tofile(os.path.join(out, "flat.bin"))
    return out


def timed(fn, seconds: float) -> tuple[int, float]:
    fn()  # warm
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += fn()
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64_000_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dir", default=None, help="reuse/build the synthetic output here")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    # reused between runs: a private folder, never a fixed name in the shared temp folder (tokenmill/private.py)
    out = a.dir or os.path.join(cache_dir_or_temp("bench"), f"loader_{a.tokens}")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        t = time.perf_counter()
        build(out, a.tokens, a.shards)
        print(f"built {out} in {time.perf_counter() - t:.1f}s")
    m = D.open_output(out, verify_checksums=False)
    stream = D.TokenStream(D.split_files(out, m, "train"), EOS)
    T, B = a.seq_len, a.batch
    for path in stream.files + [os.path.join(out, "flat.bin")]:  # warm the page cache
        with open(path, "rb") as fh:
            while fh.read(1 << 24):
                pass

    ds = D.PackedWindows([stream], T, seed=0)
    batches = iter(PackedDataset(None, T, batch_size=B, windows=ds))

    def ours() -> int:
        next(batches)
        return B * T

    flat = np.memmap(os.path.join(out, "flat.bin"), dtype=np.uint16, mode="r")
    W = (len(flat) - 1) // T
    perm = np.random.default_rng(0).permutation(W)
    pos = [0]

    def memmap() -> int:
        i = pos[0]
        starts = perm[np.arange(i, i + B) % W] * T
        pos[0] = i + B
        x = np.stack([flat[s:s + T + 1] for s in starts]).astype(np.int64)
        torch.from_numpy(x)
        return B * T

    print(f"{len(stream):,} tokens in {len(stream.files)} shards, windows of {T}+1, micro-batch {B}, 1 thread")
    results = {}
    for name, fn in (("numpy memmap (baseline)", memmap), ("tokenmill loader", ours)) * 2:  # interleaved, best of 2
        n, dt = timed(fn, a.seconds)
        results[name] = max(results.get(name, 0.0), n / dt)
    for name, v in results.items():
        print(f"  {name:26s} {v / 1e6:8.1f} M tokens/s per core")
    print(f"  ratio tokenmill / memmap   {results['tokenmill loader'] / results['numpy memmap (baseline)']:8.2f}")

    if a.workers:
        it = iter(loader(PackedDataset(None, T, batch_size=B, windows=ds), a.workers, 4, pin_memory=False))

        def through_loader() -> int:
            next(it)
            return B * T

        n, dt = timed(through_loader, a.seconds)
        print(f"  DataLoader, {a.workers} workers        {n / dt / 1e6:8.1f} M tokens/s in total (incl. IPC)")


if __name__ == "__main__":
    main()

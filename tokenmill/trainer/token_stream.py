"""One split of a prepared output as one stream of tokens: zero-copy views into memory-mapped
Arrow shards, opened when first read; on an object store, each shard fetched into the local
cache and checked first (store_cache.cached), released when a reader is done with it."""

from __future__ import annotations

import bisect
import os

import numpy as np
import pyarrow as pa

from tokenmill.errors import UserError
from tokenmill.trainer.order import Order


class TokenStream:
    """The tokens of one split of one prepared output, as zero-copy views into mmapped shards.

    Shards are opened when a read first needs them; ``tokens`` (each shard's count, from the
    manifest) gives the stream's layout without opening any. A shard on an object store
    (``sources``: its sha256 and bytes) is fetched into the local cache and checked first
    (store_cache.cached), and ``release`` unmaps the ones a reader no longer needs."""

    def __init__(self, files: list[str], eos_id: int, tokens: list[int] | None = None,
                 sources: list[tuple[str, int]] | None = None):
        self.files, self.eos_id, self.tokens, self.sources = files, eos_id, tokens, sources
        self._pid = -1
        self._open_shards: dict[int, _Shard] = {}  # shard index -> its open map, in use order
        self._fetching, self._prefetched = None, None  # a thread fetching shards ahead (store only), for these

    def __getstate__(self):  # DataLoader workers (fork or spawn) reopen the maps themselves
        return {"files": self.files, "eos_id": self.eos_id, "tokens": self.tokens, "sources": self.sources}

    def __setstate__(self, state):
        self.__init__(state["files"], state["eos_id"], state.get("tokens"), state.get("sources"))

    def _open(self) -> None:
        if self._pid == os.getpid():
            return
        self._open_shards, self._fetching, self._prefetched, self._pid = {}, None, None, os.getpid()
        if self.tokens is None:  # no manifest counts: open every shard to learn them
            self.tokens = [self._shard(f).n for f in range(len(self.files))]
        self._starts = np.concatenate([[0], np.cumsum(self.tokens, dtype=np.int64)]).tolist()
        self._n = self._starts[-1]

    def local_file(self, f: int, keep: tuple[str, ...] = ()) -> str:
        """Shard ``f`` as a local file: itself, or its checked copy in the store cache."""
        if self.sources is None:
            return self.files[f]
        from tokenmill import store_cache

        sha, size = self.sources[f]
        return store_cache.cached(self.files[f], sha, size, keep)

    def _shard(self, f: int) -> _Shard:
        shard = self._open_shards.pop(f, None)
        if shard is None:
            try:
                shard = _Shard(self.local_file(f, self._keep()), self.files[f], self.sources is not None)
            except FileNotFoundError:  # evicted from the cache by another process between fetch and map
                shard = _Shard(self.local_file(f, self._keep()), self.files[f], self.sources is not None)
            if self.tokens is not None and shard.n != self.tokens[f]:
                raise UserError(f"{self.files[f]}: {shard.n} tokens, the manifest says {self.tokens[f]}; "
                                f"check it with `tokenmill inspect`")
        self._open_shards[f] = shard  # most recently used last
        return shard

    def _keep(self) -> tuple[str, ...]:
        return tuple(self.sources[f][0] for f in self._open_shards) if self.sources else ()

    def release(self, keep: set[int]) -> None:
        """Unmap every open shard not in ``keep`` (a reader done with them: on a store, the
        cache may then make room for the next)."""
        for f in [f for f in self._open_shards if f not in keep]:
            del self._open_shards[f]

    def prefetch(self, shards: list[int]) -> None:
        """Fetch ``shards`` into the local cache in the background (a store only; one batch of
        fetches at a time: a reader that outruns it waits in ``_shard`` instead)."""
        if self.sources is None or (self._fetching is not None and self._fetching.is_alive()) \
                or shards == self._prefetched:
            return
        self._prefetched = shards
        import threading

        from tokenmill.store import parallel

        keep = tuple(self.sources[f][0] for f in shards) + self._keep()

        def one(f: int) -> None:
            try:
                self.local_file(f, keep)
            except Exception:  # noqa: BLE001 - the read that needs it fetches again and says why
                pass

        def fetch():
            parallel(one, shards)

        self._fetching = threading.Thread(target=fetch, daemon=True, name="tokenmill-prefetch")
        self._fetching.start()

    def shard_of(self, pos: int) -> int:
        self._open()
        return bisect.bisect_right(self._starts, pos) - 1

    def tokens_per_shard(self) -> list[int]:
        self._open()
        return list(self.tokens)

    def __len__(self) -> int:
        self._open()
        return self._n

    def check_file(self, f: int) -> None:
        """Touching a mapped page past the end of a shard truncated in place is a SIGBUS that
        kills the process without a word; fstat on the mapped file first turns it into one line."""
        shard = self._open_shards.get(f)
        if shard is None:
            return
        size = os.fstat(shard.map.fileno()).st_size
        if size < shard.size:
            raise UserError(f"{self.files[f]} shrank from {shard.size} to {size} bytes while training read it "
                            "(truncated or rewritten in place?): restore it (`tokenmill inspect` checks it) and "
                            "rerun the same command to resume from the last checkpoint")

    def check_files(self) -> None:
        self._open()
        for f in list(self._open_shards):
            self.check_file(f)

    def file_at(self, pos: int) -> str:
        """The shard that holds token ``pos`` of the stream."""
        return self.files[self.shard_of(pos)]

    def docs_in(self, start: int, stop: int) -> list[str]:
        """Ids of the documents whose tokens overlap ``[start, stop)``, in stream order (the
        shards' own offsets, memory-mapped: nothing is indexed up front)."""
        f, ids = self.shard_of(start), []
        while f < len(self.files) and self._starts[f] < stop:
            if self.tokens[f]:
                ids.extend(self._shard(f).docs_in(start - self._starts[f], stop - self._starts[f]))
            f += 1
        return ids

    def read(self, start: int, out: np.ndarray) -> None:
        """Copy tokens ``[start, start + len(out))`` into ``out`` (any integer dtype)."""
        f = self.shard_of(start)
        done, want = 0, len(out)
        while done < want:
            while not self.tokens[f]:
                f += 1
            shard = self._shard(f)
            self.check_file(f)  # once per shard a window touches (usually one)
            done += shard.read(start + done - self._starts[f], out[done:])
            f += 1


class _Shard:
    """One memory-mapped shard: its record batches' token values as numpy views."""

    def __init__(self, path: str, name: str, validate: bool):
        """``validate``: offsets within bounds, buffers as long as they claim (a shard fetched
        from a store, whose hash a crafted manifest could vouch for: local shards are checked
        by open_output)."""
        self.map = pa.memory_map(path, "r")
        self.size = os.fstat(self.map.fileno()).st_size
        segments, starts, batches, n = [], [], [], 0
        try:
            reader = pa.ipc.open_file(self.map)
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                if validate:
                    batch.validate(full=True)
                values = batch.column("tokens").values.to_numpy(zero_copy_only=True)
                if not len(values):
                    continue
                segments.append(values)
                batches.append(batch)
                starts.append(n)
                n += len(values)
        except (pa.ArrowInvalid, KeyError) as e:
            raise UserError(f"{name}: not a tokenmill shard ({e}); check it with `tokenmill inspect`") from None
        self.segments, self.starts, self.batches, self.n = segments, starts, batches, n

    def read(self, pos: int, out: np.ndarray) -> int:
        """Copy tokens from ``pos`` of this shard into ``out`` until either ends; how many."""
        i = bisect.bisect_right(self.starts, pos) - 1
        off, done = pos - self.starts[i], 0
        while done < len(out) and i < len(self.segments):
            seg = self.segments[i]
            take = min(len(out) - done, len(seg) - off)
            out[done:done + take] = seg[off:off + take]
            done += take
            i, off = i + 1, 0
        return done

    def docs_in(self, start: int, stop: int) -> list[str]:
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        ids: list[str] = []
        while i < len(self.segments) and self.starts[i] < stop:
            tokens = self.batches[i].column("tokens")
            offsets = tokens.offsets.to_numpy() - tokens.offsets[0].as_py()
            lo = max(start - self.starts[i], 0)
            hi = min(stop - self.starts[i], len(self.segments[i]))
            first = int(np.searchsorted(offsets, lo, side="right")) - 1
            last = int(np.searchsorted(offsets, hi, side="left"))  # docs first .. last-1 overlap
            column = self.batches[i].column("id")
            ids.extend(column[d].as_py() for d in range(first, last))
            i += 1
        return ids


def check_cache_fits(streams: list[TokenStream], order: Order, seed: int, world: int, local_ranks: int) -> None:
    """The shards on a store that this host's ranks need at once must fit the local cache
    (store_cache.cache_limit): all of them in the default order; with data.shuffle_shards, each
    rank's current and next group of each lane it reads (lanes / gcd(lanes, world) of them)."""
    import math

    from tokenmill import store_cache
    from tokenmill.trainer.order import deal_lanes

    need = 0
    for k, stream in enumerate(streams):
        if stream.sources is None:
            continue
        sizes = [b for _, b in stream.sources]
        if not order.grouped:  # one copy, shared by the host's ranks
            need += sum(sizes)
            continue
        biggest = max(sum(sorted((sizes[f] for f in lane), reverse=True)[:order.group or len(lane)])
                      for lane in deal_lanes(seed, k, len(sizes), order.lanes))
        need += (2 if order.group else 1) * biggest * local_ranks * (order.lanes // math.gcd(order.lanes, world))
    limit = store_cache.cache_limit()
    if need > limit:
        gib = 2 ** 30
        raise UserError(f"training from an object store needs {need / gib:.1f} GiB of shards at hand on this host, "
                        f"more than the local cache holds ({limit / gib:.1f} GiB, TOKENMILL_CACHE_GB): set "
                        "data.shuffle_shards (shards a rank reads at a time) and data.lanes (a multiple of the number "
                        "of ranks), or raise TOKENMILL_CACHE_GB")


def split_stream(out: str, manifest: dict, split: str) -> TokenStream:
    """One split of a prepared output as a token stream: its layout from the manifest; on an
    object store, every shard fetched (and checked) when first read."""
    from tokenmill.store import is_store

    shards = manifest["splits"][split]["shards"]
    return TokenStream(split_files(out, manifest, split), manifest["tokenizer"]["eos_id"],
                       [s["tokens"] for s in shards],
                       [(s["sha256"], s["bytes"]) for s in shards] if is_store(out) else None)


def split_files(out: str, manifest: dict, split: str) -> list[str]:
    from tokenmill.format import join

    return [join(out, s["file"]) for s in manifest["splits"][split]["shards"]]

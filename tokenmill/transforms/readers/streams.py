"""Opening input files: decompressed (gzip, zstd with its frames followed) within the inflate
limit, lines and records read with a size cap, and the dropped row for a file that breaks part-way."""

from __future__ import annotations

import gzip
import io
import logging
import threading
import zlib
from typing import IO, Any

import zstandard
from apache_beam.io.filesystem import CompressionTypes

from tokenmill import store
from tokenmill.beamfs import FileSystems
from tokenmill.config import ReadConfig
from tokenmill.transforms.doc import new_doc

from .formats import compression
from .inputs import InputFile

log = logging.getLogger("tokenmill")

# Errors a broken compressed stream raises part-way through.
STREAM_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, OSError, zstandard.ZstdError)


class InflateLimit(Exception):
    """A compressed file inflated past its limit (ReadConfig.max_inflated_bytes)."""


def inflate_limit(f: InputFile, cfg: ReadConfig) -> int:
    # With the ratio, the work stays proportional to the bytes stored, and a 10 GB .jsonl.zst
    # still reads whole, while a small gzip of newlines stops early.
    return max(cfg.max_inflated_bytes, int(cfg.max_inflate_ratio * f.size))


def stream_reason(e: BaseException) -> str:
    """The drop reason for the error that stopped a file part-way."""
    if isinstance(e, InflateLimit):
        return "inflate_limit"
    return "truncated_file" if isinstance(e, EOFError) else "corrupt_file"


def open_raw(path: str) -> IO[bytes]:
    ahead = getattr(_prefetch, "now", None)
    if ahead is not None and path in ahead.futures:
        return io.BytesIO(ahead.take(path))
    return _open_direct(path)


def _open_direct(path: str) -> IO[bytes]:
    if path.startswith("s3://"):  # one GetObject a file (store.ObjectReader), not Beam's two
        return store.open_object(path)
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


# A store answers a request in 10-50 ms (S3 in a region; here, on loopback, ~1 ms): a worker that
# fetched a run of small objects one after another would mostly wait. Within a task (a run of up
# to MAX_FILES_PER_TASK small files), objects up to PREFETCH_MAX_BYTES are fetched PREFETCH at
# a time ahead of the reader, into memory (at most PREFETCH x PREFETCH_MAX_BYTES).
PREFETCH = 16
PREFETCH_MAX_BYTES = 4 << 20
_prefetch = threading.local()


class Prefetch:
    """The objects of ``files`` fetched ahead of a reader that takes them in order (``advance``
    before each file): ``open_raw`` on this thread then serves them from memory. A fetch's
    error is raised where the reader opens that file, as a direct open would."""

    def __init__(self, files: list[InputFile]):
        paths = [f.path for f in files if store.is_store(f.path) and 0 < f.size <= PREFETCH_MAX_BYTES]
        self.paths = list(dict.fromkeys(paths))
        self.index = {p: i for i, p in enumerate(self.paths)}
        self.futures: dict[str, Any] = {}
        self.pool, self.next = None, 0

    def __enter__(self) -> Prefetch:
        if len(self.paths) > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(PREFETCH, thread_name_prefix="tokenmill-read")
            _prefetch.now = self
        return self

    def advance(self, f: InputFile) -> None:
        """``f`` is next: fetches of the files before it are dropped (a reader that passed one
        over), and the PREFETCH prefetchable files from it on are in flight."""
        if self.pool is None:
            return
        i = self.index.get(f.path)
        if i is None:
            return
        for path in [p for p in self.futures if self.index[p] < i]:
            self.futures.pop(path).cancel()
        self.next = max(self.next, i)
        while self.next < len(self.paths) and self.next < i + PREFETCH:
            path = self.paths[self.next]
            self.futures[path] = self.pool.submit(_fetch, path)
            self.next += 1

    def take(self, path: str) -> bytes:
        return self.futures.pop(path).result()

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            _prefetch.now = None
            for fut in self.futures.values():
                fut.cancel()
            self.pool.shutdown(wait=True)


def _fetch(path: str) -> bytes:
    with _open_direct(path) as fh:
        return fh.read()


def open_decompressed(f: InputFile) -> IO[bytes]:
    raw = open_raw(f.path)
    comp = compression(f.rel)
    if comp == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if comp == "zstd":
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(_ZstdFrames(raw), closefd=True))
    return raw


class _ZstdFrames:
    """A .zst file's bytes on their way to the decompressor, its frame and block headers followed
    (one per 128 KB block), so that a file cut inside a frame raises EOFError at its end:
    zstandard's reader stops there quietly, and the cut would pass for the end of the data."""

    _HEAD = {"magic": 4, "skippable": 4, "frame": 1, "block": 3}  # header sizes

    def __init__(self, raw: IO[bytes]):
        self.raw, self.state, self.head, self.skip, self.checksum = raw, "magic", b"", 0, 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        if not data and self.state and (self.state != "magic" or self.head or self.skip):
            raise EOFError("the file ends inside a zstd frame")
        view, i = memoryview(data), 0
        while i < len(view) and self.state:  # state None: not zstd; the decompressor says so
            if self.skip:
                k = min(self.skip, len(view) - i)
                self.skip, i = self.skip - k, i + k
                continue
            k = min(self._HEAD[self.state] - len(self.head), len(view) - i)
            self.head, i = self.head + view[i : i + k].tobytes(), i + k
            if len(self.head) == self._HEAD[self.state]:
                self._header(int.from_bytes(self.head, "little"))
                self.head = b""
        return data

    def _header(self, h: int) -> None:
        if self.state == "magic":
            self.state = "frame" if h == 0xFD2FB528 else "skippable" if h >> 4 == 0x184D2A5 else None
        elif self.state == "skippable":
            self.skip, self.state = h, "magic"
        elif self.state == "frame":  # the frame header descriptor: the header fields that follow
            single = h >> 5 & 1
            self.checksum = 4 * (h >> 2 & 1)
            self.skip = (1 - single) + (0, 1, 2, 4)[h & 3] + (single, 2, 4, 8)[h >> 6]
            self.state = "block"
        else:  # a block header: last-block flag, type (1 = RLE: one byte), size
            self.skip = 1 if h >> 1 & 3 == 1 else h >> 3
            if h & 1:
                self.skip += self.checksum
                self.state = "magic"

    def close(self) -> None:
        self.raw.close()


def broken(doc_id: str, f: InputFile, reason: str, e: BaseException) -> dict[str, Any]:
    """A dropped row for a file that broke part-way, and one log line saying where and why."""
    log.warning("read: %s in %s (%s: %s); records before it are kept", reason, f.path, type(e).__name__, e)
    return new_doc(doc_id, f.path, dropped_by=f"read:{reason}")


def read_capped(fh: IO[bytes], limit: int) -> bytes | None:
    """All of ``fh``, or None when it holds more than ``limit`` bytes (the rest is left unread:
    no work for what is dropped)."""
    data = fh.read(limit + 1)
    return data if len(data) <= limit else None


def read_line(fh: IO[bytes], limit: int, budget: int | None = None) -> tuple[bytes | None, int]:
    """One line (with its newline) and its length; (None, length) when longer than ``limit``.
    The skip of a long line stops once past ``budget`` bytes (a compressed file's inflate limit)."""
    line = fh.readline(limit + 1)
    if len(line) <= limit or line.endswith(b"\n"):
        return line, len(line)
    seen = len(line)
    del line
    while budget is None or seen <= budget:  # skip the rest of the oversized line without holding it
        part = fh.readline(1 << 20)
        seen += len(part)
        if not part or part.endswith(b"\n"):
            break
    return None, seen


def skip_blank_lines(fh: IO[bytes], most: int) -> int:
    """Skip the whole blank lines at ``fh``'s position a buffer at a time (at most ``most``
    bytes); returns how many bytes. A file of a billion newlines costs its inflating, not a
    billion turns of a Python loop."""
    peek, skipped = getattr(fh, "peek", None), 0
    while peek and skipped < most:
        buf = peek(1 << 16)[: min(1 << 16, most - skipped)]
        k = buf.rfind(b"\n", 0, len(buf) - len(buf.lstrip(b" \t\r\n"))) + 1  # through the last blank line
        if not k:
            break
        fh.read(k)
        skipped += k
    return skipped

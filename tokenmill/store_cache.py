"""A verified local cache of store objects, for what must be a local file (the trainer's
memory-mapped shards, the docs compare and spikes read): each object named by its sha256,
checked on download, shared by the processes of a host, bounded (least recently used first)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator

from tokenmill.errors import UserError
from tokenmill.store import Store


def cache_dir() -> str:
    return os.environ.get("TOKENMILL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tokenmill", "objects")


def cache_limit() -> int:
    """Bytes the cache may hold (TOKENMILL_CACHE_GB, default 50): older entries not in use by
    this process are removed to make room."""
    return int(float(os.environ.get("TOKENMILL_CACHE_GB", "50")) * 2**30)


@contextlib.contextmanager
def _cache_locked(folder: str, name: str) -> Iterator[None]:
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, f"{name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def cached(url: str, sha256: str, size: int, keep: Iterable[str] = ()) -> str:
    """A local copy of ``url`` whose sha256 is ``sha256``: from the cache (named by the hash, so
    a changed object is never mistaken for the old one), or downloaded and checked first. Ranks
    on one host share it (a file lock: one download per file per host). ``keep``: the hashes
    this process needs too, never evicted to make room."""
    folder = cache_dir()
    local = os.path.join(folder, sha256)
    if os.path.exists(local):
        os.utime(local)
        return local
    with _cache_locked(folder, sha256):
        if os.path.exists(local):
            return local
        _make_room(folder, size, {sha256, *keep})
        got = Store(url).download(url, local + ".new")
        if got != sha256:
            os.unlink(local + ".new")
            raise UserError(f"{url}: sha256 {got[:12]}... does not match the manifest ({sha256[:12]}...)")
        os.replace(local + ".new", local)
    return local


def _make_room(folder: str, size: int, keep: set[str]) -> None:
    entries = []
    for name in os.listdir(folder):
        if len(name) == 64 and name not in keep:
            st = os.stat(os.path.join(folder, name))
            entries.append((st.st_mtime, name, st.st_size))
    total = sum(e[2] for e in entries)
    for _, name, n in sorted(entries):
        if total + size <= cache_limit():
            break
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))
        total -= n

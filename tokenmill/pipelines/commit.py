"""OUT on an object store (s3://, gs://): a commit protocol for storage without rename or flock.

- A run writes every file once, under its final name, in a fresh prefix
  ``OUT/tokenmill-run-<UTC time>-<id>/`` (the same layout a local OUT has: docs/, shards/,
  report/, tokenizer.json, ...). Nothing is copied or renamed.
- It commits by writing ``OUT/manifest.json`` (one PutObject: atomic), which names that prefix
  as its ``root``, lists its shards and tokenizer by their paths under OUT, and every other
  file it published (``files``: bytes and sha256). Readers use only what it lists: until the
  PutObject lands they read the previous run's manifest and files, which are still there.
- Only then are earlier roots removed. Whatever a dead run left (its prefix, an older root, a
  stage of an older tokenmill, unfinished multipart uploads, which listings do not show and
  which are billed) is removed by the next run before it starts (``sweep``).
- One run at a time: ``OUT/.tokenmill.lock`` is taken with a conditional write (S3's
  If-None-Match, GCS's if_generation_match=0) and held by a lease the run renews (If-Match on its
  own ETag, or generation). A run that died lets go of it
  when its lease lapses, or at once when it ran on this host (its pid is gone). A run that lost
  its lease (paused past it) does not commit.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator

from tokenmill import store
from tokenmill.errors import UserError
from tokenmill.folders import LOCK_NAME  # the local lock's name too
from tokenmill.format import FORMAT_VERSION

RUN_PREFIX = "tokenmill-run-"
# Prefixes a local-style publish of older tokenmill versions used: garbage on a store.
LEGACY_PREFIXES = (".tokenmill-stage-", ".tokenmill-old-")


def handles(path: str) -> bool:
    """An OUT this protocol writes: one on an object store (S3, GCS)."""
    return store.is_store(path)


def lease_s() -> float:
    return float(os.environ.get("TOKENMILL_LEASE_S", "60"))


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts))


def new_root(out: str) -> str:
    return _join(out, f"{RUN_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}")


# ---------------------------------------------------------------- the lock


def _boot_id() -> str:
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
        return fh.read().strip()
    return ""


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _expires(holder: dict) -> float:
    try:
        return float(holder.get("expires", 0))
    except (TypeError, ValueError):
        return 0.0


def _stale(holder: dict) -> bool:
    if time.time() > _expires(holder):
        return True
    same_host = holder.get("host") == socket.gethostname() and holder.get("boot") == _boot_id()
    return same_host and isinstance(holder.get("pid"), int) and not _pid_alive(holder["pid"])


class _Lease:
    def __init__(self, out: str):
        self.out, self.url = out, _join(out, LOCK_NAME)
        self.st = store.Store(out)
        self.me = {"run": uuid.uuid4().hex, "host": socket.gethostname(), "boot": _boot_id(), "pid": os.getpid()}
        self.etag: str | None = None
        self.lost = False
        self._stop = threading.Event()

    def _body(self) -> bytes:
        return json.dumps({**self.me, "expires": time.time() + lease_s()}).encode()

    def take(self) -> None:
        self.etag = self.st.write(self.url, self._body(), if_absent=True)
        if self.etag is not None:
            return
        held_etag = self.st.head(self.url)
        raw = self.st.read(self.url) if held_etag else None
        try:
            holder = json.loads(raw) if raw else {}
        except ValueError:
            holder = {}
        holder = holder if isinstance(holder, dict) else {}  # no lock of ours: no expiry, so stale
        if held_etag is None:  # released between our two requests
            self.etag = self.st.write(self.url, self._body(), if_absent=True)
        elif _stale(holder):  # a dead run's: taken over only if still the same object
            self.etag = self.st.write(self.url, self._body(), if_match=held_etag)
        if self.etag is None:
            since = max(0, round(_expires(holder) - time.time()))
            raise UserError(f"output: {self.out} is in use by another tokenmill prepare (host "
                            f"{holder.get('host', '?')}, pid {holder.get('pid', '?')}); wait for it or choose another "
                            f"--output (a run that died lets go of it within {since} s)")

    def check(self) -> None:
        if self.lost or time.time() > self._renewed_until():
            raise UserError(f"output: lost the lock on {self.out} (this run stalled past its "
                            f"{lease_s():.0f} s lease and another run may have taken it); nothing was published")

    def _renewed_until(self) -> float:
        return self._last + lease_s()

    def __enter__(self):
        self.take()
        self._last = time.time()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tokenmill-lease")
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(lease_s() / 3):
            try:
                etag = self.st.write(self.url, self._body(), if_match=self.etag)
            except Exception:  # noqa: BLE001 - the store is unreachable: tried again next time
                continue
            if etag is None:
                self.lost = True
                return
            self.etag, self._last = etag, time.time()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            if not self.lost and self.st.head(self.url) == self.etag:
                self.st.delete([self.url])


_held: dict[str, _Lease] = {}


@contextlib.contextmanager
def lease(out: str) -> Iterator[None]:
    """Hold OUT for this run (its lock object), or refuse in one line when a live run holds it."""
    with _Lease(out) as held:
        _held[out] = held
        try:
            yield
        finally:
            _held.pop(out, None)


# ---------------------------------------------------------------- clean-up and publish


def sweep(out: str, keep: str | None = None) -> list[str]:
    """Remove what no manifest names: every run prefix but the committed root (and ``keep``),
    stages of older versions, and unfinished multipart uploads under OUT. Run under the lock.
    Returns the prefixes removed."""
    st = store.Store(out)
    manifest = store.committed(out)[1] or {}
    live = {manifest.get("root"), keep}
    gone = [n for n in st.folders(out)
            if (n.startswith(RUN_PREFIX) and n not in live) or n.startswith(LEGACY_PREFIXES)]
    urls = [u for name in gone for u in st.list(_join(out, name))]
    st.abort_uploads(out)
    st.delete(urls)
    return gone


def discard(prefix: str) -> None:
    """A failed run's prefix: its files and unfinished uploads (quietly: the failure is the news)."""
    with contextlib.suppress(Exception):
        st = store.Store(prefix)
        st.abort_uploads(prefix)
        st.delete(list(st.list(prefix)))


def publish(root: str, out: str, owned: list[str]) -> dict:
    """Commit the run written under ``root``: OUT/manifest.json names it (the commit point), then
    the previous roots go. Returns the manifest written."""
    held = _held.get(out)
    if held is not None:
        held.check()
    st = store.Store(out)
    name = root.rstrip("/").rsplit("/", 1)[1]
    sizes = {url[len(root.rstrip("/")) + 1:]: n for url, n in st.list(root).items()}
    raw = st.read(_join(root, "manifest.json"))
    manifest = json.loads(raw) if raw is not None else {"format_version": FORMAT_VERSION, "splits": {}}
    known = {}
    for info in manifest.get("splits", {}).values():
        for s in info.get("shards", []):
            known[s["file"]] = s["sha256"]
            s["file"] = f"{name}/{s['file']}"
    if "tokenizer" in manifest:
        manifest["tokenizer"]["file"] = f"{name}/{manifest['tokenizer'].get('file', 'tokenizer.json')}"
    files = sorted(r for r in sizes if any(fnmatch.fnmatchcase(r, p) for p in owned))
    todo = [r for r in files if r not in known]
    known.update(zip(todo, store.parallel(lambda r: st.sha256(_join(root, r)), todo)))
    manifest["root"] = name
    manifest["files"] = {f"{name}/{r}": {"bytes": sizes[r], "sha256": known[r]} for r in files}
    if held is not None:
        held.check()
    st.write(_join(out, "manifest.json"), json.dumps(manifest, indent=2).encode("utf-8"))  # the commit
    sweep(out, keep=name)
    # An output an older tokenmill published in place (OUT/docs/..., OUT/shards/...): no longer named.
    base = out.rstrip("/") + "/"
    st.delete([u for u in st.list(out) if any(fnmatch.fnmatchcase(u[len(base):], p) for p in owned)])
    return manifest

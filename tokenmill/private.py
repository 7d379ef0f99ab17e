"""Folders only this user can write, for what tokenmill keeps between runs (a remote model's local
copy, a benchmark's built data).

Never a fixed name in the shared temp folder: anyone on the host can create that path first (a
file, a folder or a link of theirs) and have it read as ours. ``cache_dir`` is
``$XDG_CACHE_HOME/tokenmill/...`` (default ``~/.cache``), each folder below the base made 0700
and checked to be a real folder of this user's that nobody else can write; where that cannot be
had it says None, and ``cache_dir_or_temp`` falls back to a fresh ``mkdtemp`` (0700, a name
nobody can guess: nothing is reused).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile


def owned_private(path: str, sticky_ok: bool = False) -> bool:
    """``path`` is a real folder (not a link), this user's (or, with ``sticky_ok``, root's), and
    nobody else can add, remove or rename what is in it."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in ((os.geteuid(), 0) if sticky_ok else (os.geteuid(),)):
        return False
    return not st.st_mode & 0o022 or (sticky_ok and bool(st.st_mode & stat.S_ISVTX))


def cache_dir(*parts: str) -> str | None:
    """``$XDG_CACHE_HOME/tokenmill/<parts>``, made and private; None when it cannot be made or
    one of its folders is not private (a link, another user's, writable by others)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):  # no home: "~" stayed as it is
        return None
    path = base
    for part in ("tokenmill", *parts):
        path = os.path.join(path, part)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError:
            return None
        if not owned_private(path):
            return None
    # The base (~/.cache, or the folder it links to) is the user's or root's, closed or sticky.
    return path if owned_private(os.path.realpath(base), sticky_ok=True) else None


def cache_dir_or_temp(*parts: str) -> str:
    """``cache_dir(*parts)``, else a new private temporary folder."""
    return cache_dir(*parts) or tempfile.mkdtemp(prefix=f"tokenmill-{'-'.join(parts)}-")


# ---------------------------------------------------------------- a remote file, copied privately
# fastText loads from a local file only. A gs:// or s3:// model (langid.load_model) is copied once per machine into a
# folder only this user can write (never a guessable name in the shared temp folder, where anyone
# on the host could plant a file first), under a name that is the remote object's identity (path,
# size, modification time, the store's checksum), beside the sha256 of the bytes copied. A copy is
# used only when it is still those bytes. Where no such folder can be had (no writable home, one
# that is another user's or open to others), each process copies the model into a fresh private
# temporary folder of its own.

_fresh_dir: str | None = None
_verified: set[tuple] = set()  # (path, inode, size, mtime) of copies hashed by this process


def _fresh_private_dir() -> str:
    """A folder of this process's own (mkdtemp: 0700, a name nobody can guess), removed at exit."""
    global _fresh_dir
    if _fresh_dir is None or not owned_private(_fresh_dir):
        import atexit

        _fresh_dir = tempfile.mkdtemp(prefix="tokenmill-model-")
        atexit.register(shutil.rmtree, _fresh_dir, True)
    return _fresh_dir


def _remote_identity(path: str) -> str | None:
    """What names this version of the remote object: None when its store says nothing."""
    from tokenmill.beamfs import FileSystems

    parts: list = [path]
    try:
        meta = FileSystems.match([path])[0].metadata_list[0]
        parts += [meta.size_in_bytes, meta.last_updated_in_seconds]
    except Exception:
        return None
    try:
        parts.append(FileSystems.checksum(path))
    except Exception:  # not every store has one: size and time still tell a new upload
        parts.append(None)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _download(path: str, folder: str) -> tuple[str, str]:
    """The remote bytes into a new file in ``folder`` (mkstemp: O_EXCL, 0600, an unguessable
    name); (its path, their sha256)."""
    from tokenmill.beamfs import FileSystems

    fd, tmp = tempfile.mkstemp(prefix=".part-", dir=folder)
    h = hashlib.sha256()
    try:
        with FileSystems.open(path) as src, os.fdopen(fd, "wb") as dst:
            for block in iter(lambda: src.read(1 << 22), b""):
                h.update(block)
                dst.write(block)
            dst.flush()
            os.fsync(dst.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp, h.hexdigest()


def _cached(local: str) -> bool:
    """``local`` is a regular file of this user's holding the bytes its sidecar recorded."""
    try:
        with open(local, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return False
            key = (local, st.st_ino, st.st_size, st.st_mtime_ns)
            if key in _verified:
                return True
            with open(local + ".sha256", encoding="ascii",
                      opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as side:
                want = side.read().strip()
            from tokenmill.format import sha256_stream

            if sha256_stream(fh) != want:
                return False
    except (OSError, ValueError):
        return False
    _verified.add(key)
    return True


def local_copy(path: str) -> str:
    """A local file with the model's bytes (see above); a local path is itself."""
    if "://" not in path:
        return path
    folder, key = cache_dir("models"), _remote_identity(path)
    if folder is None or key is None:  # nothing private to keep it in, or nothing to know it by
        tmp, _ = _download(path, _fresh_private_dir())
        return tmp
    local = os.path.join(folder, key)
    if _cached(local):
        return local
    tmp, digest = _download(path, folder)
    fd, side = tempfile.mkstemp(prefix=".part-", dir=folder)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(digest + "\n")
    os.replace(tmp, local)  # the model first: a reader that meets the old sidecar copies again
    os.replace(side, local + ".sha256")
    return local


def is_throwaway(local: str) -> bool:
    """``local`` is a copy in this process's own temporary folder, to delete once loaded."""
    return _fresh_dir is not None and os.path.dirname(local) == _fresh_dir

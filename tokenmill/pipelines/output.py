"""The output folder of ``prepare``: one run at a time, and replaced only by a run that succeeds.

A run writes everything under ``OUT/.tokenmill-stage-<id>/``; only when the pipeline has
finished are the previous run's entries moved aside and the new ones moved in, the manifest
last (the contract: a manifest names a complete output). A failed, interrupted or killed run
leaves the previous output whole; its stage folder is removed then, or by the next run.

A local OUT is locked with ``flock`` for the whole run: the kernel releases it when the process
dies, so a crashed run never leaves it stuck. Object stores (gs://, s3://) have no such lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator

from apache_beam.io.filesystems import FileSystems

from tokenmill.errors import UserError

# What a run owns under OUT, moved as a whole; the manifest comes last.
ENTRIES = ("inputs.jsonl", "tokenizer.json", "docs", "shards", "report", "manifest.json")
STAGE_PREFIX = ".tokenmill-stage-"
OLD_PREFIX = ".tokenmill-old-"
LOCK_NAME = ".tokenmill.lock"


def _local(out: str) -> bool:
    return "://" not in out


@contextlib.contextmanager
def locked(out: str) -> Iterator[None]:
    """Hold OUT for this run, or refuse in one line when another run holds it."""
    if not _local(out):
        yield
        return
    try:
        os.makedirs(out, exist_ok=True)
        fd = os.open(os.path.join(out, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UserError(f"output: cannot write {out} ({e.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            raise UserError(f"output: {out} is in use by another tokenmill prepare (pid {holder}); "
                            "wait for it or choose another --output") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _exists(path: str) -> bool:
    return os.path.lexists(path) if _local(path) else FileSystems.exists(path)


def _remove(path: str) -> None:
    if _local(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)
        return
    matched = FileSystems.match([path.rstrip("/") + "/**"])[0].metadata_list
    files = [m.path for m in matched] + ([path] if FileSystems.exists(path) else [])
    if files:
        FileSystems.delete(files)


def _move(src: str, dst: str) -> None:
    if _local(src):
        os.replace(src, dst)
        return
    matched = FileSystems.match([src.rstrip("/") + "/**"])[0].metadata_list
    if matched:  # a "folder" of an object store: every object under it
        srcs = [m.path for m in matched]
        FileSystems.rename(srcs, [dst + p[len(src):] for p in srcs])
    else:
        FileSystems.rename([src], [dst])


def remove_leftovers(out: str) -> None:
    """Stage and old folders of runs that were killed before they could clean up."""
    if _local(out) and os.path.isdir(out):
        for name in os.listdir(out):
            if name.startswith((STAGE_PREFIX, OLD_PREFIX)):
                _remove(os.path.join(out, name))


def new_stage(out: str) -> str:
    stage = FileSystems.join(out, STAGE_PREFIX + uuid.uuid4().hex[:8])
    if _local(stage):
        os.makedirs(stage)
    return stage


def discard(stage: str) -> None:
    with contextlib.suppress(OSError):
        _remove(stage)


def publish(stage: str, out: str) -> None:
    """Replace OUT's previous output by the staged one. The previous manifest goes first and the
    new one comes last, so no reader ever finds a manifest beside another run's shards."""
    old = FileSystems.join(out, OLD_PREFIX + uuid.uuid4().hex[:8])
    if _local(old):
        os.makedirs(old)
    for name in reversed(ENTRIES):  # the manifest first
        src = FileSystems.join(out, name)
        if _exists(src):
            _move(src, FileSystems.join(old, name))
    for name in ENTRIES:  # the manifest last
        src = FileSystems.join(stage, name)
        if _exists(src):
            _move(src, FileSystems.join(out, name))
    discard(old)
    discard(stage)

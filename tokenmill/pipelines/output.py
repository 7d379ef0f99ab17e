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
import fnmatch
import os
import shutil
import uuid
from collections.abc import Iterator

from apache_beam.io.filesystems import FileSystems

from tokenmill.errors import UserError

# What a run owns under OUT, the manifest first. Only these are replaced: a user's own files
# beside them (OUT = a project folder with its own docs/) are left alone.
OWNED = ("manifest.json", "inputs.jsonl", "tokenizer.json", "report/report.json", "report/report.html",
         "report/samples/*.jsonl", "docs/kept-*.parquet", "docs/filtered-*.parquet", "docs/duplicates-*.parquet",
         "shards/train-*.arrow", "shards/val-*.arrow", "export/*/*")
STAGE_PREFIX = ".tokenmill-stage-"
OLD_PREFIX = ".tokenmill-old-"
LOCK_NAME = ".tokenmill.lock"
COMPLETE = ".complete"  # in a stage folder: the run succeeded and its publish began


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


def _files(folder: str, patterns) -> list[str]:
    """The files under ``folder`` matching ``patterns``, in pattern order, as relative paths."""
    found: list[str] = []
    for pattern in patterns:
        matched = FileSystems.match([FileSystems.join(folder, pattern)])[0].metadata_list
        found += sorted(m.path[len(folder.rstrip("/")) + 1:] for m in matched)
    return found


def _remove(path: str) -> None:
    if _local(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    matched = FileSystems.match([path.rstrip("/") + "/**"])[0].metadata_list
    if matched:
        FileSystems.delete([m.path for m in matched])


def _move(src: str, dst: str) -> None:
    if _local(src):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(src, dst)
    else:
        FileSystems.rename([src], [dst])


def remove_leftovers(out: str) -> None:
    """Folders of runs killed before they could clean up. A stage marked complete was being
    published when its run died: the publish is finished (the previous output is already partly
    replaced); any other stage is an unfinished run's and is removed, as are old folders."""
    if not (_local(out) and os.path.isdir(out)):
        return
    names = sorted(os.listdir(out))
    for name in names:
        stage = os.path.join(out, name)
        if name.startswith(STAGE_PREFIX) and os.path.exists(os.path.join(stage, COMPLETE)):
            _move_in(stage, out)
    for name in names:
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


def _staged(stage: str) -> list[str]:
    if not _local(stage):
        return _files(stage, ("**",))
    return sorted(os.path.relpath(os.path.join(d, f), stage) for d, _, fs in os.walk(stage) for f in fs)


def _move_in(stage: str, out: str) -> None:
    """Every staged file a run owns into OUT, the manifest last (not a temporary file that a
    retried worker step left behind)."""
    for rel in sorted(_staged(stage), key=lambda r: r == "manifest.json"):
        if any(fnmatch.fnmatchcase(rel, pattern) for pattern in OWNED):
            _move(FileSystems.join(stage, rel), FileSystems.join(out, rel))


def publish(stage: str, out: str) -> None:
    """Replace OUT's previous output by the staged one, file by file. The previous manifest goes
    first and the new one comes last, so no reader ever finds a manifest beside another run's
    shards. The stage is marked complete first: a run killed half-way is finished by the next."""
    with FileSystems.create(FileSystems.join(stage, COMPLETE)) as fh:
        fh.write(b"")
    old = FileSystems.join(out, OLD_PREFIX + uuid.uuid4().hex[:8])
    for rel in _files(out, OWNED):
        _move(FileSystems.join(out, rel), FileSystems.join(old, rel))
    _move_in(stage, out)
    discard(old)
    discard(stage)

"""The output folder of ``prepare``: one run at a time, and replaced only by a run that succeeds.

A run writes everything under ``OUT/.tokenmill-stage-<id>/``; only when the pipeline has
finished are the previous run's entries moved aside and the new ones moved in, the manifest
last (the contract: a manifest names a complete output). A failed, interrupted or killed run
leaves the previous output whole; its stage folder is removed then, or by the next run.

A local OUT is locked with ``flock`` for the whole run: the kernel releases it when the process
dies, so a crashed run never leaves it stuck.

An object store has no rename and no flock, so an OUT there (s3://) has its own protocol
(pipelines/commit.py): files are written once, under their final names, in a fresh
``OUT/tokenmill-run-<time>-<id>/`` prefix, and the run commits by writing ``OUT/manifest.json``
(one PutObject, atomic), which names that prefix as its ``root``; readers go through it. The
lock is an object taken with a conditional write and held by a lease. The same on gs://.

OUT may be a folder someone else made. Nothing here follows a symbolic link inside it: the
lock is opened with O_NOFOLLOW, a folder the run writes into (docs/, shards/, report/samples/,
...) that is a link is refused before the run, and a leftover stage folder that is a link is
neither entered nor removed. Only files a run owns are replaced; nothing else is removed.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import uuid
from collections.abc import Iterator

from tokenmill.beamfs import FileSystems
from tokenmill.errors import UserError
from tokenmill.folders import LOCK_NAME, take_lock  # noqa: F401  (LOCK_NAME: OUT's lock, read here by tests)
from tokenmill.pipelines import commit

# What a run owns under OUT, the manifest first. Only these are replaced: a user's own files
# beside them (OUT = a project folder with its own docs/) are left alone.
OWNED = ("manifest.json", "inputs.jsonl", "tokenizer.json", "report/report.json", "report/report.html",
         "report/samples/*.jsonl", "docs/kept-*.parquet", "docs/filtered-*.parquet", "docs/duplicates-*.parquet",
         "shards/train-*.arrow", "shards/val-*.arrow", "export/*/*")
STAGE_PREFIX = ".tokenmill-stage-"
OLD_PREFIX = ".tokenmill-old-"
COMPLETE = ".complete"  # in a stage folder: the run succeeded and its publish began
# The folders the owned files live in ("export/*" is each format's folder), parents first.
OWNED_FOLDERS = tuple(dict.fromkeys("/".join(p.split("/")[:i]) for p in OWNED for i in range(1, p.count("/") + 1)))


def _local(out: str) -> bool:
    return "://" not in out


@contextlib.contextmanager
def locked(out: str) -> Iterator[None]:
    """Hold OUT for this run, or refuse in one line when another run holds it."""
    if commit.handles(out):
        with commit.lease(out):
            yield
        return
    if not _local(out):  # another filesystem (hdfs://): no lock
        yield
        return
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UserError(f"output: cannot write {out} ({e.strerror})") from None
    fd = take_lock(out, "prepare", "output:", "--output")
    try:
        check_no_links(out)
        yield
    finally:
        os.close(fd)  # releases the lock


def check_no_links(out: str) -> None:
    """Refuse, in one line, a local OUT whose folders a run writes into are symbolic links: the
    run would write, and replace files, wherever they point."""
    if not _local(out):
        return
    for folder in OWNED_FOLDERS:
        parent, _, name = folder.rpartition("/")
        names = [name]
        if name == "*":  # every entry of the parent (checked itself just before)
            base = os.path.join(out, parent)
            names = sorted(os.listdir(base)) if os.path.isdir(base) else []
        for n in names:
            path = os.path.join(out, parent, n)
            if os.path.islink(path):
                raise UserError(f"output: {path} is a symbolic link; tokenmill writes only into real folders "
                                "under OUT (remove the link, or choose another --output)")


def check_separate(src: str, target: str, verb: str) -> None:
    """Refuse, in one line, a ``verb --output`` that is the OUT it reads (however spelled: another
    path, a link to it) or inside a folder that a run into OUT replaces (docs/, shards/, ...)."""
    if not (_local(src) and _local(target)):
        if FileSystems.join(target, "") == FileSystems.join(src, ""):
            raise UserError(f"{verb}: --output {target} is the output it reads; choose another folder")
        return
    real_src, real_target = os.path.realpath(src), os.path.realpath(target)
    if real_target == real_src:
        raise UserError(f"{verb}: --output {target} is {src} itself; choose another folder")
    for top in dict.fromkeys(folder.split("/")[0] for folder in OWNED_FOLDERS):
        inside = os.path.join(real_src, top)
        if os.path.commonpath([real_target, inside]) == inside:
            raise UserError(f"{verb}: --output {target} is inside {os.path.join(src, top)}, which a run into "
                            f"{src} replaces; choose a folder outside it")


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
    if commit.handles(out):
        commit.sweep(out)
        return
    if not (_local(out) and os.path.isdir(out)):
        return
    # A link by one of these names is not a run's: it is neither entered nor removed.
    names = [n for n in sorted(os.listdir(out)) if n.startswith((STAGE_PREFIX, OLD_PREFIX))
             and not os.path.islink(os.path.join(out, n))]
    for name in names:
        stage = os.path.join(out, name)
        if name.startswith(STAGE_PREFIX) and os.path.exists(os.path.join(stage, COMPLETE)):
            _move_in(stage, out)
    for name in names:
        _remove(os.path.join(out, name))


def new_stage(out: str) -> str:
    if commit.handles(out):
        return commit.new_root(out)
    stage = FileSystems.join(out, STAGE_PREFIX + uuid.uuid4().hex[:8])
    if _local(stage):
        os.makedirs(stage)
    return stage


def discard(stage: str) -> None:
    if commit.handles(stage):
        commit.discard(stage)
        return
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
    shards. The stage is marked complete first: a run killed half-way is finished by the next.
    On an object store: commit.publish (no file moves)."""
    if commit.handles(out):
        commit.publish(stage, out, [p for p in OWNED if p != "manifest.json"])
        return
    with FileSystems.create(FileSystems.join(stage, COMPLETE)) as fh:
        fh.write(b"")
    old = FileSystems.join(out, OLD_PREFIX + uuid.uuid4().hex[:8])
    for rel in _files(out, OWNED):
        _move(FileSystems.join(out, rel), FileSystems.join(old, rel))
    _move_in(stage, out)
    discard(old)
    discard(stage)

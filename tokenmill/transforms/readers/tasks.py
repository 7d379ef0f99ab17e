"""Step 2: files to units of work (byte ranges, row-group ranges, whole files), and the input list
file whose line ranges are the read tasks."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass

from tokenmill.beamfs import FileSystems
from tokenmill.config import ReadConfig
from tokenmill.errors import UserError
from tokenmill.transforms.doc import new_doc

from .formats import detect_format, split_rule
from .inputs import InputFile
from .streams import broken, open_raw


@dataclass(frozen=True)
class Unit:
    file: InputFile
    fmt: str
    start: int = 0  # byte offset (jsonl) or first row group (parquet)
    end: int | None = None  # exclusive; None = to the end
    first_row: int = 0  # parquet: index of the first row of ``start``
    nbytes: int = -1  # the share of the file's bytes this unit reads (progress); -1: all of it

    def size(self) -> int:
        return self.file.size if self.nbytes < 0 else self.nbytes


def plan_units(f: InputFile, cfg: ReadConfig) -> Iterator[Unit | dict]:
    """Cut one file into units of work; yields a dropped doc for a file no reader takes. The
    format is told by the name the file was found under (``rel``): its real path may be a blob
    without one (a Hugging Face cache links data.parquet to blobs/<sha256>)."""
    fmt = detect_format(f.rel)
    if fmt is None:
        yield new_doc(f.rel, f.path, dropped_by="read:unsupported_format")
        return
    if f.size == 0:
        yield new_doc(f.rel, f.path, dropped_by="read:empty_file")
        return
    rule = split_rule(f.rel)
    if rule == "bytes" and f.size > cfg.split_bytes:
        for start in range(0, f.size, cfg.split_bytes):
            yield Unit(f, fmt, start, min(start + cfg.split_bytes, f.size), nbytes=min(cfg.split_bytes, f.size - start))
        return
    if rule == "row_groups":
        yield from _plan_row_groups(f, fmt, cfg)
        return
    yield Unit(f, fmt)


def _plan_row_groups(f: InputFile, fmt: str, cfg: ReadConfig) -> Iterator[Unit | dict]:
    import pyarrow.parquet as pq

    try:
        with open_raw(f.path) as fh:
            meta = pq.ParquetFile(fh).metadata
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError on a corrupt footer
        yield broken(f.rel, f, "corrupt_file", e)
        return
    if meta.num_rows == 0:  # a valid file without a record: one row says so
        yield new_doc(f.rel, f.path, dropped_by="read:empty_file")
        return
    # Group consecutive row groups into units of about split_bytes; each stands for its share of
    # the file's bytes (the shares add up to the file's size exactly).
    total = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) or 1
    start, row, first_row, acc, done, credited = 0, 0, 0, 0, 0, 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        acc += rg.total_byte_size
        row += rg.num_rows
        if acc >= cfg.split_bytes or i == meta.num_row_groups - 1:
            done += acc
            share = f.size * done // total - credited
            credited += share
            yield Unit(f, fmt, start, i + 1, first_row, nbytes=share)
            start, first_row, acc = i + 1, row, 0


# The runner moves, shuffles and tracks every element, and Beam's local FnApiRunner holds
# several times the bytes of what it shuffles (bench/MEASUREMENTS.md: read tasks are tiny), so
# tasks are tiny: a byte range of the input list file.
# Small files are read in runs of up to this many per task ...
MAX_FILES_PER_TASK = 64
# ... but never fewer tasks than this (when there are that many files), so every worker of a
# big cluster still gets work.
MIN_TASKS = 1000


@dataclass(frozen=True)
class FileRange:
    """Lines ``[start, end)`` (byte offsets) of the input list: whole files one task reads, or
    (``split``) one file big enough to be cut into units first."""

    list_path: str
    start: int
    end: int
    split: bool = False
    nbytes: int = 0  # the listed files' total size (progress)

    def size(self) -> int:
        return self.nbytes


def _may_split(f: InputFile, cfg: ReadConfig) -> bool:
    return f.size > cfg.split_bytes and split_rule(f.rel) is not None


def write_input_list(files: list[InputFile], path: str, cfg: ReadConfig) -> list[FileRange]:
    """Write the resolved inputs to ``path``, one JSON object per line (it stays in the output:
    which files, of what size, the output was made from), and return the read tasks over it
    (see the package docstring for why the list travels as a file)."""
    per_task = max(1, min(MAX_FILES_PER_TASK, len(files) // MIN_TASKS))
    tasks: list[FileRange] = []
    run: list[int] = []  # byte offsets of the lines of the small files not yet in a task
    run_bytes = pos = 0
    try:
        fh = FileSystems.create(path, mime_type="application/jsonl")
    except OSError as e:  # the first write into OUT: an unwritable output folder shows here
        raise UserError(f"output: cannot write {path} ({e})") from None
    with fh:
        for f in files:
            line = _json_line({"path": f.path, "rel": f.rel, "size": f.size})
            fh.write(line)
            split = _may_split(f, cfg)
            if run and (split or len(run) == per_task):
                tasks.append(FileRange(path, run[0], pos, nbytes=run_bytes))
                run, run_bytes = [], 0
            if split:
                tasks.append(FileRange(path, pos, pos + len(line), split=True, nbytes=f.size))
            else:
                run.append(pos)
                run_bytes += f.size
            pos += len(line)
    if run:
        tasks.append(FileRange(path, run[0], pos, nbytes=run_bytes))
    # Biggest first. A local multi_processing run deals a stage's elements to its workers in
    # turn, each worker one bundle: dealt in descending size, no worker gets more than one task's
    # bytes over another, where the list's own order (paths) left one worker with 6.6% more bytes
    # of 5,000 Rust pages, idle at the end of the clean phase (bench/MEASUREMENTS.md: biggest
    # tasks first). Other runners take them in any order; the output does not depend on it.
    tasks.sort(key=lambda t: -t.nbytes)
    return tasks


def _json_line(obj: dict) -> bytes:
    """``obj`` as one line of UTF-8 JSON. A path that is not UTF-8 (Python holds its bytes as
    surrogate escapes) is written \\u-escaped, which ``json.loads`` gives back unchanged."""
    try:
        return (json.dumps(obj, ensure_ascii=False) + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(obj) + "\n").encode()


LIST_BLOCK = 1 << 20


@functools.lru_cache(maxsize=16)
def _list_block(path: str, index: int) -> bytes:
    """One MB of an input list, kept for the next tasks (at most 16 MB a process): a run of many
    small files is a task a file, and on an object store each read of the list is a request."""
    with open_raw(path) as fh:
        fh.seek(index * LIST_BLOCK)
        return fh.read(LIST_BLOCK)


def files_in(task: FileRange) -> list[InputFile]:
    """The files of a task, from its line range of the input list (which a run never changes:
    its path is the run's own)."""
    first, last = task.start // LIST_BLOCK, (task.end - 1) // LIST_BLOCK
    data = b"".join(_list_block(task.list_path, i) for i in range(first, last + 1))
    lines = data[task.start - first * LIST_BLOCK:task.end - first * LIST_BLOCK].splitlines()
    return [InputFile(**json.loads(line)) for line in lines]


def plan_task(task: FileRange, cfg: ReadConfig) -> Iterator[FileRange | Unit | dict]:
    """A big file's task becomes its units (each then read by any worker); others pass as they are."""
    if not task.split:
        yield task
        return
    for f in files_in(task):
        yield from plan_units(f, cfg)

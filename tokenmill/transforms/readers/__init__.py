"""Readers: input paths -> units of work -> document records.

Three steps, so that one big file is never one unit of work:

1. ``scan_inputs`` / ``resolve_inputs`` (at launch): files, folders and globs to a list of
   ``InputFile``; a missing path is one clear error before any pipeline is built. Local files are
   known by their real path, so one file reached under two spellings (``./x``, a symlink) is read
   once; what is found but not read (broken links, FIFOs, files no reader takes) is counted.
   The list goes to the workers as a file (``write_input_list``), not inside the pipeline: Beam
   copies a pipeline's embedded values many times over.
2. ``plan_units`` (on workers): a file to units. Uncompressed JSONL is cut into byte ranges,
   Parquet into row-group ranges; compressed files and WARCs are one unit each (gzip cannot
   be entered in the middle; Common Crawl ships many moderate WARCs, so files are the grain).
3. ``read_unit`` (on workers, after a Reshuffle): streams the unit's records. Nothing reads
   a whole file into memory; a record above ``max_record_bytes`` is skipped while streaming, and
   a compressed file stops at its inflate limit (``ReadConfig.max_inflated_bytes``).

Every record read is a row: kept, or dropped with ``dropped_by="read:<reason>"`` (invalid UTF-8,
malformed or too deeply nested JSON, a truncated or corrupt file, a WARC record whose
Content-Length lies, ...); the records before a break are kept, and nothing here raises for bad
data. WARC records that are no documents (warcinfo, request, metadata, revisit) get no row, only
the Beam counter ``read.skipped.warc_<type>``.

All I/O goes through Beam's ``FileSystems``, so ``gs://`` and ``s3://`` paths work too.

The package, a module a concern: ``inputs`` (step 1), ``tasks`` (step 2), ``streams`` (opening and
inflating files), ``json_and_text`` (JSONL, Parquet, HTML, txt) and ``warc``; here, the reading of a
task, and (``read_fn``, loaded on first use) ``ReadFn``, the Beam step that reads tasks. Other
packages use the names in ``__all__``; the modules' other public names are the package's own seams
between its modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tokenmill.config import ReadConfig

from .formats import FORMATS, detect_format, reader
from .inputs import GLOB_CHARS, InputFile, InputScan, resolve_inputs, scan_inputs
from .json_and_text import read_html, read_jsonl, read_parquet, read_txt
from .streams import Prefetch, broken
from .tasks import (
    MAX_FILES_PER_TASK,
    MIN_TASKS,
    FileRange,
    Unit,
    files_in,
    plan_task,
    plan_units,
    write_input_list,
)
from .warc import read_warc

__all__ = [
    "FORMATS", "GLOB_CHARS", "MAX_FILES_PER_TASK", "MIN_TASKS", "FileRange", "InputFile", "InputScan", "ReadFn", "Unit",
    "detect_format", "files_in", "plan_task", "plan_units", "read_html", "read_jsonl", "read_parquet",
    "Prefetch", "read_files", "read_task", "read_txt", "read_unit", "read_warc", "resolve_inputs", "scan_inputs",
    "write_input_list",
]


def read_unit(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    """Stream the records of one unit. Never raises for bad data: bad parts become dropped rows."""
    f = unit.file
    try:
        yield from reader(unit.fmt)(unit, cfg)
    except FileNotFoundError as e:
        yield broken(f.rel, f, "file_vanished", e)
    except PermissionError as e:
        yield broken(f.rel, f, "unreadable_file", e)
    except OSError:
        raise  # I/O trouble (a storage hiccup): Beam retries the work
    except Exception as e:  # a library's surprise on hostile bytes: one row, not a dead job
        yield broken(f.rel, f, "reader_error", e)


def read_task(task: FileRange | Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    """The records of a unit, or of every file of a run of small files."""
    if isinstance(task, Unit):
        yield from read_unit(task, cfg)
        return
    files = files_in(task)
    with Prefetch(files) as ahead:  # small objects on a store: fetched a few at a time ahead
        yield from read_files(files, cfg, ahead)


def read_files(files: list[InputFile], cfg: ReadConfig, ahead: Prefetch) -> Iterator[dict[str, Any]]:
    """The records of a run of files, in order (``ahead``: what fetches them ahead, if anything)."""
    for f in files:
        ahead.advance(f)
        for unit in plan_units(f, cfg):
            if isinstance(unit, dict):  # an empty file, a format no reader takes
                yield unit
            else:
                yield from read_unit(unit, cfg)


def __getattr__(name: str):
    if name == "ReadFn":  # a Beam DoFn that imports this package: loaded on first use
        from .read_fn import ReadFn

        return ReadFn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Readers: input paths -> units of work -> document records.

Three steps, so that one big file is never one unit of work:

1. ``resolve_inputs`` (at launch): files, folders and globs to a list of ``InputFile``;
   a missing path is one clear error before any pipeline is built. The list goes to the
   workers as a file (``write_input_list``), not inside the pipeline: Beam copies a pipeline's
   embedded values many times over (a 20,000-file ``Create`` cost the runner 60 MB).
2. ``plan_units`` (on workers): a file to units. Uncompressed JSONL is cut into byte ranges,
   Parquet into row-group ranges; compressed files and WARCs are one unit each (gzip cannot
   be entered in the middle; Common Crawl ships many moderate WARCs, so files are the grain).
3. ``read_unit`` (on workers, after a Reshuffle): streams the unit's records. Nothing reads
   a whole file into memory; a record above ``max_record_bytes`` is skipped while streaming.

Bad records (invalid UTF-8, malformed JSON, a truncated gzip or WARC, an empty file) become
dropped rows with ``dropped_by="read:<reason>"``; the records before them are kept.

All I/O goes through Beam's ``FileSystems``, so ``gs://`` and ``s3://`` paths work too.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import posixpath
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from tokenmill.config import ReadConfig
from tokenmill.errors import UserError
from tokenmill.transforms.doc import new_doc

log = logging.getLogger("tokenmill")

GLOB_CHARS = set("*?[")

# Errors a broken compressed stream raises part-way through.
_STREAM_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, OSError)


@dataclass(frozen=True)
class InputFile:
    path: str  # full path or URL
    rel: str  # path relative to the input root: the id of whole-file records
    size: int


@dataclass(frozen=True)
class Unit:
    file: InputFile
    fmt: str
    start: int = 0  # byte offset (jsonl) or first row group (parquet)
    end: int | None = None  # exclusive; None = to the end
    first_row: int = 0  # parquet: index of the first row of ``start``


# ---------------------------------------------------------------- formats


def detect_format(path: str) -> str | None:
    """The reader for ``path`` by its name, or None when no reader handles it."""
    name = posixpath.basename(path).lower()
    for ext in (".gz", ".zst", ".zstd"):
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    if name.endswith((".warc", ".arc", ".wet", ".wat")) or ".warc." in name:
        return None if name.endswith(".wat") else "warc"
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".html", ".htm", ".xhtml")):
        return "html"
    if name.endswith(".txt"):
        return "txt"
    return None


def _compression(path: str) -> str | None:
    p = path.lower()
    if p.endswith(".gz"):
        return "gzip"
    if p.endswith((".zst", ".zstd")):
        return "zstd"
    return None


# ---------------------------------------------------------------- step 1: resolve


def _glob_root(pattern: str) -> str:
    """The folder above the first glob character: ids are relative to it."""
    cut = min(i for i, ch in enumerate(pattern) if ch in GLOB_CHARS)
    return pattern[:cut].rsplit("/", 1)[0] if "/" in pattern[:cut] else "."


def _rel(path: str, root: str) -> str:
    root = root.rstrip("/")
    if root in ("", ".") and not path.startswith("/"):
        return path
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return posixpath.basename(path)


def resolve_inputs(patterns: list[str]) -> list[InputFile]:
    """Expand files, folders (recursively) and globs; raise UserError for a path that matches nothing."""
    files: dict[str, InputFile] = {}
    for pattern in patterns:
        if any(ch in GLOB_CHARS for ch in pattern):
            root, matched = _glob_root(pattern), _match(pattern)
        elif _is_local_dir(pattern) or (pattern.endswith("/") and "://" in pattern):
            root, matched = pattern.rstrip("/"), _match(pattern.rstrip("/") + "/**")
        else:
            root, matched = posixpath.dirname(pattern), _match(pattern)
            matched = [m for m in matched if m[0] == pattern] or matched
        matched = [m for m in matched if not _is_local_dir(m[0])]
        if not matched:
            raise UserError(f"input not found: {pattern}")
        if len(matched) == 1 and matched[0][0] == pattern and detect_format(pattern) is None:
            raise UserError(f"input {pattern}: no reader for this file type (WARC/WET/ARC, JSONL, Parquet, HTML, txt)")
        # Folders and globs: files no reader handles (README.md, images) are skipped, and said so.
        unreadable = [m[0] for m in matched if detect_format(m[0]) is None]
        if unreadable:
            log.warning("input %s: skipping %d file(s) with no reader, e.g. %s", pattern, len(unreadable),
                        posixpath.basename(unreadable[0]))
            matched = [m for m in matched if detect_format(m[0]) is not None]
            if not matched:
                raise UserError(f"input {pattern}: no readable files (WARC/WET/ARC, JSONL, Parquet, HTML, txt)")
        for path, size in matched:
            files.setdefault(path, InputFile(path=path, rel=_rel(path, root), size=size))
    return sorted(files.values(), key=lambda f: f.path)


def _is_local_dir(path: str) -> bool:
    return "://" not in path and os.path.isdir(path)


def _match(pattern: str) -> list[tuple[str, int]]:
    try:
        result = FileSystems.match([pattern])[0]
    except Exception:  # Beam raises BeamIOError for a missing path on some filesystems
        return []
    return [(m.path, m.size_in_bytes) for m in result.metadata_list]


# ---------------------------------------------------------------- step 2: plan


def plan_units(f: InputFile, cfg: ReadConfig) -> Iterator[Unit | dict]:
    """Cut one file into units of work; yields a dropped doc for a file no reader takes."""
    fmt = detect_format(f.path)
    if fmt is None:
        yield new_doc(f.rel, f.path, dropped_by="read:unsupported_format")
        return
    if f.size == 0:
        yield new_doc(f.rel, f.path, dropped_by="read:empty_file")
        return
    if fmt == "jsonl" and _compression(f.path) is None and f.size > cfg.split_bytes:
        for start in range(0, f.size, cfg.split_bytes):
            yield Unit(f, fmt, start, min(start + cfg.split_bytes, f.size))
        return
    if fmt == "parquet":
        yield from _plan_parquet(f, cfg)
        return
    yield Unit(f, fmt)


def _plan_parquet(f: InputFile, cfg: ReadConfig) -> Iterator[Unit | dict]:
    import pyarrow.parquet as pq

    try:
        with _open_raw(f.path) as fh:
            meta = pq.ParquetFile(fh).metadata
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError on a corrupt footer
        yield _broken(f.rel, f, "corrupt_file", e)
        return
    # Group consecutive row groups into units of about split_bytes.
    start, row, first_row, acc = 0, 0, 0, 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        acc += rg.total_byte_size
        row += rg.num_rows
        if acc >= cfg.split_bytes or i == meta.num_row_groups - 1:
            yield Unit(f, "parquet", start, i + 1, first_row)
            start, first_row, acc = i + 1, row, 0


# The runner moves, shuffles and tracks every element, and Beam's local FnApiRunner holds 5-10x
# the bytes of what it shuffles, so tasks are tiny: a byte range of the input list file.
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


def _may_split(f: InputFile, cfg: ReadConfig) -> bool:
    fmt = detect_format(f.path)
    return f.size > cfg.split_bytes and (fmt == "parquet" or (fmt == "jsonl" and _compression(f.path) is None))


def write_input_list(files: list[InputFile], path: str, cfg: ReadConfig) -> list[FileRange]:
    """Write the resolved inputs to ``path``, one JSON object per line (it stays in the output:
    which files, of what size, the output was made from), and return the read tasks over it
    (see the module docstring for why the list travels as a file)."""
    per_task = max(1, min(MAX_FILES_PER_TASK, len(files) // MIN_TASKS))
    tasks: list[FileRange] = []
    run: list[int] = []  # byte offsets of the lines of the small files not yet in a task
    pos = 0
    try:
        fh = FileSystems.create(path, mime_type="application/jsonl")
    except OSError as e:  # the first write into OUT: an unwritable output folder shows here
        raise UserError(f"output: cannot write {path} ({e})") from None
    with fh:
        for f in files:
            line = (json.dumps({"path": f.path, "rel": f.rel, "size": f.size}, ensure_ascii=False) + "\n").encode()
            fh.write(line)
            split = _may_split(f, cfg)
            if run and (split or len(run) == per_task):
                tasks.append(FileRange(path, run[0], pos))
                run = []
            if split:
                tasks.append(FileRange(path, pos, pos + len(line), split=True))
            else:
                run.append(pos)
            pos += len(line)
    if run:
        tasks.append(FileRange(path, run[0], pos))
    return tasks


def files_in(task: FileRange) -> list[InputFile]:
    with FileSystems.open(task.list_path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        fh.seek(task.start)
        lines = fh.read(task.end - task.start).splitlines()
    return [InputFile(**json.loads(line)) for line in lines]


def plan_task(task: FileRange, cfg: ReadConfig) -> Iterator[FileRange | Unit | dict]:
    """A big file's task becomes its units (each then read by any worker); others pass as they are."""
    if not task.split:
        yield task
        return
    for f in files_in(task):
        yield from plan_units(f, cfg)


def read_task(task: FileRange | Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    """The records of a unit, or of every file of a run of small files."""
    if isinstance(task, Unit):
        yield from read_unit(task, cfg)
        return
    for f in files_in(task):
        for unit in plan_units(f, cfg):
            if isinstance(unit, dict):  # an empty file, a format no reader takes
                yield unit
            else:
                yield from read_unit(unit, cfg)


# ---------------------------------------------------------------- step 3: read


def _open_raw(path: str) -> IO[bytes]:
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _open_decompressed(path: str) -> IO[bytes]:
    raw = _open_raw(path)
    comp = _compression(path)
    if comp == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if comp == "zstd":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return raw


def _broken(doc_id: str, f: InputFile, reason: str, e: BaseException) -> dict[str, Any]:
    """A dropped row for a file that broke part-way, and one log line saying where and why."""
    log.warning("read: %s in %s (%s: %s); records before it are kept", reason, f.path, type(e).__name__, e)
    return new_doc(doc_id, f.path, dropped_by=f"read:{reason}")


def read_unit(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    """Stream the records of one unit. Never raises for bad data: bad parts become dropped rows."""
    reader = {"jsonl": read_jsonl, "parquet": read_parquet, "warc": read_warc, "html": read_html, "txt": read_txt}[
        unit.fmt
    ]
    try:
        yield from reader(unit, cfg)
    except FileNotFoundError as e:
        yield _broken(unit.file.rel, unit.file, "file_vanished", e)


def _read_capped(fh: IO[bytes], limit: int) -> tuple[bytes | None, int]:
    """Read all of ``fh`` unless it exceeds ``limit`` bytes: then (None, bytes seen), streaming."""
    data = fh.read(limit + 1)
    if len(data) <= limit:
        return data, len(data)
    seen = len(data)
    del data
    while chunk := fh.read(1 << 20):
        seen += len(chunk)
    return None, seen


def _read_line(fh: IO[bytes], limit: int) -> tuple[bytes | None, int]:
    """One line (with its newline) and its length; (None, length) when longer than ``limit``."""
    line = fh.readline(limit + 1)
    if len(line) <= limit or line.endswith(b"\n"):
        return line, len(line)
    seen = len(line)
    del line
    while True:  # skip the rest of the oversized line without holding it
        part = fh.readline(1 << 20)
        seen += len(part)
        if not part or part.endswith(b"\n"):
            return None, seen


def _record_from_mapping(obj: dict, cfg: ReadConfig, default_id: str, source: str) -> dict[str, Any]:
    rid = obj.get(cfg.id_field)
    rid = default_id if rid is None or rid == "" else str(rid)
    url = obj.get(cfg.url_field)
    url = None if url is None else str(url)
    text = obj.get(cfg.text_field)
    if isinstance(text, str) and text.strip():
        return new_doc(rid, source, url=url, text=text)
    html = obj.get(cfg.html_field) if cfg.html_field else None
    if isinstance(html, (str, bytes)) and html:
        return new_doc(rid, source, url=url, html=html)
    return new_doc(rid, source, url=url, dropped_by="read:no_text_field")


def read_jsonl(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    f = unit.file
    with _open_decompressed(f.path) as fh:
        pos = 0
        if unit.start > 0:
            # Start after the first newline at or past start-1: the previous unit owns the
            # line that straddles the boundary (it reads while a line *starts* before its end).
            fh.seek(unit.start - 1)
            _, skipped = _read_line(fh, cfg.max_record_bytes)
            pos = unit.start - 1 + skipped
        while unit.end is None or pos < unit.end:
            offset = pos
            try:
                line, n = _read_line(fh, cfg.max_record_bytes)
            except _STREAM_ERRORS as e:
                yield _broken(f"{f.rel}:{offset}", f, "truncated_file", e)
                return
            if n == 0:
                return
            pos += n
            default_id = f"{f.rel}:{offset}"  # byte offset: the same however the file is split
            if line is None:
                yield new_doc(default_id, f.path, dropped_by="read:too_large")
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError:
                yield new_doc(default_id, f.path, dropped_by="read:invalid_utf8")
                continue
            except ValueError:
                yield new_doc(default_id, f.path, dropped_by="read:invalid_json")
                continue
            if not isinstance(obj, dict):
                yield new_doc(default_id, f.path, dropped_by="read:not_an_object")
                continue
            yield _record_from_mapping(obj, cfg, default_id, f.path)


def read_parquet(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    f = unit.file
    row = unit.first_row
    try:
        with _open_raw(f.path) as fh:
            pf = pq.ParquetFile(fh)
            wanted = {cfg.id_field, cfg.url_field, cfg.text_field, cfg.html_field} - {None}
            columns = [c for c in pf.schema_arrow.names if c in wanted]
            if cfg.text_field not in columns and (cfg.html_field or "") not in columns:
                yield new_doc(f.rel, f.path, dropped_by="read:no_text_field")
                return
            groups = list(range(unit.start, unit.end or pf.metadata.num_row_groups))
            for batch in pf.iter_batches(batch_size=1024, row_groups=groups, columns=columns):
                for obj in batch.to_pylist():
                    yield _record_from_mapping(obj, cfg, f"{f.rel}:{row}", f.path)
                    row += 1
    except Exception as e:  # a corrupt page or footer: keep what was read, say where it broke
        yield _broken(f"{f.rel}:{row}", f, "corrupt_file", e)


def _media_type(content_type: str | None) -> tuple[str, str | None]:
    if not content_type:
        return "", None
    parts = [p.strip() for p in content_type.split(";")]
    charset = None
    for p in parts[1:]:
        if p.lower().startswith("charset="):
            charset = p.split("=", 1)[1].strip("\"' ") or None
    return parts[0].lower(), charset


def _check_complete(record) -> None:
    """Raise EOFError when a record is shorter than its Content-Length. warcio returns a short
    payload at a clipped end of file instead of raising, so the check is ours."""
    stream = record.raw_stream
    while stream.read(1 << 16):
        pass
    if getattr(stream, "limit", 0) > 0:
        raise EOFError(f"record ends {stream.limit} bytes short of its Content-Length")


def read_warc(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    """WARC/ARC/WET via warcio: response, resource and conversion (WET) records of text media types."""
    from warcio.archiveiterator import ArchiveIterator
    from warcio.exceptions import ArchiveLoadFailed

    f = unit.file
    allowed = {t.lower() for t in cfg.warc_content_types}
    n = 0
    with _open_raw(f.path) as fh:
        try:
            archive = ArchiveIterator(fh, arc2warc=True)
            last = 0
            for record in archive:
                last = archive.offset  # where this record starts (get_record_offset would read it)
                rtype = record.rec_type
                if rtype not in ("response", "resource", "conversion"):
                    _check_complete(record)
                    continue
                rid = (record.rec_headers.get_header("WARC-Record-ID") or f"{f.rel}#{n}").strip("<>")
                url = record.rec_headers.get_header("WARC-Target-URI")
                n += 1
                if rtype == "response" and record.http_headers is not None:
                    status = record.http_headers.get_statuscode()
                    if status and not status.startswith("2"):
                        yield new_doc(rid, f.path, url=url, dropped_by=f"read:http_{status}")
                        continue
                    ctype = record.http_headers.get_header("Content-Type")
                else:
                    ctype = record.rec_headers.get_header("Content-Type")
                mtype, charset = _media_type(ctype)
                if rtype == "conversion":
                    mtype = mtype or "text/plain"
                if mtype not in allowed:
                    _check_complete(record)
                    continue  # images, PDFs, robots.txt...: not documents
                payload, size = _read_capped(record.content_stream(), cfg.max_record_bytes)
                _check_complete(record)
                if payload is None:
                    yield new_doc(rid, f.path, url=url, dropped_by="read:too_large")
                elif mtype == "text/plain":
                    try:
                        text = payload.decode(charset or "utf-8")
                    except (UnicodeDecodeError, LookupError):
                        yield new_doc(rid, f.path, url=url, dropped_by="read:invalid_utf8")
                        continue
                    yield new_doc(rid, f.path, url=url, text=text)
                else:
                    yield new_doc(rid, f.path, url=url, html=payload, encoding=charset)
            if archive.offset < f.size:
                # A gzip member cut before its first record header: warcio stops as if at the end.
                raise EOFError(f"{f.size - archive.offset} bytes after the last complete record")
            _check_last_gzip_member(fh, last)
        except (ArchiveLoadFailed, *_STREAM_ERRORS) as e:
            reason = "truncated_file" if isinstance(e, (EOFError, zlib.error)) or "EOF" in str(e) else "corrupt_file"
            yield _broken(f"{f.rel}#{n}", f, reason, e)  # n: the records before the break


def _check_last_gzip_member(fh: IO[bytes], offset: int) -> None:
    """warcio takes a last gzip member whose 8-byte trailer (CRC, size) is cut short for a whole
    one, so a file cut a few bytes short would pass as complete: decompress that member again."""
    if not fh.seekable():
        return
    fh.seek(offset)
    if fh.read(2) != b"\x1f\x8b":
        return  # not gzip (uncompressed WARC, or an empty file)
    fh.seek(offset)
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        while not d.eof and (chunk := d.unconsumed_tail or fh.read(1 << 20)):
            d.decompress(chunk, 1 << 20)  # output bounded per call; it is only checked, not kept
    except zlib.error as e:  # a whole trailer that does not match: damaged, not cut short
        raise gzip.BadGzipFile(f"the last gzip member fails its check ({e})") from None
    if not d.eof:
        raise EOFError("the last gzip member ends before its trailer")


def _read_whole(unit: Unit, cfg: ReadConfig) -> tuple[bytes | None, dict | None]:
    """The bytes of a one-document file, or a dropped doc saying why not."""
    f = unit.file
    try:
        with _open_decompressed(f.path) as fh:
            data, _ = _read_capped(fh, cfg.max_record_bytes)
    except _STREAM_ERRORS as e:
        return None, _broken(f.rel, f, "truncated_file", e)
    if data is None:
        return None, new_doc(f.rel, f.path, dropped_by="read:too_large")
    if not data.strip():
        return None, new_doc(f.rel, f.path, dropped_by="read:empty_file")
    return data, None


def read_html(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    data, bad = _read_whole(unit, cfg)
    yield bad or new_doc(unit.file.rel, unit.file.path, html=data)


def read_txt(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    data, bad = _read_whole(unit, cfg)
    if bad:
        yield bad
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        yield new_doc(unit.file.rel, unit.file.path, dropped_by="read:invalid_utf8")
        return
    yield new_doc(unit.file.rel, unit.file.path, text=text.removeprefix("\ufeff"))

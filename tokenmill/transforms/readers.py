"""Readers: input paths -> units of work -> document records.

Three steps, so that one big file is never one unit of work:

1. ``scan_inputs`` / ``resolve_inputs`` (at launch): files, folders and globs to a list of
   ``InputFile``; a missing path is one clear error before any pipeline is built. Local files are
   known by their real path, so one file reached under two spellings (``./x``, a symlink) is read
   once; what is found but not read (broken links, FIFOs, files no reader takes) is counted.
   The list goes to the workers as a file (``write_input_list``), not inside the pipeline: Beam
   copies a pipeline's embedded values many times over (a 20,000-file ``Create`` cost the
   runner 60 MB).
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
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import logging
import os
import posixpath
import re
import stat
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import zstandard
from apache_beam.io.filesystem import CompressionTypes, FileSystem
from apache_beam.io.filesystems import FileSystems
from warcio.bufferedreaders import BufferedReader, ChunkedDataReader, DecompressingBufferedReader

from tokenmill.config import ReadConfig
from tokenmill.errors import UserError
from tokenmill.transforms.doc import new_doc, path_text
from tokenmill.transforms.stage import count

log = logging.getLogger("tokenmill")

GLOB_CHARS = set("*?[")

# Errors a broken compressed stream raises part-way through.
_STREAM_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, OSError, zstandard.ZstdError)

@dataclass(frozen=True)
class InputFile:
    path: str  # what is opened: the real path of a local file (symlinks resolved), or a URL
    # The path as found, relative to the input root: the id of whole-file records, and the
    # name that tells the format. Bytes of a name that are not UTF-8 are written \\xNN.
    rel: str
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


@dataclass(frozen=True)
class InputScan:
    files: list[InputFile]
    # Found but not read, by reason: the launcher puts it in the report. broken_link,
    # not_regular_file, no_reader, unreadable, output_folder (see _SKIPS); duplicate: a file
    # reached again under another spelling or link (read once); duplicate_folder: a folder
    # reached again through a symlink (walked once); symlink_loop: a symlinked folder that
    # holds the link itself (not walked).
    skipped: dict[str, int] = field(default_factory=dict)


# The error for a file the user named that is not read, by reason.
_SKIPS = {
    "broken_link": "a broken symbolic link",
    "not_regular_file": "not a regular file (a FIFO, device or socket: never opened, a FIFO would hang)",
    "no_reader": "no reader for this file type (WARC/WET/ARC, JSONL, Parquet, HTML, txt)",
    "unreadable": "cannot be read (permission denied)",
    "output_folder": "inside the output folder",
}


def _glob_root(pattern: str) -> str:
    """The folder above the first glob character: ids are relative to it."""
    cut = min(i for i, ch in enumerate(pattern) if ch in GLOB_CHARS)
    if "/" not in pattern[:cut]:
        return "."
    return pattern[:cut].rsplit("/", 1)[0] or "/"


def _rel(path: str, root: str) -> str:
    root = root.rstrip("/")
    if root in ("", ".") and not path.startswith("/"):
        return path
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return posixpath.basename(path)


def resolve_inputs(patterns: list[str]) -> list[InputFile]:
    """The files to read (see ``scan_inputs``)."""
    return scan_inputs(patterns).files


def scan_inputs(patterns: list[str], exclude: Sequence[str] = ()) -> InputScan:
    """Expand files, folders (recursively) and globs; raise UserError for a path that matches
    nothing, and for a named file that cannot be read. A local file is known by its real path, so
    it is read once however many spellings or symlinks reach it; nothing under a folder of
    ``exclude`` (the output folder) is taken, even through a symlink."""
    files: dict[str, InputFile] = {}
    skipped: Counter[str] = Counter()
    excluded = [os.path.realpath(p) for p in exclude if "://" not in p]
    for given in patterns:
        if "://" in given:
            pattern = given
            root, found = _remote_entries(pattern)
        else:
            pattern = os.path.normpath(given)  # ./x and a/../a/x are x: one id
            root, found = _local_entries(pattern, excluded, skipped)
        if not found:
            raise UserError(f"input not found: {given}")
        named = len(found) == 1 and found[0][0] == pattern
        taken = 0
        for path, real, size, why in found:
            why = why or ("no_reader" if detect_format(path) is None else None)
            if why and named:
                raise UserError(f"input {given}: {_SKIPS[why]}")
            taken += why is None
            if why is None and real in files:
                why = "duplicate"
            if why:
                skipped[why] += 1
            else:
                files[real] = InputFile(path=real, rel=path_text(_rel(path, root)), size=size)
        if not taken:
            raise UserError(f"input {given}: no readable files (WARC/WET/ARC, JSONL, Parquet, HTML, txt)")
    if skipped:
        log.warning("inputs: not read: %s", ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())))
    return InputScan(sorted(files.values(), key=lambda f: f.path), dict(skipped))


_Entry = tuple[str, str, int, str | None]  # path as found, real path, size, why it is skipped


def _remote_entries(pattern: str) -> tuple[str, list[_Entry]]:
    if any(ch in GLOB_CHARS for ch in pattern):
        root, matched = _glob_root(pattern), _match(pattern)
    elif pattern.endswith("/"):
        root, matched = pattern.rstrip("/"), _match(pattern.rstrip("/") + "/**")
    else:
        root, matched = posixpath.dirname(pattern), _match(pattern)
        matched = [m for m in matched if m[0] == pattern] or matched
    return root, [(path, path, size, None) for path, size in matched]


def _match(pattern: str) -> list[tuple[str, int]]:
    try:
        result = FileSystems.match([pattern])[0]
    except Exception:  # Beam raises BeamIOError for a missing path on some filesystems
        return []
    return [(m.path, m.size_in_bytes) for m in result.metadata_list]


def _local_entries(pattern: str, excluded: list[str], skipped: Counter[str]) -> tuple[str, list[_Entry]]:
    """The local paths ``pattern`` names, with Beam's glob syntax (``*`` within a folder,
    ``**`` across folders), without folders."""
    if any(ch in GLOB_CHARS for ch in pattern):
        root = _glob_root(pattern)
        match = re.compile(FileSystem.translate_pattern(pattern)).match
        below = pattern if root == "." else pattern[len(root) :].lstrip("/")
        depth = None if "**" in below else below.count("/")
        paths = [p for p in _walk(root, depth, excluded, skipped) if match(p)]
    elif os.path.isdir(pattern):
        root, paths = pattern, list(_walk(pattern, None, excluded, skipped))
    else:
        root, paths = os.path.dirname(pattern), [pattern] if os.path.lexists(pattern) else []
    return root, [(p, *_local_file(p, excluded)) for p in sorted(paths)]


def _under(real: str, folders: list[str]) -> bool:
    return any(real == d or real.startswith(d.rstrip("/") + "/") for d in folders)


def _walk(root: str, depth: int | None, excluded: list[str], skipped: Counter[str]) -> Iterator[str]:
    """Every entry below ``root`` that is not a folder, at most ``depth`` folders down (None: all).
    Symlinked folders are followed once, after the real ones: a folder whose real path was walked
    already, or one that holds the very link to it (a loop), is counted, not walked again."""
    seen: set[str] = set()
    todo, links = [(root, 0, "")], []
    while todo or links:
        folder, d, parent = todo.pop() if todo else links.pop()
        real = os.path.realpath(folder)
        why = ("symlink_loop" if _under(parent, [real]) else "duplicate_folder" if real in seen
               else "output_folder" if _under(real, excluded) else None)
        if why:
            skipped[why] += 1
            continue
        seen.add(real)
        try:
            with os.scandir(folder) as it:
                entries = sorted((e.name, e.is_dir(), e.is_symlink()) for e in it)  # is_dir follows links
        except OSError:
            skipped["unreadable"] += 1
            continue
        prefix = "" if folder == "." else folder.rstrip("/") + "/"
        for name, is_dir, is_link in reversed(entries):
            if not is_dir:
                yield prefix + name
            elif depth is None or d < depth:
                (links if is_link else todo).append((prefix + name, d + 1, real))


def _local_file(path: str, excluded: list[str]) -> tuple[str, int, str | None]:
    """(real path, size, why it is skipped or None) for a local path that is not a folder."""
    try:
        st = os.stat(path)
    except OSError:
        return path, 0, "broken_link" if os.path.islink(path) else "unreadable"
    real = os.path.realpath(path)
    if _under(real, excluded):
        return real, 0, "output_folder"
    if not stat.S_ISREG(st.st_mode):
        return real, 0, "not_regular_file"
    if not os.access(path, os.R_OK):
        return real, 0, "unreadable"
    return real, st.st_size, None


# ---------------------------------------------------------------- step 2: plan


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
    if fmt == "jsonl" and _compression(f.rel) is None and f.size > cfg.split_bytes:
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
    if meta.num_rows == 0:  # a valid file without a record: one row says so
        yield new_doc(f.rel, f.path, dropped_by="read:empty_file")
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
    fmt = detect_format(f.rel)
    return f.size > cfg.split_bytes and (fmt == "parquet" or (fmt == "jsonl" and _compression(f.rel) is None))


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
            line = _json_line({"path": f.path, "rel": f.rel, "size": f.size})
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


def _json_line(obj: dict) -> bytes:
    """``obj`` as one line of UTF-8 JSON. A path that is not UTF-8 (Python holds its bytes as
    surrogate escapes) is written \\u-escaped, which ``json.loads`` gives back unchanged."""
    try:
        return (json.dumps(obj, ensure_ascii=False) + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(obj) + "\n").encode()


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


class _InflateLimit(Exception):
    """A compressed file inflated past its limit (ReadConfig.max_inflated_bytes)."""


def _inflate_limit(f: InputFile, cfg: ReadConfig) -> int:
    # With the ratio, the work stays proportional to the bytes stored, and a 10 GB .jsonl.zst
    # still reads whole, while a small gzip of newlines stops early.
    return max(cfg.max_inflated_bytes, int(cfg.max_inflate_ratio * f.size))


def _stream_reason(e: BaseException) -> str:
    """The drop reason for the error that stopped a file part-way."""
    if isinstance(e, _InflateLimit):
        return "inflate_limit"
    return "truncated_file" if isinstance(e, EOFError) else "corrupt_file"


def _open_raw(path: str) -> IO[bytes]:
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _open_decompressed(f: InputFile) -> IO[bytes]:
    raw = _open_raw(f.path)
    comp = _compression(f.rel)
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


def _broken(doc_id: str, f: InputFile, reason: str, e: BaseException) -> dict[str, Any]:
    """A dropped row for a file that broke part-way, and one log line saying where and why."""
    log.warning("read: %s in %s (%s: %s); records before it are kept", reason, f.path, type(e).__name__, e)
    return new_doc(doc_id, f.path, dropped_by=f"read:{reason}")


def read_unit(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    """Stream the records of one unit. Never raises for bad data: bad parts become dropped rows."""
    reader = {"jsonl": read_jsonl, "parquet": read_parquet, "warc": read_warc, "html": read_html, "txt": read_txt}[
        unit.fmt
    ]
    f = unit.file
    try:
        yield from reader(unit, cfg)
    except FileNotFoundError as e:
        yield _broken(f.rel, f, "file_vanished", e)
    except PermissionError as e:
        yield _broken(f.rel, f, "unreadable_file", e)
    except OSError:
        raise  # I/O trouble (a storage hiccup): Beam retries the work
    except Exception as e:  # a library's surprise on hostile bytes: one row, not a dead job
        yield _broken(f.rel, f, "reader_error", e)


def _read_capped(fh: IO[bytes], limit: int) -> bytes | None:
    """All of ``fh``, or None when it holds more than ``limit`` bytes (the rest is left unread:
    no work for what is dropped)."""
    data = fh.read(limit + 1)
    return data if len(data) <= limit else None


def _read_line(fh: IO[bytes], limit: int, budget: int | None = None) -> tuple[bytes | None, int]:
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


def _skip_blank_lines(fh: IO[bytes], most: int) -> int:
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


def _codec(charset: str) -> str | None:
    """Python's name for a charset label, or None when it names no text encoding."""
    try:
        info = codecs.lookup(charset)
    except (LookupError, ValueError, TypeError):
        return None
    return info.name if getattr(info, "_is_text_encoding", True) else None


def _decode_text(data: bytes, charset: str | None) -> tuple[str | None, str | None]:
    """(text, None), or (None, reason). A label Python does not know (``x-unknown``, ``binary``)
    falls back to UTF-8, so ASCII under an odd label reads; bytes that fit neither are
    ``unknown_charset``, and ``invalid_utf8`` is said only where UTF-8 was what they had to be."""
    codec = _codec(charset) if charset else "utf-8"
    for name in dict.fromkeys(c for c in (codec, "utf-8") if c):
        try:
            return data.decode(name).removeprefix("\ufeff"), None
        except (UnicodeError, LookupError):
            pass
    if codec is None:
        return None, "unknown_charset"
    return None, "invalid_utf8" if codec == "utf-8" else "invalid_encoding"


def _record_from_mapping(obj: dict, cfg: ReadConfig, default_id: str, source: str) -> dict[str, Any]:
    """A JSON object or Parquet row to a doc. Values of any type are taken: ``new_doc`` makes ids
    and urls text; a text that is no string is a drop."""
    rid = obj.get(cfg.id_field)
    rid = default_id if rid is None or rid == "" else rid
    url = obj.get(cfg.url_field)
    text = obj.get(cfg.text_field)
    if isinstance(text, bytes):  # a Parquet binary column
        text, bad = _decode_text(text, None)
        if bad:
            return new_doc(rid, source, url=url, dropped_by=f"read:{bad}")
    html = obj.get(cfg.html_field) if cfg.html_field else None
    if isinstance(text, str) and text.strip():
        kind, value = "text", text
    elif isinstance(html, (str, bytes)) and html:
        kind, value = "html", html
    else:
        reason = "no_text_field" if text is None or isinstance(text, str) else "text_not_string"
        return new_doc(rid, source, url=url, dropped_by=f"read:{reason}")
    if len(value) > cfg.max_record_bytes:  # a Parquet cell (a JSONL line is capped as it is read)
        return new_doc(rid, source, url=url, dropped_by="read:too_large")
    return new_doc(rid, source, url=url, **{kind: value})


def _json_record(line: bytes, cfg: ReadConfig, default_id: str, source: str) -> dict[str, Any]:
    try:
        obj = json.loads(line.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError:
        return new_doc(default_id, source, dropped_by="read:invalid_utf8")
    except RecursionError:  # nested deeper than the interpreter's stack: [[[[...
        return new_doc(default_id, source, dropped_by="read:too_deep")
    except ValueError:
        return new_doc(default_id, source, dropped_by="read:invalid_json")
    if not isinstance(obj, dict):
        return new_doc(default_id, source, dropped_by="read:not_an_object")
    return _record_from_mapping(obj, cfg, default_id, source)


def read_jsonl(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    f = unit.file
    limit = _inflate_limit(f, cfg) if _compression(f.rel) else None  # a plain file's size bounds it
    # Compressed files are never split: they stop past their inflate limit.
    stop = unit.end if unit.end is not None else limit + 1 if limit is not None else 1 << 62
    with _open_decompressed(f) as fh:
        pos = 0
        if unit.start > 0:
            # Start after the first newline at or past start-1: the previous unit owns the
            # line that straddles the boundary (it reads while a line *starts* before its end).
            fh.seek(unit.start - 1)
            _, skipped = _read_line(fh, cfg.max_record_bytes)
            pos = unit.start - 1 + skipped
        while pos < stop:
            default_id = f"{f.rel}:{pos}"  # byte offset: the same however the file is split
            try:
                blank = _skip_blank_lines(fh, stop - pos)
                budget = None if limit is None else limit - pos
                line, n = (b"", blank) if blank else _read_line(fh, cfg.max_record_bytes, budget)
            except _STREAM_ERRORS as e:
                yield _broken(default_id, f, _stream_reason(e), e)
                return
            if n == 0:
                return
            pos += n
            if line is None:
                yield new_doc(default_id, f.path, dropped_by="read:too_large")
            elif line.strip():
                yield _json_record(line, cfg, default_id, f.path)
        if limit is not None and pos > limit:
            yield _broken(f"{f.rel}:{pos}", f, "inflate_limit", _InflateLimit(f"inflates past {limit} bytes"))


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
                yield new_doc(f"{f.rel}:{row}", f.path, dropped_by="read:no_text_field")
                return
            groups = list(range(unit.start, unit.end or pf.metadata.num_row_groups))
            for batch in pf.iter_batches(batch_size=1024, row_groups=groups, columns=columns):
                for obj in batch.to_pylist():
                    yield _record_from_mapping(obj, cfg, f"{f.rel}:{row}", f.path)
                    row += 1
    except Exception as e:  # a corrupt page or footer: keep what was read, say where it broke
        yield _broken(f"{f.rel}:{row}", f, "corrupt_file", e)


# ---------------------------------------------------------------- WARC

# The framing of every WARC record is checked, as far as its bytes prove it (warcio trusts the
# Content-Length: a wrong one cut a record silently, or lost the records after it):
# - a "\r\n\r\nWARC/1." inside the block: the length ran over the next record(s). Reading resumes
#   at that header, so the swallowed records are read. (A response that truly holds an
#   uncompressed WARC file is taken for one: it is no document, and its inner records are read.)
# - junk where the next header should be: the length fell short. Reading resumes at the next
#   "\r\n\r\nWARC/1." (in a gzip file at the latest with the next member).
# - a block that ends with its gzip member, short of its length: the length is too large.
# Such a record is one row, read:warc_length_mismatch. A block that runs past the end of the file
# is read:truncated_file: there a cut file and a length too large look the same.
_BOUNDARY = b"\r\n\r\nWARC/1."  # a record's end and the next record's first line
_ARC_HEADER = re.compile(rb"\S+ \S+ \d{14} ")  # url ip date ...: an ARC record's first line
_DOC_TYPES = ("response", "resource", "conversion")
_OTHER_TYPES = ("warcinfo", "request", "metadata", "revisit", "continuation")  # counted, no row
_MAX_HEADER_LINE = 1 << 16
_MAX_BLANK_LINES = 1000  # between records; more is junk (and a run of them is scanned in bulk)


class _BadEncoding(ValueError):
    """A record's HTTP body does not inflate by its Content-Encoding."""


class _StrictInflate:
    """For warcio's readers, which inflate leniently: a corrupt gzip block is printed to stderr
    and read as the end of the data, so a damaged record passes, cut. Here it raises ``error``,
    and the bytes inflated are counted."""

    error: type[Exception] = zlib.error
    inflated = 0
    _started = False

    def _decompress(self, data: bytes) -> bytes:
        if not (self.decompressor and data):
            return data
        try:
            out = self.decompressor.decompress(data)
        except Exception as e:  # zlib.error, brotli.error
            if self._started or data[:2] == b"\x1f\x8b":  # gzip's magic: damaged, not plain
                raise self.error(f"corrupt {self.decomp_type} data ({e})") from None
            if self.decomp_type == "deflate":  # warcio's rule: deflate may come without its header,
                self._init_decomp("deflate_alt")
                return self._decompress(data)
            self.decompressor = None  # ... and data that fails at once is not compressed at all
            return data
        self._started = True
        self.inflated += len(out)
        return out

    def unfinished(self) -> bool:
        """Whether the compressed data stopped before its end (cut short)."""
        return self._started and not getattr(self.decompressor, "eof", True)


class _Body(_StrictInflate, BufferedReader):
    error = _BadEncoding


class _ChunkedBody(_StrictInflate, ChunkedDataReader):
    error = _BadEncoding


class _WarcStream(_StrictInflate, DecompressingBufferedReader):
    """A WARC/ARC file, plain or gzip, for warcio's record parser: reads stop at each gzip
    member's end (``next_member`` goes on), corrupt data raises, and the file may inflate to
    ``limit`` bytes. ``pos()`` is the offset in the current member (in the file when plain)."""

    def __init__(self, fh: IO[bytes], limit: int, inflated: int = 0):
        super().__init__(fh)
        self.limit, self.inflated, self.member_start = limit, inflated, fh.tell()

    def _decompress(self, data: bytes) -> bytes:
        out = super()._decompress(data)
        if self.inflated > self.limit:
            raise _InflateLimit(f"inflates past {self.limit} bytes")
        return out

    def pos(self) -> int:
        return self.num_block_read - (self.buff_size - self.buff.tell() if self.buff else 0)

    def check_end(self) -> None:
        """Where reads return nothing: EOFError if the file ends inside a gzip member (cut short)."""
        if self.decompressor and not self.decompressor.eof:
            raise EOFError("the file ends inside a gzip member")

    def next_member(self) -> bool:
        """At a gzip member's end, go on into the next one; False at the end of the file."""
        data = self.decompressor and (self.decompressor.unused_data or self.stream.read(self.block_size))
        if not data:
            return False  # the end, or a plain file (one stream)
        self.member_start, self.starting_data = self.stream.tell() - len(data), data
        self._init_decomp(self.decomp_type)
        return True

    def reopen(self, pos: int) -> _WarcStream:
        """A new stream at ``pos()`` = ``pos`` of the current member."""
        fh = self.stream
        plain = not self.decompressor
        fh.seek(self.member_start + pos if plain else self.member_start)
        stream = _WarcStream(fh, self.limit, self.inflated)
        while not plain and pos > 0 and (chunk := stream.read(min(pos, 1 << 20))):
            pos -= len(chunk)
        return stream


class _Block:
    """A record's block as it is read (by the payload readers, then drained), watched for a
    ``_BOUNDARY``: one inside means that its Content-Length ran over the next record."""

    def __init__(self, raw, stream: _WarcStream):
        self.raw, self.stream, self.tail, self.boundary = raw, stream, b"", None

    def read(self, n: int | None = None) -> bytes:
        return self._watch(self.raw.read, n)

    def readline(self, n: int | None = None) -> bytes:
        return self._watch(self.raw.readline, n)

    def _watch(self, read, n: int | None) -> bytes:
        start = self.stream.pos()
        data = read(n)
        if data and self.boundary is None:
            buf = self.tail + data
            i = buf.find(_BOUNDARY)
            if i >= 0:
                self.boundary = start - len(self.tail) + i + 4  # where the swallowed header starts
            self.tail = buf[1 - len(_BOUNDARY) :]
        return data

    def drain(self) -> bool:
        """Read the rest; True when the block ended short of its Content-Length."""
        while self.read(1 << 16):
            pass
        return getattr(self.raw, "limit", 0) > 0


def _is_header(line: bytes) -> bool:
    return line.startswith(b"WARC/") or _ARC_HEADER.match(line) is not None


def _after_record(stream: _WarcStream) -> bytes:
    """The next line that is not blank in the current gzip member (in a plain file: the next
    record's first line, if all is well); b"" where the member or the file ends. A long run of
    blank lines is junk: one is returned."""
    for _ in range(_MAX_BLANK_LINES):
        line = stream.readline(_MAX_HEADER_LINE)
        if not line:
            stream.check_end()
            return b""
        if line.strip():
            return line
    return b"\r\n"


def _next_header(stream: _WarcStream) -> bytes:
    """The next line that is not blank, on through gzip members; b"" at the end of the file."""
    line = _after_record(stream)
    while not line and stream.next_member():
        line = _after_record(stream)
    return line


def _find_boundary(stream: _WarcStream, seed: bytes) -> int | None:
    """The position of the next record header after a ``_BOUNDARY`` in the current member,
    reading on from ``seed`` (the bytes just read); None when the member (or file) ends first."""
    buf, base = seed, stream.pos() - len(seed)
    while (i := buf.find(_BOUNDARY)) < 0:
        chunk = stream.read(1 << 16)
        if not chunk:
            return None
        keep = buf[1 - len(_BOUNDARY) :]
        base, buf = base + len(buf) - len(keep), keep + chunk
    return base + i + 4


def _resync(stream: _WarcStream, block: _Block | None, line: bytes) -> tuple[_WarcStream, bytes]:
    """Where reading goes on after a record whose framing is broken, and the line there: the
    record header swallowed in its block; else, past junk, the next record header; else (a gzip
    member ended short) the next member's, already read."""
    if block is not None and block.boundary is not None:
        stream = stream.reopen(block.boundary)
    elif not _is_header(line):
        # The block's tail too: a length a few bytes too large cuts the boundary in two.
        pos = _find_boundary(stream, (block.tail if block else b"") + line)
        if pos is not None:
            stream = stream.reopen(pos)
    else:
        return stream, line
    return stream, _next_header(stream)


def _content(record, block: _Block):
    """``record.content_stream()`` over ``block``, with a strict inflater for Content-Encoding."""
    http = record.http_headers
    if not http:
        return block
    encoding = (http.get_header("content-encoding") or "").lower()
    encoding = encoding if encoding in BufferedReader.get_supported_decompressors() else None
    if http.get_header("transfer-encoding") == "chunked":
        return _ChunkedBody(block, decomp_type=encoding)
    return _Body(block, decomp_type=encoding) if encoding else block


def _media_type(content_type: str | None) -> tuple[str, str | None]:
    if not content_type:
        return "", None
    parts = [p.strip() for p in content_type.split(";")]
    charset = None
    for p in parts[1:]:
        if p.lower().startswith("charset="):
            charset = p.split("=", 1)[1].strip("\"' ") or None
    return parts[0].lower(), charset


def _warc_doc(record, block: _Block, f: InputFile, cfg: ReadConfig, rid: str) -> dict[str, Any] | None:
    """The row of one WARC record (its payload read), or None for a record that is no document."""
    rtype = record.rec_type
    if rtype not in _DOC_TYPES:
        count(f"read.skipped.warc_{rtype if rtype in _OTHER_TYPES else 'other'}")
        return None
    url = record.rec_headers.get_header("WARC-Target-URI")
    if rtype == "response" and record.http_headers is not None:
        status = record.http_headers.get_statuscode() or ""
        if status and not (len(status) == 3 and status.isascii() and status.isdigit()):
            return new_doc(rid, f.path, url=url, dropped_by="read:http_bad_status")
        if status and not status.startswith("2"):
            return new_doc(rid, f.path, url=url, dropped_by=f"read:http_{status}")
        ctype = record.http_headers.get_header("Content-Type")
    else:
        ctype = record.rec_headers.get_header("Content-Type")
    mtype, charset = _media_type(ctype)
    if rtype == "conversion":
        mtype = mtype or "text/plain"
    if mtype not in {t.lower() for t in cfg.warc_content_types}:  # images, PDFs, robots.txt...
        return new_doc(rid, f.path, url=url, dropped_by="read:unsupported_media_type")
    body = _content(record, block)
    try:
        payload = _read_capped(body, cfg.max_record_bytes)
        if payload is not None and isinstance(body, _StrictInflate) and body.unfinished():
            raise _BadEncoding("the body ends inside its compressed data")
    except _BadEncoding:
        return new_doc(rid, f.path, url=url, dropped_by="read:bad_content_encoding")
    if payload is None:
        return new_doc(rid, f.path, url=url, dropped_by="read:too_large")
    if mtype != "text/plain":
        return new_doc(rid, f.path, url=url, html=payload, encoding=charset)
    text, bad = _decode_text(payload, charset)
    return new_doc(rid, f.path, url=url, text=text, dropped_by=bad and f"read:{bad}")


def read_warc(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    """WARC/ARC/WET, plain or gzip (per record or whole), via warcio's record parser; the
    framing of every record is checked (see above)."""
    from warcio.exceptions import ArchiveLoadFailed
    from warcio.recordloader import ArcWarcRecordLoader

    f = unit.file
    loader = ArcWarcRecordLoader(verify_http=False, arc2warc=True)
    n = 0  # document records so far: the id of a row where a record has none
    with _open_raw(f.path) as fh:
        stream = _WarcStream(fh, _inflate_limit(f, cfg))
        try:
            line = _next_header(stream)
            if line and not _is_header(line):
                raise ArchiveLoadFailed(f"not a WARC or ARC file (first line {line[:60]!r})")
            while line:
                rid = f"{f.rel}#{n}"
                try:
                    record = loader.parse_record_stream(stream, line)
                except (ArchiveLoadFailed, ValueError, AttributeError, TypeError) as e:
                    # Headers warcio cannot take (a response without a target URI): a row, and on.
                    log.warning("read: a WARC record in %s that cannot be parsed (%s)", f.path, e)
                    yield new_doc(rid, f.path, dropped_by="read:corrupt_record")
                    n += 1
                    stream, line = _resync(stream, None, b"")
                    continue
                rid = (record.rec_headers.get_header("WARC-Record-ID") or "").strip().strip("<>") or rid
                block = record.raw_stream = _Block(record.raw_stream, stream)
                doc = _warc_doc(record, block, f, cfg, rid)
                short = block.drain()
                line = _after_record(stream)  # what follows, up to its gzip member's end
                if short and block.boundary is None and not line:  # the block ran to a member's end
                    if not stream.next_member():
                        raise EOFError("the file ends inside a record")
                    line = _next_header(stream)
                length = record.rec_headers.get_header("Content-Length") or ""
                broken = (short or block.boundary is not None or not length.strip().isdigit()
                          or (line and not _is_header(line)))
                if broken and doc is None:
                    count("read.skipped.warc_length_mismatch")  # no document: counted, as its kind is
                elif broken:
                    yield new_doc(doc["id"], f.path, url=doc["url"], dropped_by="read:warc_length_mismatch")
                elif doc is not None:
                    yield doc  # before the next member is read: its damage is not this record's
                n += doc is not None
                if broken:
                    stream, line = _resync(stream, block, line)
                elif not line:
                    line = _next_header(stream)  # the next gzip member
        except (ArchiveLoadFailed, _InflateLimit, *_STREAM_ERRORS) as e:
            yield _broken(f"{f.rel}#{n}", f, _stream_reason(e), e)  # n: the records before the break


def _read_whole(unit: Unit, cfg: ReadConfig) -> tuple[bytes | None, dict | None]:
    """The bytes of a one-document file, or a dropped doc saying why not."""
    f = unit.file
    try:
        with _open_decompressed(f) as fh:
            data = _read_capped(fh, cfg.max_record_bytes)
    except _STREAM_ERRORS as e:
        return None, _broken(f.rel, f, _stream_reason(e), e)
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
    text, bad = _decode_text(data, None)
    yield new_doc(unit.file.rel, unit.file.path, text=text, dropped_by=bad and f"read:{bad}")

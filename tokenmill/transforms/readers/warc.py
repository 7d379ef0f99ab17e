"""The WARC/ARC/WET reader: warcio's record parser, with every record's framing checked and its
HTTP body inflated strictly, so a lying Content-Length or a corrupt body costs one row."""

from __future__ import annotations

import logging
import re
import zlib
from collections.abc import Iterator
from typing import IO, Any

from warcio.bufferedreaders import BufferedReader, ChunkedDataReader, DecompressingBufferedReader

from tokenmill.config import ReadConfig
from tokenmill.transforms.doc import new_doc
from tokenmill.transforms.stage_base import count

from .inputs import InputFile
from .json_and_text import decode_text
from .streams import (
    STREAM_ERRORS,
    InflateLimit,
    broken,
    inflate_limit,
    open_raw,
    read_capped,
    stream_reason,
)
from .tasks import Unit

log = logging.getLogger("tokenmill")


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
            raise InflateLimit(f"inflates past {self.limit} bytes")
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
        payload = read_capped(body, cfg.max_record_bytes)
        if payload is not None and isinstance(body, _StrictInflate) and body.unfinished():
            raise _BadEncoding("the body ends inside its compressed data")
    except _BadEncoding:
        return new_doc(rid, f.path, url=url, dropped_by="read:bad_content_encoding")
    if payload is None:
        return new_doc(rid, f.path, url=url, dropped_by="read:too_large")
    if mtype != "text/plain":
        return new_doc(rid, f.path, url=url, html=payload, encoding=charset)
    text, bad = decode_text(payload, charset)
    return new_doc(rid, f.path, url=url, text=text, dropped_by=bad and f"read:{bad}")


def read_warc(unit: Unit, cfg: ReadConfig) -> Iterator[dict[str, Any]]:
    """WARC/ARC/WET, plain or gzip (per record or whole), via warcio's record parser; the
    framing of every record is checked (see above)."""
    from warcio.exceptions import ArchiveLoadFailed
    from warcio.recordloader import ArcWarcRecordLoader

    f = unit.file
    loader = ArcWarcRecordLoader(verify_http=False, arc2warc=True)
    n = 0  # document records so far: the id of a row where a record has none
    with open_raw(f.path) as fh:
        stream = _WarcStream(fh, inflate_limit(f, cfg))
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
                framing_broken = (short or block.boundary is not None or not length.strip().isdigit()
                                  or (line and not _is_header(line)))
                if framing_broken and doc is None:
                    count("read.skipped.warc_length_mismatch")  # no document: counted, as its kind is
                elif framing_broken:
                    yield new_doc(doc["id"], f.path, url=doc["url"], dropped_by="read:warc_length_mismatch")
                elif doc is not None:
                    yield doc  # before the next member is read: its damage is not this record's
                n += doc is not None
                if framing_broken:
                    stream, line = _resync(stream, block, line)
                elif not line:
                    line = _next_header(stream)  # the next gzip member
        except (ArchiveLoadFailed, InflateLimit, *STREAM_ERRORS) as e:
            yield broken(f"{f.rel}#{n}", f, stream_reason(e), e)  # n: the records before the break

"""Charset handling: the bytes of a page to text, as a browser would read them (BOM, strict
UTF-8, the declared charsets, then statistical detection only for undeclared legacy pages)."""

from __future__ import annotations

import codecs
import re
from functools import lru_cache

from .sniff import SNIFF, utf16_without_bom

_BOMS = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16 LE: it starts with the same two bytes
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_META_CHARSET_RE = re.compile(rb"""<meta[^>]{0,300}?charset\s*=\s*["']?\s*([a-z0-9_.:\-]+)""", re.I)
_XML_ENCODING_RE = re.compile(rb"""^\s*<\?xml[^>]{0,100}?encoding\s*=\s*["']([a-z0-9_.:\-]+)""", re.I)
# What browsers actually use for a declared label (WHATWG Encoding Standard): these labels are
# decoded as their supersets, so the bytes authors typed in those supersets decode right.
_SUPERSET = {
    "ascii": "cp1252",
    "iso8859-1": "cp1252",
    "iso8859-9": "cp1254",
    "iso8859-11": "cp874",
    "tis-620": "cp874",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "big5": "big5hkscs",
}
_EXTRA_LABELS = {
    "x-sjis": "cp932",
    "windows-31j": "cp932",
    "x-gbk": "gb18030",
    "windows-874": "cp874",
    "iso-8859-8-i": "iso8859-8",
    "x-mac-roman": "mac-roman",
    "x-cp1252": "cp1252",
}
_SINGLE_BYTE_PREFIXES = ("cp", "iso8859", "koi8", "mac-", "latin", "tis", "windows")


@lru_cache(maxsize=256)
def _codec(label: str | bytes | None) -> str | None:
    """Python codec name for a charset label, or None when unknown (or meaningless, like utf-7)."""
    if not label:
        return None
    if isinstance(label, bytes):
        label = label.decode("ascii", "ignore")
    label = label.strip().strip("\"'").lower()
    label = _EXTRA_LABELS.get(label, label)
    try:
        name = codecs.lookup(label).name
    except LookupError:
        return None
    if name in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"):
        # A <meta> that says UTF-16 in bytes we could read as ASCII is wrong (WHATWG: use UTF-8).
        return "utf-8"
    if name in _NOT_CHARSETS or "codec" in name or not _ascii_compatible(name):
        # EBCDIC (cp037, cp500) is no web charset: honoured, it turned a page into garbage text.
        return None
    return _SUPERSET.get(name, name)


# Python codecs that are no charset a page is written in (unicode-escape turned "\\n" in the
# text into a line break, idna raised on a long line); rot-13 and utf-7 are meaningless here.
_NOT_CHARSETS = frozenset(("utf-7", "rot-13", "unicode-escape", "raw-unicode-escape", "idna", "punycode", "undefined"))


def _ascii_compatible(name: str) -> bool:
    """Whether ASCII bytes decode as themselves (the markup of any page a browser can read)."""
    probe = b"<meta charset=x> a-z 0-9.\n"
    try:
        return codecs.decode(probe, name) == probe.decode("ascii")
    except Exception:  # LookupError, a codec that is not bytes-to-str
        return False


def _is_single_byte(codec: str) -> bool:
    return codec.startswith(_SINGLE_BYTE_PREFIXES) and codec not in ("cp932", "cp949", "cp950", "cp936")


# The legacy encodings the detector may choose from, most common on the web first. Restricting
# it to these keeps it from answering exotic code pages (a KOI8-R page "is" shift_jis_2004 to
# charset-normalizer's open search) and makes it several times faster.
_DETECT_CANDIDATES = [
    "cp1252",
    "cp1251",
    "cp932",
    "gb18030",
    "euc_kr",
    "euc_jp",
    "big5",
    "iso8859_2",
    "cp1250",
    "cp1254",
    "cp1253",
    "cp1256",
    "cp1255",
    "koi8_r",
    "koi8_u",
    "cp874",
    "cp1257",
    "iso8859_15",
    "cp1258",
]
_TAG_RE = re.compile(rb"<[^>]{0,2000}>")


def _detect(raw: bytes) -> str | None:
    """Statistical guess among _DETECT_CANDIDATES, on the text between the tags (markup is ASCII
    and only dilutes the evidence). Windows-1252 wins ties: charset-normalizer reports codecs
    that decode the bytes identically as one match (an English page with curly quotes "is"
    cp1250 too), and on short texts it ties with its neighbours; it is by far the most common."""
    from charset_normalizer import from_bytes  # imported lazily: only legacy undeclared pages need it

    head = raw[:400_000]
    sample = _TAG_RE.sub(b" ", head)[:100_000]
    if sample.isascii():  # the non-ASCII bytes are in attributes, or further down
        sample = head if not head.isascii() else b""
    if not sample:
        return "cp1252"
    matches = list(from_bytes(sample, cp_isolation=_DETECT_CANDIDATES))
    if not matches:
        return None

    def cost(m) -> float:
        return m.chaos + (0.0 if "cp1252" in m.could_be_from_charset else 0.1)

    best = min(matches, key=cost)
    return "cp1252" if "cp1252" in best.could_be_from_charset else _codec(best.encoding)


def decode_html(raw: bytes, encoding_hint: str | None = None) -> tuple[str, str]:
    """(text, codec name) for the bytes of a page. Order: BOM, strict UTF-8, declared, detected."""
    text, codec, _ = decode_page(raw, encoding_hint)
    return text, codec


def decode_page(
    raw: bytes, encoding_hint: str | None = None, lazy: bool = False
) -> tuple[str | None, str, bytes | None]:
    """decode_html's (text, codec name), and ``raw`` itself where it is exactly the text's UTF-8
    (strict UTF-8 without a BOM: most pages), else None, so that a parser needs no encoding.
    ``lazy``: the text is None where ``raw`` is that UTF-8 and the test made no str (the
    compiled test, 5-10x faster than decoding: the parser reads the bytes)."""
    for bom, name in _BOMS:
        if raw.startswith(bom):
            return raw[len(bom) :].decode(name, "replace"), name, None
    if lazy and (is_utf8 := _utf8_test()) is not None and is_utf8(raw):
        return None, "utf-8", raw
    try:
        return raw.decode("utf-8"), "utf-8", raw  # the fast path: most pages (and every ASCII page)
    except UnicodeDecodeError as exc:
        utf8_error_at = exc.start
    text, codec = _decode_legacy(raw, encoding_hint, utf8_error_at)
    return text, codec, None


@lru_cache(maxsize=1)
def _utf8_test():
    """accelerated.is_utf8 where the compiled module has it (a build from before it does not),
    else None. Looked up at first use: the compiled walk loads lxml."""
    from .walk import ACCELERATED

    return getattr(ACCELERATED, "is_utf8", None)


def _decode_legacy(raw: bytes, encoding_hint: str | None, utf8_error_at: int) -> tuple[str, str]:
    """decode_html for bytes that are not strict UTF-8 (the first bad byte at ``utf8_error_at``)."""
    utf16 = utf16_without_bom(raw[:SNIFF])
    if utf16:
        return raw.decode(utf16, "replace"), utf16

    head = raw[:32768]
    m = _XML_ENCODING_RE.search(head) or _META_CHARSET_RE.search(head)
    hint, meta = _codec(encoding_hint), _codec(m.group(1)) if m else None
    declared = [c for c in (hint, meta) if c]
    # Servers default to ISO-8859-1 in the header while the author's <meta> knows better.
    if hint and meta and hint != meta and hint == "cp1252":
        declared = [meta, hint]
    # A multi-byte codec that decodes the page strictly is strong evidence; a single-byte one
    # decodes almost anything, so it only counts once the multi-byte candidates have failed.
    for codec in declared:
        if codec != "utf-8" and not _is_single_byte(codec):
            try:
                return raw.decode(codec), codec
            except (UnicodeDecodeError, LookupError):
                pass
    if "utf-8" in declared or not declared:
        # UTF-8 with a stray broken byte or two (truncated or spliced pages) is still UTF-8, if
        # it also has valid multi-byte characters: a legacy page with two accents has none.
        text = raw.decode("utf-8", "replace")
        bad = text.count("\ufffd")
        good = len(text) - len(text.encode("ascii", "ignore")) - bad
        if (bad <= 3 or bad < 0.001 * len(text)) and good > 2 * bad:
            return text, "utf-8"
    single = [c for c in declared if _is_single_byte(c)]
    if meta and meta in single:
        return raw.decode(meta, "replace"), meta  # the author's own declaration
    detected = None
    try:
        detected = _detect(raw)
    except Exception:  # detection is best effort
        pass
    if single:
        # A header's single-byte charset is often a server default: believe a multi-byte
        # detection over it only if that decodes the page cleanly.
        if detected and not _is_single_byte(detected) and detected != "utf-8":
            try:
                return raw.decode(detected), detected
            except UnicodeDecodeError:
                pass
        return raw.decode(single[0], "replace"), single[0]
    codec = detected or "cp1252"
    if codec == "utf-8" and utf8_error_at < len(raw):
        codec = "cp1252"  # strict UTF-8 already failed above
    return raw.decode(codec, "replace"), codec

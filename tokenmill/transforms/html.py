"""HTML main-text extraction: the pure core of the pipeline's html stage.

``extract_html(raw)`` turns one page (bytes or str) into its main text: one line per paragraph,
heading, list item or table row, with menus, headers, footers, sidebars, cookie banners,
comments, share widgets and related-article lists left out. It never raises: a page it cannot
use comes back with ``text=None`` and a short ``reason``.

How it works, and why this way (every choice was measured with bench/extraction.py):

1. Sniff and decode. Binary junk is refused by magic numbers and control-byte ratio. Bytes are
   decoded by BOM, then strict UTF-8 (most of the web, and the cheapest test), then the declared
   charsets (HTTP header hint, <meta>), and only then statistical detection (charset-normalizer),
   which costs milliseconds and is needed only for undeclared legacy pages.
2. Parse with lxml's libxml2 HTML parser (about 1 ms for a 150 KB news page, ~50x faster than
   building a BeautifulSoup tree). libxml2 stops at a nesting depth of 2048 even with
   huge_tree; such pages are re-parsed by a flat tokenizer (the stdlib's html.parser) into a tree
   capped in depth, so nothing here ever recurses over the tree.
3. Walk the tree once, iteratively (lxml.etree.iterwalk), into "nodes" (block-level elements:
   tag, parent, class/id hints) and "blocks" (runs of text between block boundaries, with their
   link-text share). Everything afterwards works on these flat lists.
4. Choose the main content like Readability does: paragraphs score their ancestors (length,
   commas), scores are damped by link density and by class/id name hints, the best node is
   widened to ancestors and siblings that look like article text (and to the lead and
   subheadings of its <article>), and inside it, link-heavy or negatively named boxes are
   removed. If that yields too little text, retry with fewer filters. Class names are "hard"
   (comments, cookie banners, share bars: always out) or "soft" (sidebar, nav, ad: out unless
   the box holds real prose, since layout wrappers are often named so).

Pure functions; no signals (Beam runs DoFns in threads): a cooperative deadline is checked
while walking and scoring.
"""

from __future__ import annotations

import codecs
import re
import time
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from html.parser import HTMLParser as _StdlibTokenizer

from lxml import etree


@dataclass
class Extracted:
    # The main text, one line per paragraph / heading / list item / table row; None when dropped.
    text: str | None
    # None on success, else "too_large", "timeout", "binary_content", "no_text" or "parse_error".
    reason: str | None
    title: str | None = None
    # The encoding that was used to decode the bytes (None for str input).
    encoding: str | None = None


class _Timeout(Exception):
    pass


def _check(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise _Timeout


# --------------------------------------------------------------------------- binary sniffing

# File signatures of formats that are sometimes served or stored as text/html.
_MAGIC = (
    b"\x89PNG",
    b"%PDF",
    b"PK\x03\x04",
    b"PK\x05\x06",
    b"GIF87a",
    b"GIF89a",
    b"\xff\xd8\xff",
    b"\x1f\x8b",
    b"BZh",
    b"\xfd7zXZ\x00",
    b"7z\xbc\xaf",
    b"Rar!",
    b"\x28\xb5\x2f\xfd",
    b"OggS",
    b"ID3",
    b"fLaC",
    b"RIFF",
    b"\x7fELF",
    b"\x00asm",
    b"wOFF",
    b"wOF2",
    b"\xca\xfe\xba\xbe",
    b"%!PS",
    b"II*\x00",
    b"MM\x00*",
    b"\xd0\xcf\x11\xe0",
    b"\x00\x00\x01\x00",
    b"SQLite format",
)
# C0 controls that do not occur in text: everything below 0x20 except \t \n \v \f \r and ESC
# (ESC is how ISO-2022-JP switches character sets).
_CONTROL_BYTES = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13, 27))
_CONTROL_CHARS_RE = re.compile("[\x00-\x08\x0e-\x1a\x1c-\x1f]")
_SNIFF = 8192


def _utf16_without_bom(sample: bytes) -> str | None:
    """'utf-16-le'/'utf-16-be' when the NULs sit on every other byte, as in UTF-16 ASCII text."""
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    half = len(sample) // 2
    if half and odd > 0.7 * half and even < 0.05 * half:
        return "utf-16-le"
    if half and even > 0.7 * half and odd < 0.05 * half:
        return "utf-16-be"
    return None


def _looks_binary(raw: bytes) -> bool:
    head = raw[:_SNIFF]
    if head.startswith(_MAGIC) or head[4:12] in (b"ftypisom", b"ftypmp42", b"ftypM4A "):
        return True
    n_control = len(head) - len(head.translate(None, _CONTROL_BYTES))
    # Real HTML has practically none; random or compressed bytes have ~12%.
    return n_control > max(8, 0.01 * len(head)) and _utf16_without_bom(head) is None


def _looks_binary_text(text: str) -> bool:
    head = text[:_SNIFF]
    return len(_CONTROL_CHARS_RE.findall(head)) > max(8, 0.01 * len(head))


# --------------------------------------------------------------------------- decoding

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
    for bom, name in _BOMS:
        if raw.startswith(bom):
            return raw[len(bom) :].decode(name, "replace"), name
    try:
        return raw.decode("utf-8"), "utf-8"  # the fast path: most pages (and every ASCII page)
    except UnicodeDecodeError as exc:
        utf8_error_at = exc.start
    utf16 = _utf16_without_bom(raw[:_SNIFF])
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


# --------------------------------------------------------------------------- parsing

_MAX_FLAT_DEPTH = 512  # the depth the fallback tree is capped at
_VOID = frozenset("area base br col embed hr img input link meta param source track wbr keygen".split())


class _FlatTreeBuilder(_StdlibTokenizer):
    """Builds an lxml tree from a flat tag stream, never nesting deeper than _MAX_FLAT_DEPTH.

    Used only when libxml2 gives up on a page (its depth limit); it has no recursion anywhere:
    the tokenizer is flat and the open elements are an explicit stack. Tags opened beyond the
    cap are not created (their text goes to the deepest element, block tags as a line break).
    Everything is linear in the input: the last child of each open element is remembered (lxml's
    len() and [-1] walk the children) and text is joined once, when the next tag comes.
    """

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = etree.Element("html")
        self.stack = [self.root]  # open elements
        self.last = [None]  # the last child of each open element
        self.pending: list[str] = []  # text since the last tag
        self.overflow = 0  # tags opened beyond the cap and not yet closed

    def _flush_text(self) -> None:
        if self.pending:
            text = "".join(self.pending).translate(_XML_UNSAFE)
            self.pending.clear()
            last = self.last[-1]
            if last is None:
                self.stack[-1].text = (self.stack[-1].text or "") + text
            else:
                last.tail = (last.tail or "") + text

    def _child(self, tag: str) -> etree._Element:
        self._flush_text()
        el = etree.SubElement(self.stack[-1], tag)
        self.last[-1] = el
        return el

    def _pop_to(self, k: int) -> None:
        self._flush_text()
        del self.stack[k:]
        del self.last[k:]

    def handle_starttag(self, tag, attrs):
        if not _TAG_OK.match(tag) or (
            tag in ("html", "head", "body") and any(el.tag == tag for el in self.stack[:3])
        ):
            return
        if tag in _VOID:
            if tag == "br":
                self._child("br")
            return
        if tag in ("p", "li", "dt", "dd", "tr", "td", "th", "option") and self.overflow == 0:
            # The implicit end tags that matter for depth: a new <p>/<li>/<td> closes the last one.
            for k in range(len(self.stack) - 1, max(0, len(self.stack) - 4), -1):
                if self.stack[k].tag == tag:
                    self._pop_to(k)
                    break
        if len(self.stack) >= _MAX_FLAT_DEPTH:
            self.overflow += 1
            if tag not in _INLINE:
                self._child("br")
            return
        el = self._child(tag)
        for k, v in attrs:
            if k in ("class", "id", "style", "hidden", "role", "aria-hidden", "itemprop"):
                el.set(k, (v or "").translate(_XML_UNSAFE))
        self.stack.append(el)
        self.last.append(None)

    def handle_startendtag(self, tag, attrs):
        if tag == "br":
            self._child("br")

    def handle_endtag(self, tag):
        if self.overflow:
            self.overflow -= 1
            return
        for k in range(len(self.stack) - 1, 0, -1):
            if self.stack[k].tag == tag:
                self._pop_to(k)
                return

    def handle_data(self, data):
        self.pending.append(data)

    def close(self):
        super().close()
        self._flush_text()


_TAG_OK = re.compile(r"^[a-z][a-z0-9_.-]*$")  # names lxml accepts (no namespace prefixes)
# Control characters lxml refuses in text and attributes: dropped (NUL) or made spaces.
_XML_UNSAFE = {c: " " for c in (*range(1, 9), 11, 12, *range(14, 32))} | {0: None}


def _parse_flat(text: str, deadline: float) -> etree._Element:
    builder = _FlatTreeBuilder()
    for i in range(0, len(text), 65536):
        builder.feed(text[i : i + 65536])
        _check(deadline)
    builder.close()
    return builder.root


# libxml2 checks each attribute of a tag against all earlier ones: parse time grows with the
# square of a tag's attribute count (40,000 attributes: 11 s), in C, where no deadline reaches.
# So a tag's attributes are capped before parsing. The patterns follow the HTML5 tokenizer (which
# libxml2 >= 2.14 implements): a quote opens a value only after "=", so a tag ends where libxml2
# ends it. Every quantifier is possessive and the sweep is one anchored match, so the scan is
# linear whatever the input (~2 ns/byte); real pages never reach the cap.
_MAX_ATTRS = 1000
_WS = rb"\t\n\f\r "
_ATTR = rb"(?:[%s/]*+[^%s/>][^%s/>=]*+(?:[%s]*+=[%s]*+(?:\"[^\"]*+\"?|'[^']*+'?|[^%s>]++))?+)" % ((_WS,) * 6)
_TAG_HEAD = rb"<[A-Za-z][^%s/>]*+" % _WS
# Skips tags under the cap and all other text; group 1 is the first tag at the cap, if any.
_SWEEP = re.compile(rb"(?:%s%s{0,%d}+(?!%s)|[^<]++|<(?![A-Za-z]))*+(?:(%s%s{%d})|\Z)" % (
    _TAG_HEAD, _ATTR, _MAX_ATTRS - 1, _ATTR, _TAG_HEAD, _ATTR, _MAX_ATTRS))
_TAG_ATTRS = re.compile(rb"(%s%s{0,%d}+)%s*+" % (_TAG_HEAD, _ATTR, _MAX_ATTRS, _ATTR))


def _cap_attributes(data: bytes) -> bytes:
    """``data`` with every tag cut to its first _MAX_ATTRS attributes (the tag's ">" is kept)."""
    if _SWEEP.match(data).group(1) is None:
        return data
    return _TAG_ATTRS.sub(rb"\1", data)


def _parse(text: str, deadline: float) -> etree._Element | None:
    parser = etree.HTMLParser(
        remove_comments=True,
        remove_pis=True,
        huge_tree=True,
        no_network=True,
        collect_ids=False,
        encoding="utf-8",
    )
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates in a str input
        data = text.encode("utf-8", "replace")
    data = _cap_attributes(data)
    # Bytes rather than str: lxml refuses str input that carries an XML encoding declaration.
    root = etree.fromstring(data, parser)
    if any(e.level_name == "FATAL" for e in parser.error_log):
        # libxml2 stopped early (in practice: nesting deeper than 2048) and dropped the rest.
        _check(deadline)
        root = _parse_flat(text, deadline)
    return root


# --------------------------------------------------------------------------- the walk

# Removed with their subtree before the walk (their tail text is kept). Forms are not here:
# ASP.NET pages wrap the whole page in one. Nor are <nav>, <aside> and <footer>: broken markup
# sometimes leaves the whole page inside one, so they are only "unlikely" (see _CHROME_TAGS).
_JUNK_TAGS = (
    *"""script style noscript template iframe frame frameset svg math canvas object embed applet video
    audio source track picture img map area button input select option optgroup textarea datalist output
    progress meter dialog link meta base head search figcaption""".split(),
    etree.Comment,
    etree.ProcessingInstruction,
)
# Inline tags: they never break a line. Everything else (including unknown / custom elements,
# which are nearly always containers) is a block.
_INLINE = frozenset(
    "a abbr acronym b bdi bdo big blink cite code data del dfn em font i ins kbd label mark nobr q "
    "rp rt rtc ruby s samp small span strike strong sub sup time tt u var wbr br".split()
)
_HEADINGS = frozenset("h1 h2 h3 h4 h5 h6".split())
_CHROME_TAGS = frozenset("nav menu aside footer".split())
# Blocks whose text Readability scores as a paragraph: the score goes to the element's parent.
_PARAGRAPH_TAGS = frozenset("p pre td h2 h3 h4 h5 h6 blockquote".split())
# Blocks that are never scored as paragraphs (list items, cells of layout, captions, headers).
_UNSCORED_TAGS = frozenset(
    "li dd dt th h1 ul ol dl table tbody thead tfoot tr caption figcaption legend header form".split()
)
# Readability's starting score of a candidate, by tag (plus 5 for <article> and <main>, which
# Readability leaves at 0: they are containers of content by definition).
_CANDIDATE_BASE = {
    **dict.fromkeys(("div", "article", "main"), 5),
    **dict.fromkeys(("pre", "td", "blockquote"), 3),
    **dict.fromkeys(("address", "ol", "ul", "dl", "dd", "dt", "li", "form"), -3),
    **dict.fromkeys(("header", "th", "h1", "h2", "h3", "h4", "h5", "h6"), -5),
}
_CLEAN_TAGS = frozenset("div section ul ol dl table form fieldset header figure details center".split())

_HIDDEN_STYLE_RE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)


def _is_hidden_style(style: str) -> bool:
    return ("none" in style or "hidden" in style) and _HIDDEN_STYLE_RE.search(style) is not None


_HIDDEN_CLASSES = frozenset(
    "hidden hide d-none sr-only visually-hidden visuallyhidden screen-reader-text screenreader-only "
    "screen-reader-only element-invisible invisible is-hidden u-hidden a11y-hidden".split()
)
_UNLIKELY_ROLES = frozenset(
    "navigation menu menubar menuitem complementary banner contentinfo dialog alertdialog search toolbar "
    "tablist tooltip".split()
)
_POSITIVE_ITEMPROP = re.compile(r"articleBody|reviewBody|text", re.I)


# Class/id hints, in the spirit of Readability's lists, extended with today's consent,
# newsletter and recommendation widgets. Long words match anywhere in a lower-cased class name
# or id (one literal alternation: ~10x faster than a re.I pattern with lookarounds); short words
# must be a whole word of kebab/snake case, so that "ad" does not hit "header" or "load".
class _Words:
    __slots__ = ("parts", "words")

    def __init__(self, parts: str, words: str = ""):
        # One alternation of plain literals: the regex engine scans the name once.
        self.parts = re.compile("|".join(re.escape(p) for p in parts.split()))
        self.words = frozenset(words.split())

    def match(self, low: str, tokens: frozenset[str]) -> bool:
        return not tokens.isdisjoint(self.words) or self.parts.search(low) is not None


_TOKEN_SPLIT_RE = re.compile(r"[\s_-]+")
# "Hard" names: boxes whose text can look like prose but never is the page's content.
_BOILERPLATE = _Words(
    "agegate comment consent cookie disqus gdpr newsletter outbrain popup modal related "
    "lightbox replies shoutbox social taboola subscribe signup sign-up recommend caption credit",
    "share sharing sharebar",
)
# "Soft" names: usually chrome, but also used for layout wrappers ("has-sidebar", "nav-open"),
# so they only count for boxes without much prose of their own.
_UNLIKELY = _Words(
    "banner breadcrumb combx community cover-wrap extra footer legends menu pagination remark rss "
    "sidebar skyscraper supplemental yom-remote trending toolbar tooltip more-stories read-more also-read "
    "author-bio byline dateline postmeta entry-meta post-meta metadata copyright timestamp "
    # Ads are soft: a box named "ad" with paragraphs of prose is Spanish "cuerpo-ad" or similar.
    "-ad- ad-break advert sponsor promo",
    "nav navbar navigation pager masthead header topbar readmore tag tags overlay meta date ad ads",
)
_MAYBE = _Words("and article body column content main mathjax shadow entry story post-text text-content")
_NEGATIVE = _Words(
    "-ad- hidden banner combx comment com- contact footer gdpr masthead media meta outbrain promo related "
    "scroll share shoutbox sidebar skyscraper sponsor shopping tags widget cookie consent newsletter "
    "subscribe social taboola recommend byline author caption credit breadcrumb teaser toolbar",
    "hid ad ads nav menu header",
)
_POSITIVE = _Words(
    "article body content entry hentry h-entry main page pagination post text blog story prose"
)
# An <article> or <main> is the content unless it is one of many (comments, teasers).
_UNLIKELY_ARTICLE_RE = re.compile(r"comment|repl(?:y|ies)|related|recommend|teaser|card", re.I)
# WordPress and friends list the post's tags and categories as classes ("tag-social-media").
_TAXONOMY_PREFIXES = ("tag-", "category-", "categories-", "topic-")
_H_MAYBE, _H_BOILERPLATE, _H_UNLIKELY, _H_NEGATIVE, _H_POSITIVE = 1, 2, 4, 8, 16


def _name_hints(name: str) -> int:
    """The hint bits of one class name or id."""
    if _DIGIT_RE.search(name):  # "post-123", "comment-949999": one cache entry for all of them
        name = _DIGIT_RE.sub("0", name)
    return _name_hints_cached(name)


_DIGIT_RE = re.compile(r"\d+")


@lru_cache(maxsize=65536)
def _name_hints_cached(name: str) -> int:
    """Cached: pages and sites reuse their names."""
    low = name.lower()
    tokens = frozenset(_TOKEN_SPLIT_RE.split(low))
    bits = 0
    for bit, words in (
        (_H_MAYBE, _MAYBE),
        (_H_BOILERPLATE, _BOILERPLATE),
        (_H_UNLIKELY, _UNLIKELY),
        (_H_NEGATIVE, _NEGATIVE),
        (_H_POSITIVE, _POSITIVE),
    ):
        if words.match(low, tokens):
            bits |= bit
    return bits


@lru_cache(maxsize=8192)
def _hints(class_: str, id_: str) -> tuple[int, int]:
    """(unlikely flags, Readability-style class weight) for an element's class and id."""
    class_bits = 0
    for name in class_.split():
        if not name.startswith(_TAXONOMY_PREFIXES):
            class_bits |= _name_hints(name)
    id_bits = _name_hints(id_) if id_ else 0
    if id_bits and len(_TOKEN_SPLIT_RE.split(id_)) >= 4:
        # An id of four or more words is mostly an anchor made from a heading's text
        # ("sharing-with-a-single-developer"): its good words count, its bad ones do not.
        id_bits &= _H_MAYBE | _H_POSITIVE
    both = class_bits | id_bits
    unlikely = 0
    if not both & _H_MAYBE:
        if both & _H_BOILERPLATE:
            unlikely = _F_BOILERPLATE
        elif both & _H_UNLIKELY:
            unlikely = _F_UNLIKELY
    weight = 0
    for bits in (class_bits, id_bits):
        if bits & _H_NEGATIVE:
            weight -= 25
        if bits & _H_POSITIVE:
            weight += 25
    return unlikely, weight


# Node flags
_F_UNLIKELY = 1  # a "soft" negative class/id/role: excluded unless it holds much prose
_F_BOILERPLATE = 2  # a "hard" negative class/id: excluded unless it holds the <article>
_F_POSITIVE = 4  # schema.org articleBody and the like
_F_ANY_UNLIKELY = _F_UNLIKELY | _F_BOILERPLATE


class _Page:
    """The flat result of the walk: block-level elements ("nodes", in document order, so a
    parent always has a smaller index than its children) and runs of text ("blocks")."""

    __slots__ = (
        "tag",
        "parent",
        "end",
        "weight",
        "flags",
        "cls",
        "b_text",
        "b_node",
        "b_len",
        "b_link",
        "b_commas",
        "b_points",
    )

    def __init__(self):
        self.tag: list[str] = []
        self.parent: list[int] = []
        self.end: list[int] = []  # last node index inside this node's subtree
        self.weight: list[int] = []
        self.flags: list[int] = []
        self.cls: list[str] = []
        self.b_text: list[str] = []  # normalised text; "\n" where a <br> broke the line
        self.b_node: list[int] = []  # the innermost block element the text sits in
        self.b_len: list[int] = []
        self.b_link: list[float] = []  # characters of link text in the block
        self.b_commas: list[int] = []
        self.b_points: list[float] = []  # Readability's paragraph score (0 below 25 characters)


_BR = "\x00"  # marks a <br> (or a newline inside <pre>) in the raw text; real NULs are removed


_LENGTH_CAP = 3


def _commas(text: str) -> int:
    """Commas of prose: followed by a space in alphabetic scripts ("1,5" and "a,b,c" lists of a
    rating widget are not prose), bare in CJK."""
    return text.count(", ") + text.count("，") + text.count("、") + text.count("، ")


def _paragraph_points(text: str) -> float:
    """Readability's score of a paragraph: 1 + (commas + 1) + one per 100 characters, at most 3."""
    n = len(text)
    if n < 25:
        return 0
    return 2 + _commas(text) + min(n // 100, _LENGTH_CAP)


def _walk(top: etree._Element, deadline: float) -> _Page:
    pg = _Page()
    tags, parents, ends, weights, flags, classes = pg.tag, pg.parent, pg.end, pg.weight, pg.flags, pg.cls
    b_text, b_node, b_len, b_link, b_commas = pg.b_text, pg.b_node, pg.b_len, pg.b_link, pg.b_commas
    b_points = pg.b_points
    stack: list[int] = []
    cur = -1  # the node that text currently belongs to
    buf: list[str] = []
    raw_len = link_len = 0
    link_depth = pre_depth = 0
    skipping = None  # the element whose subtree is being skipped (its "end" event still comes)

    def flush() -> None:
        nonlocal raw_len, link_len
        text = "".join(buf)
        buf.clear()
        if _BR in text:
            text = "\n".join(filter(None, (" ".join(part.split()) for part in text.split(_BR))))
        else:
            text = " ".join(text.split())
        if text:
            n = len(text)
            b_text.append(text)
            b_node.append(cur)
            b_len.append(n)
            b_link.append(n * link_len / raw_len if raw_len else 0.0)
            commas = _commas(text)
            b_commas.append(commas)
            if "\n" in text:
                # Lines split by <br> are paragraphs of their own (Readability turns <br><br> into
                # <p>), or a long <br>-formatted text would score like one short paragraph.
                b_points.append(sum(_paragraph_points(line) for line in text.split("\n")))
            else:
                b_points.append(2 + commas + min(n // 100, _LENGTH_CAP) if n >= 25 else 0)
        raw_len = link_len = 0

    def add_text(t: str) -> None:
        """Text (or tail) of an element into the current block; <pre> keeps its line breaks."""
        nonlocal raw_len, link_len
        if pre_depth:
            t = t.replace("\n", _BR)
        buf.append(t)
        raw_len += len(t)
        if link_depth:
            link_len += len(t)

    walker = etree.iterwalk(top, events=("start", "end"))
    count = 0
    for event, el in walker:
        count += 1
        if not count & 255:
            _check(deadline)
        if event == "start":
            tag = el.tag
            unlikely = 0
            weight = 0
            flag = 0
            cls = ""
            keys = el.keys()  # the cheapest look at the attributes; most elements have one or none
            if keys:
                if "class" in keys:
                    cls = el.get("class")
                # A heading's id is an anchor made of its text ("nav_..." in heise's TOC ids).
                id_ = el.get("id") if "id" in keys and tag not in _HEADINGS else ""
                if (
                    "hidden" in keys
                    or ("aria-hidden" in keys and el.get("aria-hidden") == "true")
                    or ("style" in keys and _is_hidden_style(el.get("style")))
                    or (cls and not _HIDDEN_CLASSES.isdisjoint(cls.split()))
                ):
                    if buf and tag not in _INLINE:
                        flush()
                    walker.skip_subtree()
                    skipping = el
                    continue
                if (cls or id_) and tag != "a":  # links are never skipped for their names
                    unlikely, weight = _hints(cls, id_)
                if "role" in keys and el.get("role") in _UNLIKELY_ROLES:
                    unlikely |= _F_UNLIKELY
                if "itemprop" in keys and _POSITIVE_ITEMPROP.search(el.get("itemprop")):
                    flag |= _F_POSITIVE
                    weight += 25
                    unlikely = 0
            if tag in _CHROME_TAGS:
                unlikely |= _F_UNLIKELY
            if unlikely and (
                not stack or (tag in ("article", "main") and not _UNLIKELY_ARTICLE_RE.search(cls))
            ):
                unlikely = 0  # the page itself and semantic content containers are never unlikely
            if tag in _INLINE:
                if tag == "br":
                    buf.append(_BR)
                    continue
                if unlikely & _F_BOILERPLATE:  # e.g. <span class="share-count">
                    walker.skip_subtree()
                    skipping = el
                    continue
                if tag == "a":
                    link_depth += 1
                if el.text:
                    add_text(el.text)
                continue
            if buf:
                flush()
            i = len(tags)
            tags.append(tag)
            parents.append(cur)
            ends.append(i)
            weights.append(weight)
            flags.append(flag | unlikely)
            classes.append(cls)
            stack.append(i)
            cur = i
            if tag == "pre":
                pre_depth += 1
            if el.text:
                add_text(el.text)
        else:
            if el is skipping:
                skipping = None
            else:
                tag = el.tag
                if tag in _INLINE:
                    if tag == "a":
                        link_depth -= 1
                else:
                    if buf:
                        flush()
                    ends[cur] = len(tags) - 1
                    stack.pop()
                    if tag == "pre":
                        pre_depth -= 1
                    cur = stack[-1] if stack else -1
            if el is top:
                break
            if el.tail:
                add_text(el.tail)
    if buf and cur >= 0:
        flush()
    return pg


# --------------------------------------------------------------------------- choosing the content

# Less text than this means "try again with fewer filters" (Readability uses 500; measured, 200
# keeps short articles from being swapped for their page's boilerplate).
_CHAR_THRESHOLD = 200
_MUCH_PROSE = 400  # characters of long, link-free paragraphs that make a softly unlikely box content
_NEAR_BEST = 0.8  # an ancestor scoring this share of the best node's score replaces it
_ARTICLE_MAX_LD = 0.3  # an <article> more link-heavy than this is a list of teasers, not the article
_LEAD_MIN = 80  # shortest paragraph taken from the article's lead (shorter: bylines, dates, kickers)
_SENTENCE_END_RE = re.compile(r"[.!?。！？](?:\s|$)")


class _Aggregates:
    """Per-node sums over the subtree, leaving out excluded nodes."""

    __slots__ = ("excluded", "text", "link", "commas", "n_p", "n_li", "heading", "listed", "children")

    def __init__(self, pg: _Page, strip_unlikely: bool):
        n = len(pg.tag)
        tags, parents, flags = pg.tag, pg.parent, pg.flags
        unlikely = [bool(f & _F_ANY_UNLIKELY) for f in flags] if strip_unlikely else [False] * n
        if strip_unlikely:
            # A wrapper named "has-sidebar" or "nav-container" that holds the <article> is layout,
            # not a sidebar: an unlikely node that contains a likely content container is kept,
            # and so is a softly unlikely one that holds much of the page's prose.
            holds_content = [False] * n
            prose = [0] * n
            for node, length, ln in zip(pg.b_node, pg.b_len, pg.b_link, strict=True):
                if length >= 100 and ln < 0.2 * length:
                    prose[node] += length
            for i in range(n - 1, 0, -1):
                p = parents[i]
                prose[p] += prose[i]
                if holds_content[i] or (
                    not unlikely[i] and (tags[i] in ("article", "main") or flags[i] & _F_POSITIVE)
                ):
                    holds_content[p] = True
            for i in range(n):
                if unlikely[i] and (
                    holds_content[i] or (not flags[i] & _F_BOILERPLATE and prose[i] >= _MUCH_PROSE)
                ):
                    unlikely[i] = False
        excluded = [False] * n
        for i in range(n):
            p = parents[i]
            excluded[i] = (p >= 0 and excluded[p]) or unlikely[i]
        text = [0] * n
        link = [0.0] * n
        commas = [0] * n
        heading = [0] * n
        for node, length, ln, cm in zip(pg.b_node, pg.b_len, pg.b_link, pg.b_commas, strict=True):
            if not excluded[node]:
                text[node] += length
                link[node] += ln
                commas[node] += cm
                if tags[node] in _HEADINGS:
                    heading[node] += length
        n_p = [0] * n
        n_li = [0] * n
        listed = [0] * n
        children = [0] * n
        for i in range(n - 1, 0, -1):  # reverse document order: children before parents
            if excluded[i]:
                continue
            p = parents[i]
            if p < 0:
                continue
            tag = tags[i]
            text[p] += text[i]
            link[p] += link[i]
            commas[p] += commas[i]
            heading[p] += heading[i]
            n_p[p] += n_p[i] + (tag == "p")
            n_li[p] += n_li[i] + (tag == "li")
            listed[p] += text[i] if tag in ("ul", "ol") else listed[i]
            children[p] += 1
        self.excluded, self.text, self.link, self.commas = excluded, text, link, commas
        self.n_p, self.n_li, self.heading, self.listed, self.children = n_p, n_li, heading, listed, children

    def link_density(self, i: int) -> float:
        t = self.text[i]
        return self.link[i] / t if t else 0.0


def _score(pg: _Page, ag: _Aggregates, use_weights: bool, deadline: float) -> dict[int, float]:
    """Readability's scores: every paragraph of 25+ characters gives 1 + commas + length/100 (at
    most 3) to its parent in full, its grandparent half, and further ancestors a third of that
    per level; every scored node starts from a tag bonus and its class weight."""
    tags, parents, weights, excluded = pg.tag, pg.parent, pg.weight, ag.excluded
    scores: dict[int, float] = {}
    for j, (node, points) in enumerate(zip(pg.b_node, pg.b_points, strict=True)):
        if not points or excluded[node]:
            continue
        tag = tags[node]
        if tag in _UNSCORED_TAGS:
            continue
        if not j & 255:
            _check(deadline)
        # Text directly in a <div> counts as an implicit paragraph inside that div.
        anc = parents[node] if tag in _PARAGRAPH_TAGS else node
        level = 0
        while anc >= 0 and level < 5:
            if anc not in scores:
                scores[anc] = _CANDIDATE_BASE.get(tags[anc], 0) + (weights[anc] if use_weights else 0)
            scores[anc] += points / (1 if level == 0 else 2 if level == 1 else level * 3)
            anc = parents[anc]
            level += 1
    for c in scores:
        scores[c] *= 1.0 - ag.link_density(c)
    return scores


def _ancestors(pg: _Page, i: int) -> list[int]:
    out = []
    p = pg.parent[i]
    while p >= 0:
        out.append(p)
        p = pg.parent[p]
    return out


def _choose(pg: _Page, ag: _Aggregates, scores: dict[int, float]) -> tuple[int, set[int], int, int]:
    """(parent of the content, the chosen children of that parent, best-scored candidate, the
    <article> whose part before the content is its lead, or -1)."""
    parents = pg.parent
    root = 0
    ranked = sorted((c for c in scores if c != root), key=scores.__getitem__, reverse=True)
    if not ranked or scores[ranked[0]] <= 0:
        return -1, {root}, root, -1
    top = best = ranked[0]
    top_score = scores[top]
    # Several near-best candidates under one ancestor: the article is split in sections; take
    # the ancestor that holds at least three of them.
    alternatives = [set(_ancestors(pg, c)) for c in ranked[1:5] if scores[c] >= 0.75 * top_score]
    if len(alternatives) >= 3:
        p = parents[top]
        while p > root:
            if sum(p in a for a in alternatives) >= 3:
                top = p
                break
            p = parents[p]
    # Climb while the parent's score holds up: the content may be split over sibling divs.
    last = scores.get(top, 0.0)
    threshold = last / 3
    p = parents[top]
    while p > root:
        if p not in scores:
            p = parents[p]
            continue
        if scores[p] < threshold:
            break
        if scores[p] > last:
            top = p
            break
        last = scores[p]
        p = parents[p]
    # An ancestor that scores nearly as well holds more of the article (the best node was a
    # big table or a section inside it).
    near = _NEAR_BEST * scores.get(top, top_score)
    for p in _ancestors(pg, top):
        if p <= root:
            break
        if scores.get(p, 0.0) >= near:
            top = p
    # An only child says nothing more than its parent.
    while parents[top] > root and ag.children[parents[top]] == 1:
        top = parents[top]
    top_score = scores.get(top, top_score)

    # The <article> around the content also holds its lead paragraph and first subheadings,
    # which often sit in boxes of their own before the body: those come along (what follows
    # the body inside the article is mostly tags, share bars and newsletter boxes).
    lead = -1
    a = parents[top]
    while a > root and pg.tag[a] != "article":
        a = parents[a]
    if a > root and not ag.excluded[a] and ag.link_density(a) < _ARTICLE_MAX_LD:
        lead = a
    parent = parents[top]
    chosen = {top}
    if parent < 0:
        return -1, chosen, best, lead
    threshold = max(10.0, top_score * 0.2)
    top_cls = pg.cls[top]
    own_text: dict[int, list[str]] | None = None
    for s in range(parent + 1, pg.end[parent] + 1):
        if parents[s] != parent or s == top or ag.excluded[s]:
            continue
        bonus = top_score * 0.2 if top_cls and pg.cls[s] == top_cls else 0.0
        if s in scores and scores[s] + bonus >= threshold:
            chosen.add(s)
        elif pg.tag[s] == "p":
            if own_text is None:  # built once, only when needed: the text of each node
                own_text = {}
                for t, node in zip(pg.b_text, pg.b_node, strict=True):
                    own_text.setdefault(node, []).append(t)
            if _looks_like_prose(ag.text[s], ag.link_density(s), " ".join(own_text.get(s, ()))):
                chosen.add(s)
    return parent, chosen, best, lead


def _looks_like_prose(length: int, link_density: float, text: str) -> bool:
    """Readability's test for a sibling paragraph: long with few links, or short, link-free and
    ending a sentence."""
    if length > 80:
        return link_density < 0.25
    return 0 < length and link_density == 0 and _SENTENCE_END_RE.search(text) is not None


def _clean(
    pg: _Page,
    ag: _Aggregates,
    scores: dict[int, float],
    chosen: set[int],
    keep: set[int],
    inside: list[bool],
    use_weights: bool,
) -> list[bool]:
    """Readability's "clean conditionally": inside the content, drop boxes that look like
    navigation, share bars, link lists or forms. Returns the dropped flag per node (inherited)."""
    n = len(pg.tag)
    tags, parents, weights = pg.tag, pg.parent, pg.weight
    dropped = [False] * n
    # A box that holds most of the content is the content (a link-rich post, a body in a
    # "widget" wrapper), whatever its name or link density.
    most = 0.6 * sum(ag.text[c] for c in chosen)
    for i in range(n):
        if not inside[i] or i in keep or ag.excluded[i]:
            continue
        p = parents[i]
        if dropped[p]:
            dropped[i] = True
            continue
        if ag.text[i] >= most:
            continue
        tag = tags[i]
        weight = weights[i] if use_weights else 0
        if tag in _HEADINGS:
            # Headings named like boilerplate ("Related", "Comments") go; real ones stay.
            dropped[i] = weight < 0 or ag.link_density(i) > 0.5
            continue
        if tag not in _CLEAN_TAGS and "-" not in tag:
            continue
        if weight + scores.get(i, 0.0) < 0:
            dropped[i] = True
            continue
        if ag.commas[i] >= 10:
            continue
        length = ag.text[i]
        ld = ag.link_density(i)
        is_list = tag in ("ul", "ol") or (length and ag.listed[i] / length > 0.9)
        n_p = ag.n_p[i]
        heading_density = ag.heading[i] / length if length else 0.0
        if (
            (not is_list and ag.n_li[i] - 100 > n_p)
            or (not is_list and heading_density < 0.9 and length < 25)
            or (not is_list and weight < 25 and ld > 0.2)
            or (weight >= 25 and ld > 0.5)
            or (is_list and ld > 0.5)
            or (tag == "form" and n_p < 3)
        ):
            dropped[i] = True
    return dropped


def _norm(s: str) -> str:
    return " ".join(re.findall(r"\w+", s.lower()))


def _title_heading(pg: _Page, title: str | None, kept: list[int]) -> int | None:
    """Index of the block that repeats the page title (the article's headline), if any."""
    if not title:
        return None
    t = _norm(title)
    for j in kept:
        if pg.tag[pg.b_node[j]] in _HEADINGS:
            h = _norm(pg.b_text[j])
            # "<h1>Headline</h1>" vs "<title>Headline - Site name</title>"
            if h and (
                h == t
                or t.startswith(h)
                or t.endswith(h)
                or (len(h) > 20 and h in t)
                or (len(t) > 20 and t in h)
            ):
                return j
            return None  # only the first heading of the content can be the headline
    return None


def _attempt(pg: _Page, strip_unlikely: bool, use_weights: bool, clean: bool, deadline: float) -> list[int]:
    """The blocks (indices) of the main content under one setting of the filters."""
    ag = _Aggregates(pg, strip_unlikely)
    scores = _score(pg, ag, use_weights, deadline)
    parent, chosen, best, lead = _choose(pg, ag, scores)
    _check(deadline)
    n = len(pg.tag)
    parents = pg.parent
    inside = [False] * n
    for i in range(n):
        p = parents[i]
        inside[i] = i in chosen or (p >= 0 and inside[p])
    in_lead = [False] * n
    if lead >= 0:
        # Nodes inside the article that come before the first chosen node and do not contain it.
        first = min(chosen)
        on_path = set(_ancestors(pg, first))
        for i in range(lead + 1, first):
            if i not in on_path:
                inside[i] = in_lead[i] = True
    # The wrappers between the chosen nodes and the best candidate are part of the choice.
    keep = chosen | {best} | set(_ancestors(pg, best))
    dropped = _clean(pg, ag, scores, chosen, keep, inside, use_weights) if clean else [False] * n
    excluded = ag.excluded
    out = []
    for j, node in enumerate(pg.b_node):
        if excluded[node] or dropped[node]:
            continue
        if in_lead[node]:
            # From the lead only subheadings and real paragraphs: not bylines, dates, kickers.
            length = pg.b_len[j]
            if (pg.tag[node] in _HEADINGS and length >= 10) or (
                length >= _LEAD_MIN and pg.b_link[j] < 0.1 * length
            ):
                out.append(j)
        elif inside[node]:
            out.append(j)
        elif node == parent and pg.b_len[j] > 80 and pg.b_link[j] < 0.25 * pg.b_len[j]:
            out.append(j)  # loose text between the chosen siblings
    return out


def _main_blocks(pg: _Page, deadline: float) -> list[int]:
    best: list[int] = []
    best_len = -1
    # Readability's retries: each step trusts the page's markup less.
    for strip_unlikely, use_weights, clean in (
        (True, True, True),
        (False, True, True),
        (False, False, True),
        (False, False, False),
    ):
        blocks = _attempt(pg, strip_unlikely, use_weights, clean, deadline)
        length = sum(pg.b_len[j] for j in blocks)
        # A looser setting must find much more text to be believed: a little more is only the
        # boilerplate it lets back in (on a page whose article is just short).
        if length > 2 * best_len:
            best, best_len = blocks, length
        if best_len >= _CHAR_THRESHOLD:
            break
    return best


_SHORT_LINK_LINE = 40
_ESCAPED_TAG_RE = re.compile(r"^<[a-zA-Z/!][^<>]*>$")


def _polish(pg: _Page, blocks: list[int]) -> list[int]:
    """Line-level clean-up of the chosen blocks: a short line that is all link ("Back to top",
    "Comment", "Print") is a control, not text; a line that is one escaped tag ("&lt;img ...>"
    in the page's text) is markup; headings left at the end introduced a list that has been
    removed ("Related articles")."""
    out = [
        j
        for j in blocks
        if not (pg.b_len[j] < _SHORT_LINK_LINE and pg.b_link[j] >= 0.9 * pg.b_len[j])
        and not _ESCAPED_TAG_RE.match(pg.b_text[j])
    ]
    while out and pg.tag[pg.b_node[out[-1]]] in _HEADINGS:
        out.pop()
    return out


def _get_title(root: etree._Element) -> str | None:
    el = root.find("head/title")  # not an <svg><title> of the body
    if el is None:
        return None
    return " ".join("".join(el.itertext()).split()) or None


def _body(root: etree._Element) -> etree._Element:
    for el in root.iter("body"):
        return el
    return root


# --------------------------------------------------------------------------- the entry point


def _nfc(text: str | None) -> str | None:
    """Composed Unicode (NFC): the same word is then the same code points whatever the page's
    editor produced (decomposed accents and Bengali nukta are common)."""
    if text and not text.isascii() and not unicodedata.is_normalized("NFC", text):
        return unicodedata.normalize("NFC", text)
    return text


def extract_html(
    raw: bytes | str,
    *,
    encoding_hint: str | None = None,
    url: str | None = None,
    max_bytes: int = 5_000_000,
    timeout_s: float = 5.0,
    include_title: bool = False,
) -> Extracted:
    """The main text of one HTML page. Never raises; see the module docstring.

    ``encoding_hint`` is the charset from the HTTP header, if any. ``max_bytes`` bounds the
    input (characters for a str), ``timeout_s`` the whole call. ``url`` is accepted for the
    pipeline's sake (and for future per-URL rules); the extraction does not use it. The title
    is always returned in ``title``; with ``include_title`` it is also the first line of text
    (otherwise a headline that repeats it is left out of the text, as it is metadata).
    """
    deadline = time.monotonic() + timeout_s
    encoding = None
    title = None
    try:
        if raw is None:
            return Extracted(None, "no_text")
        if len(raw) > max_bytes:
            return Extracted(None, "too_large")
        if isinstance(raw, (bytes, bytearray, memoryview)):
            raw = bytes(raw)
            if _looks_binary(raw):
                return Extracted(None, "binary_content")
            text, encoding = decode_html(raw, encoding_hint)
        elif isinstance(raw, str):
            text = raw
            if _looks_binary_text(text):
                return Extracted(None, "binary_content")
        else:
            return Extracted(None, "parse_error")
        if "\x00" in text:
            text = text.replace("\x00", "")
        if not text or text.isspace():
            return Extracted(None, "no_text", encoding=encoding)
        _check(deadline)
        root = _parse(text, deadline)
        if root is None:
            return Extracted(None, "no_text", encoding=encoding)
        _check(deadline)
        title = _get_title(root)
        etree.strip_elements(root, *_JUNK_TAGS, with_tail=False)
        body = _body(root)
        pg = _walk(body, deadline)
        blocks = _main_blocks(pg, deadline)
        headline = _title_heading(pg, title, blocks)
        if headline is not None:
            title = pg.b_text[headline].replace("\n", " ")  # the headline is cleaner than <title>
            blocks = [j for j in blocks if j != headline]
        lines = [pg.b_text[j] for j in _polish(pg, blocks)]
        if include_title and title:
            lines.insert(0, title)
        if not lines:
            return Extracted(None, "no_text", title=title, encoding=encoding)
        return Extracted(_nfc("\n".join(lines)), None, title=_nfc(title), encoding=encoding)
    except _Timeout:
        return Extracted(None, "timeout", title=title, encoding=encoding)
    except Exception:  # noqa: BLE001 - the contract: a parser failure is a reason, never a crash
        return Extracted(None, "parse_error", title=title, encoding=encoding)

"""Parsing a page and walking it (``parse_page``): lexbor (selectolax's HTML5 parser) and the
walk over its nodes, compiled where setup.py built it (lexbor_walk.pyx), else its Python twin
(lexbor_py.py, the same bytes); for the pages past lexbor's limits, lxml's libxml2 HTML parser
and walk.py's walk, with a flat fallback builder, capped in depth, for the pages libxml2 gives
up on. All behind an attribute cap."""

from __future__ import annotations

import ctypes
import os
import re
from html.parser import HTMLParser as _StdlibTokenizer

from lxml import etree

from tokenmill.transforms.deadline import check

from . import lexbor_py
from .blocks import INLINE, Page
from .walk import ACCELERATED, load_compiled, walk

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
            if tag not in INLINE:
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
        check(deadline)
    builder.close()
    return builder.root


# libxml2 checks each attribute of a tag against all earlier ones: parse time grows with the
# square of a tag's attribute count, in C, where no deadline reaches (bench/MEASUREMENTS.md:
# attribute cap).
# So a tag's attributes are capped before parsing. The patterns follow the HTML5 tokenizer (which
# libxml2 >= 2.14 implements): a quote opens a value only after "=", so a tag ends where libxml2
# ends it. Every quantifier is possessive and the sweep is one anchored match, so the scan is
# linear whatever the input; real pages never reach the cap.
_MAX_ATTRS = 1000
_WS = rb"\t\n\f\r "
_ATTR = rb"(?:[%s/]*+[^%s/>][^%s/>=]*+(?:[%s]*+=[%s]*+(?:\"[^\"]*+\"?|'[^']*+'?|[^%s>]++))?+)" % ((_WS,) * 6)
_TAG_HEAD = rb"<[A-Za-z][^%s/>]*+" % _WS


def sweep(max_attrs: int) -> re.Pattern:
    """Skips tags under ``max_attrs`` attributes and all other text; group 1 is the first tag
    at the cap, if any."""
    return re.compile(rb"(?:%s%s{0,%d}+(?!%s)|[^<]++|<(?![A-Za-z]))*+(?:(%s%s{%d})|\Z)" % (
        _TAG_HEAD, _ATTR, max_attrs - 1, _ATTR, _TAG_HEAD, _ATTR, max_attrs))


_SWEEP = sweep(_MAX_ATTRS)
_TAG_ATTRS = re.compile(rb"(%s%s{0,%d}+)%s*+" % (_TAG_HEAD, _ATTR, _MAX_ATTRS, _ATTR))


def _over_cap(data: bytes) -> bool:
    if ACCELERATED is not None:  # the same answer, compiled (0.44 ms a page for the pattern)
        return ACCELERATED.over_cap(data, _MAX_ATTRS)
    return _SWEEP.match(data).group(1) is not None


def _cap_attributes(data: bytes) -> bytes:
    """``data`` with every tag cut to its first _MAX_ATTRS attributes (the tag's ">" is kept)."""
    if not _over_cap(data):
        return data
    return _TAG_ATTRS.sub(rb"\1", data)


def _utf8(text: str, utf8: bytes | None = None) -> bytes:
    """``text`` in UTF-8 (``utf8`` where the caller has it), tags cut to the attribute cap."""
    if utf8 is None:
        try:
            utf8 = text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates in a str input
            utf8 = text.encode("utf-8", "replace")
    return _cap_attributes(utf8)


def parse(text: str, deadline: float, data: bytes | None = None) -> etree._Element | None:
    """The lxml tree of a page (the path without lexbor_walk, and for the pages past
    _LEXBOR_LIMITS); ``data``: ``text`` as _utf8 gives it, where the caller has it."""
    parser = etree.HTMLParser(
        remove_comments=True,
        remove_pis=True,
        huge_tree=True,
        no_network=True,
        collect_ids=False,
        encoding="utf-8",
    )
    # Bytes rather than str: lxml refuses str input that carries an XML encoding declaration.
    root = etree.fromstring(_utf8(text) if data is None else data, parser)
    if any(e.level_name == "FATAL" for e in parser.error_log):
        # libxml2 stopped early (in practice: nesting deeper than 2048) and dropped the rest.
        check(deadline)
        root = _parse_flat(text, deadline)
    return root


def get_title(root: etree._Element) -> str | None:
    el = root.find("head/title")  # not an <svg><title> of the body
    if el is None:
        return None
    return " ".join("".join(el.itertext()).split()) or None


def body(root: etree._Element) -> etree._Element:
    for el in root.iter("body"):
        return el
    return root


def _global_lexbor() -> None:
    # lexbor_walk calls lexbor's functions in selectolax's module: made visible to it.
    import selectolax.lexbor

    ctypes.CDLL(selectolax.lexbor.__file__, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)


def _selectolax_version() -> str:
    import selectolax

    return selectolax.__version__


def lexbor_walk():
    """lexbor_walk.pyx (``parse_and_walk``, ``most_open``) where built against the installed
    selectolax, else its Python twin lexbor_py (the same bytes, slower)."""
    return load_compiled("lexbor_walk", "SELECTOLAX_VERSION", _selectolax_version, before=_global_lexbor) or lexbor_py


_LEXBOR = lexbor_walk()

# What decides the extracted text: the parsers and their versions. Whether a walk is compiled
# does not (each compiled walk gives its Python twin's bytes: tests/test_html.py), so workers of
# builds with and without a C compiler may share a job; the manifest still records which.
TEXT_DECIDING = ("tokenmill", "html5", "lxml", "selectolax")


def identity() -> dict[str, str]:
    """This process's extractor: the parsers and versions that decide its text (TEXT_DECIDING)
    and which walks are compiled. Recorded in the manifest; a worker whose text-deciding part is
    not the launcher's stops the job (extract_fn.ExtractFn.setup)."""
    from tokenmill import __version__

    compiled = [name for name, built in (("lxml", ACCELERATED is not None), ("lexbor", _LEXBOR is not lexbor_py))
                if built]
    return {"tokenmill": __version__, "html5": "lexbor", "lxml": ".".join(map(str, etree.LXML_VERSION)),
            "selectolax": _selectolax_version(), "compiled_walks": ",".join(compiled) or "none"}


# HTML5 tree building has steps whose cost grows with the square of what is open, in C, where no
# deadline reaches: the open elements are searched at each block tag (40,000 nested <div>: 3.8 s
# in lexbor), the open formatting elements at each new one (20,000 "<b id=N>": 3.8 s), a
# <select>'s options at each one (40,000: 9 s), and formatting elements with distinct attributes
# are re-opened in each new block (100 "<p><i class=N>" then 10,000 "<p>x": 1M elements, 0.39 s
# and 380 MB). A page past a limit on lexbor_walk.most_open (elements open, formatting elements
# open, options, formatting elements re-opened) takes the lxml path. The 623 benchmark pages stay
# far below: at most 1,510 / 61 / 337 / 18,975 (medians 19 / 1 / 0 / 1).
_LEXBOR_LIMITS = (3000, 1000, 5000, 200_000)


def parse_page(text: str | None, deadline: float, utf8: bytes | None = None) -> tuple[str | None, Page] | None:
    """(the page's <title>, the walk's Page of its body), None for a page with no tree;
    ``utf8``: ``text`` in UTF-8, where the caller has it (the page's own bytes; then ``text``
    may be None)."""
    data = _utf8(text, utf8)
    if all(a <= b for a, b in zip(_LEXBOR.most_open(data), _LEXBOR_LIMITS)):
        return _LEXBOR.parse_and_walk(data, deadline)
    if text is None:  # (the flat fallback reads the text as it is, attributes past the cap too)
        text = utf8.decode("utf-8")
    root = parse(text, deadline, data)
    if root is None:
        return None
    check(deadline)
    return get_title(root), walk(body(root), deadline)

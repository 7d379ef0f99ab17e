"""The extractor's lexbor path in Python: lexbor_walk.pyx's twin, for a build without it.

lexbor (selectolax's HTML5 parser) comes in selectolax's wheel; only the compiled walk over its
nodes needs a C compiler and lexbor's headers at install time (setup.py). Where those were
missing, the extractor used to parse with lxml instead, whose tree differs from an HTML5
browser's on a few malformed pages (5 of 623 benchmark pages gave other text). Here the same
lexbor parse is walked through selectolax's Python API by walk.py's ``py_walk`` (the reference
of every walk), so every build gives the same bytes: the compiled walk is a speed-up, not
another extractor (tests/test_html.py compares both on every shared page and on random ones).

``most_open`` is lexbor_walk.most_open's twin (the limits that send a page to the lxml path).
"""

from __future__ import annotations

import re

from selectolax.lexbor import LexborHTMLParser

from .blocks import Page
from .walk import py_walk


class _Element:
    """What ``py_walk`` reads of an lxml element, for a lexbor element node: its tag, attributes
    (the first of each name; a bare one is ""), and the text before its first child element
    (``text``) and after it up to its next sibling element (``tail``); comments are not there."""

    __slots__ = ("node", "tag", "attrs", "text", "tail")

    def __init__(self, node):
        self.node = node
        self.tag = node.tag
        self.attrs = node.attributes
        self.text = _texts(node.child)
        self.tail = _texts(node.next)

    def keys(self):
        return self.attrs.keys()

    def get(self, key: str) -> str | None:
        value = self.attrs.get(key)
        return "" if value is None and key in self.attrs else value


def _texts(node) -> str | None:
    """The text of the text nodes from ``node`` on, up to the next element node."""
    parts = []
    while node is not None and not node.is_element_node:
        if node.is_text_node:
            parts.append(node.text_content or "")
        node = node.next
    return "".join(parts) or None


def _elements(node):
    while node is not None:
        if node.is_element_node:
            yield node
        node = node.next


class _Walker:
    """lxml's ``iterwalk(top, events=("start", "end"))`` over lexbor's nodes: the start and end
    of every element, and ``skip_subtree`` (the skipped element's end still comes)."""

    def __init__(self, top):
        self.root = _Element(top)  # the first element py_walk is given (its end ends the walk)
        self._skip = False

    def skip_subtree(self) -> None:
        self._skip = True

    def _entered(self, el: _Element):
        skipped, self._skip = self._skip, False
        return iter(()) if skipped else _elements(el.node.child)

    def __iter__(self):
        root = self.root
        yield "start", root
        stack = [(root, self._entered(root))]
        while stack:
            el, children = stack[-1]
            node = next(children, None)
            if node is None:
                stack.pop()
                yield "end", el
                continue
            child = _Element(node)
            yield "start", child
            stack.append((child, self._entered(child)))


def _title(head) -> str | None:
    """The text of the head's first <title>, spaces collapsed (lexbor_walk._title)."""
    for node in _elements(head.child if head is not None else None):
        if node.tag == "title":
            parts = []
            c = node.child
            while c is not None:
                if c.is_text_node and c.text_content:
                    parts.append(c.text_content)
                c = c.next
            return " ".join("".join(parts).split()) or None
    return None


def parse_and_walk(data: bytes, deadline: float) -> tuple[str | None, Page]:
    """(title, Page) of ``data`` (UTF-8) parsed by lexbor: lexbor_walk.parse_and_walk's twin."""
    parsed = LexborHTMLParser(data)
    top = parsed.body if parsed.body is not None else parsed.root
    title = _title(parsed.head)
    if top is None:
        return title, Page()
    walker = _Walker(top)
    return title, py_walk(walker.root, deadline, walker=walker)


# ---------------------------------------------------------------- what is open, before parsing

_UNCOUNTED = frozenset(
    b"area base br col embed hr img input link meta param source track wbr keygen p li dt dd tr td th tbody "
    b"thead tfoot colgroup rp rt caption frame basefont bgsound image menuitem".split())
_FORMATTING = frozenset(b"b big code em font i s small strike strong tt u".split())
_TAG = re.compile(rb"<(/?)([A-Za-z][^\t\n\f\r />]*)")


def most_open(data: bytes) -> tuple[int, int, int, int]:
    """lexbor_walk.most_open's twin: (elements open at most at once, formatting elements open at
    most at once, <option>s, formatting elements re-opened) in ``data``, upper bounds counted
    from its start and end tags."""
    depth = formatting = options = max_depth = max_formatting = reopened = 0
    for m in _TAG.finditer(data):
        end = bool(m.group(1))
        raw = m.group(2)
        name = raw.lower() if len(raw) <= 8 else b""
        if name in _FORMATTING:
            if end:
                formatting -= formatting > 0
            else:
                formatting += 1
                max_formatting = max(max_formatting, formatting)
            continue
        if not end:
            reopened += formatting
        if name not in _UNCOUNTED:
            if end:
                depth -= depth > 0
            else:
                depth += 1
                max_depth = max(max_depth, depth)
                options += name == b"option"
    return max_depth, max_formatting, options, reopened

"""The one walk over the tree: block-level elements to flat lists of nodes and runs of text
(``Page``), hidden and junk elements skipped; everything afterwards works on these lists.

``walk`` is the compiled walk (accelerated.pyx, over libxml2's nodes; 1.75x: bench/MEASUREMENTS.md)
where setup.py could build it against the running lxml, else ``py_walk``; both give equal pages
(tests/test_html.py). TOKENMILL_PURE_PYTHON=1 chooses ``py_walk``. Both walk lxml trees; the
extractor's fast path walks lexbor's (lexbor_walk.pyx, chosen in tree.py). The compiled walks
share their steps (page_walk.pxi); ``py_walk`` is the reference of all of them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from lxml import etree

from tokenmill.transforms.deadline import check

from .blocks import (
    BR,
    CHROME_TAGS,
    HEADINGS,
    HIDDEN_CLASSES,
    INLINE,
    JUNK,
    LENGTH_CAP,
    POSITIVE_ITEMPROP,
    UNLIKELY_ROLES,
    Page,
    is_hidden_style,
    paragraph_points,
    prose_commas,
)
from .hints import F_BOILERPLATE, F_POSITIVE, F_UNLIKELY, UNLIKELY_ARTICLE_RE, hints


def py_walk(top: etree._Element, deadline: float, walker=None) -> Page:
    """The walk in Python: the reference (accelerated.pyx is the same steps, compiled; ``walk``).
    ``walker``: the start and end events of another tree's elements, as lxml's iterwalk gives
    them (lexbor_py's, over lexbor's nodes); ``top``: its first element."""
    # One pass of iterwalk's start/end events; an inline element's end is told from a block's
    # end by identity with the open block, without reading its tag.
    pg = Page()
    tags, parents, ends, weights, flags, classes = pg.tag, pg.parent, pg.end, pg.weight, pg.flags, pg.cls
    b_text, b_node, b_len, b_link, b_commas = pg.b_text, pg.b_node, pg.b_len, pg.b_link, pg.b_commas
    b_points = pg.b_points
    stack: list[int] = []  # the open block nodes
    open_blocks: list[etree._Element] = []  # their elements
    open_links: list[etree._Element] = []  # the open <a> elements
    block_el = None  # the innermost open block element
    cur = -1  # the node that text currently belongs to
    buf: list[str] = []
    link_len = 0  # characters of link text in buf
    n_br = 0  # <br> marks in buf (not text: they do not count in the link share's denominator)
    pre_depth = 0
    skipping = None  # the element whose subtree is being skipped (its "end" event still comes)
    inline, headings, chrome, junk = INLINE, HEADINGS, CHROME_TAGS, JUNK

    def flush() -> None:
        nonlocal link_len, n_br
        text = "".join(buf)
        buf.clear()
        raw_len = len(text) - n_br
        ln = link_len
        link_len = n_br = 0
        if BR in text:
            text = "\n".join(filter(None, (" ".join(part.split()) for part in text.split(BR))))
        elif text.isspace():
            return
        else:
            text = " ".join(text.split())
        if text:
            n = len(text)
            b_text.append(text)
            b_node.append(cur)
            b_len.append(n)
            b_link.append(n * ln / raw_len if ln else 0.0)
            commas = prose_commas(text)
            b_commas.append(commas)
            if "\n" in text:
                # Lines split by <br> are paragraphs of their own (Readability turns <br><br> into
                # <p>), or a long <br>-formatted text would score like one short paragraph.
                b_points.append(sum(paragraph_points(line) for line in text.split("\n")))
            else:
                b_points.append(2 + commas + min(n // 100, LENGTH_CAP) if n >= 25 else 0)

    def add(t: str | None) -> None:
        """Text (or tail) of an element into the current run; <pre> keeps its line breaks."""
        nonlocal link_len
        if t:
            if pre_depth:
                t = t.replace("\n", BR)
            buf.append(t)
            if open_links:
                link_len += len(t)

    if walker is None:
        walker = etree.iterwalk(top, events=("start", "end"))
    count = 0
    for event, el in walker:
        count += 1
        if not count & 255:
            check(deadline)
        if event == "start":
            tag = el.tag
            keys = el.keys()
            if tag in junk or not isinstance(tag, str):  # a comment's or PI's tag is a function
                walker.skip_subtree()
                skipping = el
                continue
            unlikely = 0
            weight = 0
            flag = 0
            cls = ""
            if keys:
                if "class" in keys:
                    cls = el.get("class")
                # A heading's id is an anchor made of its text ("nav_..." in heise's TOC ids).
                id_ = el.get("id") if "id" in keys and tag not in headings else ""
                if (
                    "hidden" in keys
                    or ("aria-hidden" in keys and el.get("aria-hidden") == "true")
                    or ("style" in keys and is_hidden_style(el.get("style")))
                    or (cls and not HIDDEN_CLASSES.isdisjoint(cls.split()))
                ):
                    if buf and tag not in inline:
                        flush()
                    walker.skip_subtree()
                    skipping = el
                    continue
                if (cls or id_) and tag != "a":  # links are never skipped for their names
                    unlikely, weight = hints(cls, id_)
                if "role" in keys and el.get("role") in UNLIKELY_ROLES:
                    unlikely |= F_UNLIKELY
                if "itemprop" in keys and POSITIVE_ITEMPROP.search(el.get("itemprop")):
                    flag |= F_POSITIVE
                    weight += 25
                    unlikely = 0
            if tag in chrome:
                unlikely |= F_UNLIKELY
            if unlikely and (
                not stack or (tag in ("article", "main") and not UNLIKELY_ARTICLE_RE.search(cls))
            ):
                unlikely = 0  # the page itself and semantic content containers are never unlikely
            if tag in inline:
                if tag == "br":
                    buf.append(BR)
                    n_br += 1
                    continue
                if unlikely & F_BOILERPLATE:  # e.g. <span class="share-count">
                    walker.skip_subtree()
                    skipping = el
                    continue
                if tag == "a":
                    open_links.append(el)
                add(el.text)
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
            open_blocks.append(el)
            block_el = el
            cur = i
            if tag == "pre":
                pre_depth += 1
            add(el.text)
        else:
            if el is skipping:
                skipping = None
            elif el is block_el:
                if buf:
                    flush()
                ends[cur] = len(tags) - 1
                stack.pop()
                open_blocks.pop()
                if tags[cur] == "pre":
                    pre_depth -= 1
                if stack:
                    cur = stack[-1]
                    block_el = open_blocks[-1]
                else:
                    cur = -1
                    block_el = None
            elif open_links and el is open_links[-1]:
                open_links.pop()
            if el is top:
                break
            add(el.tail)
    if buf and cur >= 0:
        flush()
    return pg


def load_compiled(name: str, built_against: str, running: Callable[[], str], before: Callable[[], None] | None = None):
    """The extractor's compiled module ``name`` (built by setup.py) where it was built against
    the library that is running (its ``built_against`` attribute equals ``running()``: the
    node layouts it reads are compiled in), else None; TOKENMILL_PURE_PYTHON=1: None.
    ``before``: what the module needs done before it loads."""
    if os.environ.get("TOKENMILL_PURE_PYTHON"):
        return None
    try:
        if before is not None:
            before()
        module = importlib.import_module(f"{__package__}.{name}")
        return module if getattr(module, built_against) == running() else None
    except (ImportError, OSError):
        return None


def accelerated():
    """accelerated.pyx (``walk``, ``over_cap``) where built against the running lxml, else None."""
    return load_compiled("accelerated", "LXML_VERSION", lambda: etree.LXML_VERSION)


ACCELERATED = accelerated()
walk = ACCELERATED.walk if ACCELERATED is not None else py_walk

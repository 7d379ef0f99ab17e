"""What the walk tells apart and what it builds: the tag vocabularies, the hidden-element
signs, the paragraph score and ``Page``. walk.py's Python walk and the compiled ones
(page_walk.pxi) read them from here."""

from __future__ import annotations

import re

# Skipped with their subtree by the walk, as if they were not there: no line break, their tail
# text kept. Forms are not here: ASP.NET pages wrap the whole page in one. Nor are <nav>, <aside>
# and <footer>: broken markup sometimes leaves the whole page inside one, so they are only
# "unlikely" (see CHROME_TAGS). The parser drops comments and processing instructions.
JUNK = frozenset(
    """script style noscript template iframe frame frameset svg math canvas object embed applet video
    audio source track picture img map area button input select option optgroup textarea datalist output
    progress meter dialog link meta base head search figcaption rt rp rtc""".split()
)
# Inline tags: they never break a line. Everything else (including unknown / custom elements,
# which are nearly always containers) is a block.
INLINE = frozenset(
    "a abbr acronym b bdi bdo big blink cite code data del dfn em font i ins kbd label mark nobr q "
    "rb rbc ruby s samp small span strike strong sub sup time tt u var wbr br".split()
)
HEADINGS = frozenset("h1 h2 h3 h4 h5 h6".split())
CHROME_TAGS = frozenset("nav menu aside footer".split())

HIDDEN_STYLE_RE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)


def is_hidden_style(style: str) -> bool:
    return ("none" in style or "hidden" in style) and HIDDEN_STYLE_RE.search(style) is not None


HIDDEN_CLASSES = frozenset(
    "hidden hide d-none sr-only visually-hidden visuallyhidden screen-reader-text screenreader-only "
    "screen-reader-only element-invisible invisible is-hidden u-hidden a11y-hidden".split()
)
UNLIKELY_ROLES = frozenset(
    "navigation menu menubar menuitem complementary banner contentinfo dialog alertdialog search toolbar "
    "tablist tooltip".split()
)
POSITIVE_ITEMPROP = re.compile(r"articleBody|reviewBody|text", re.I)


class Page:
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


BR = "\x00"  # marks a <br> (or a newline inside <pre>) in the raw text; real NULs are removed


LENGTH_CAP = 3


def prose_commas(text: str) -> int:
    """Commas of prose: followed by a space in alphabetic scripts ("1,5" and "a,b,c" lists of a
    rating widget are not prose), bare in CJK."""
    return text.count(", ") + text.count("，") + text.count("、") + text.count("، ")


def paragraph_points(text: str) -> float:
    """Readability's score of a paragraph: 1 + (commas + 1) + one per 100 characters, at most 3."""
    n = len(text)
    if n < 25:
        return 0
    return 2 + prose_commas(text) + min(n // 100, LENGTH_CAP)

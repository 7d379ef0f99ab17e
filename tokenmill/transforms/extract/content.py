"""The blocks of the main content: the chosen nodes cleaned of link lists and negatively named
boxes, Readability's retries with fewer filters, and line-level polish."""

from __future__ import annotations

import re

from tokenmill.transforms.deadline import check

from .blocks import HEADINGS, Page
from .score import Aggregates, ancestors, choose, score

_CLEAN_TAGS = frozenset("div section ul ol dl table form fieldset header figure details center".split())
# Less text than this means "try again with fewer filters" (Readability uses 500; 200 keeps
# short articles from being swapped for their page's boilerplate: bench/MEASUREMENTS.md).
_CHAR_THRESHOLD = 200
_LEAD_MIN = 80  # shortest paragraph taken from the article's lead (shorter: bylines, dates, kickers)


def _clean(
    pg: Page,
    ag: Aggregates,
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
        if tag in HEADINGS:
            # Headings named like boilerplate ("Related", "Comments") go; real ones stay.
            dropped[i] = weight < 0 or ag.link_density(i) > 0.5
            continue
        if tag not in _CLEAN_TAGS and "-" not in tag:
            continue
        # A negative name drops a box unless its paragraphs outscore it. Its Readability score
        # alone never does: for a list or a <header> that is only the tag's starting malus
        # (Readability.js's clean conditionally tests the class weight alone, too).
        if weight < 0 and weight + scores.get(i, 0.0) < 0:
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


def title_heading(pg: Page, title: str | None, kept: list[int], before: int = -1) -> int | None:
    """Index of the block that repeats the page title (the article's headline), if any: the
    text of the node ``before`` the content (main_blocks' headline, not among ``kept``), else
    the first heading of ``kept``."""
    if not title:
        return None
    t = _norm(title)
    if before >= 0:
        try:
            j = pg.b_node.index(before)
        except ValueError:  # a headline without text of its own
            pass
        else:
            if _repeats(_norm(pg.b_text[j]), t):
                return j
    for j in kept:
        if pg.tag[pg.b_node[j]] in HEADINGS:
            return j if _repeats(_norm(pg.b_text[j]), t) else None  # only the content's first heading
    return None


def _repeats(h: str, t: str) -> bool:
    """Whether a heading's words ``h`` repeat the title's ``t``: "<h1>Headline</h1>" vs
    "<title>Headline - Site name</title>"."""
    return bool(h) and (
        h == t or t.startswith(h) or t.endswith(h) or (len(h) > 20 and h in t) or (len(t) > 20 and t in h)
    )


def _headline_before(pg: Page, ag: Aggregates, first: int, article: int) -> int:
    """The article's headline before the content's first node ``first``, or -1: the last <h1>
    before it (when it comes after the start of the <article> ``article`` around the content),
    else, on a page with neither a usable <h1> nor such an <article>, the last <h2>. What lies
    between the headline and the body is the lead (standfirst, teaser, intro), whatever boxes
    the markup puts it in; trafilatura keeps it, Readability's choice of one node misses it."""
    tags, excluded = pg.tag, ag.excluded
    # One reversed copy of the nodes before the content, searched in C (the content may start
    # thousands of nodes into the page); each search goes on from the last, so all are linear.
    before = tags[first - 1 :: -1] if first > 0 else []

    def last(tag: str, after: int = 0) -> int:  # the last ``tag`` node before the content's
        try:  # first, skipping ``after`` nodes back from it; -1: none
            return first - 1 - before.index(tag, after)
        except ValueError:
            return -1

    i = last("h1")
    if i > 0:
        if not excluded[i]:
            return i if i > article else -1
        # else the site's logo in a banner: the page's own headline may be an <h2>
    if article < 0:
        i = last("h2")
        while i > 0 and excluded[i]:
            i = last("h2", first - i)
        if i > 0:
            return i
    return -1


def _attempt(
    pg: Page, strip_unlikely: bool, use_weights: bool, clean: bool, deadline: float
) -> tuple[list[int], int]:
    """The blocks (indices) of the main content under one setting of the filters, and the
    node of the headline the lead was counted from (-1: none)."""
    ag = Aggregates(pg, strip_unlikely)
    scores = score(pg, ag, use_weights, deadline)
    parent, chosen, best, lead = choose(pg, ag, scores)
    check(deadline)
    n = len(pg.tag)
    parents = pg.parent
    inside = [False] * n
    for i in range(n):
        p = parents[i]
        inside[i] = i in chosen or (p >= 0 and inside[p])
    in_lead = [False] * n
    first = min(chosen)
    headline = _headline_before(pg, ag, first, lead)
    if headline >= 0:
        lead = headline
    if lead >= 0:
        # Nodes after the lead's start that come before the first chosen node and do not contain it.
        on_path = set(ancestors(pg, first))
        for i in range(lead + 1, first):
            if i not in on_path:
                inside[i] = in_lead[i] = True
    # The wrappers between the chosen nodes and the best candidate are part of the choice.
    keep = chosen | {best} | set(ancestors(pg, best))
    # A <header> inside the content is the article's lead box (headline, standfirst, byline,
    # date): from it, too, only subheadings and real paragraphs. Not one that is the content
    # itself (chosen, or around the best candidate): a site may call its body a <header>.
    tags, ends = pg.tag, pg.end
    has_lead = lead >= 0 and lead + 1 < first
    i = first - 1
    while True:
        try:
            i = tags.index("header", i + 1)
        except ValueError:
            break
        if inside[i] and i not in keep:  # its subtree: the nodes up to its end (<header>s in it too)
            has_lead = True
            for k in range(i, ends[i] + 1):
                in_lead[k] = True
            i = ends[i]
    dropped = _clean(pg, ag, scores, chosen, keep, inside, use_weights) if clean else [False] * n
    excluded = ag.excluded
    out = []
    for j, node in enumerate(pg.b_node):
        if excluded[node] or dropped[node]:
            continue
        if in_lead[node]:
            # From the lead only subheadings and real paragraphs: not bylines, dates, kickers.
            length = pg.b_len[j]
            if (pg.tag[node] in HEADINGS and length >= 10) or (
                length >= _LEAD_MIN and pg.b_link[j] < 0.1 * length
            ):
                out.append(j)
        elif inside[node]:
            out.append(j)
        elif node == parent and pg.b_len[j] > 80 and pg.b_link[j] < 0.25 * pg.b_len[j]:
            out.append(j)  # loose text between the chosen siblings
    return (_drop_empty_lead_headings(pg, out, in_lead) if has_lead else out), headline


def _drop_empty_lead_headings(pg: Page, out: list[int], in_lead: list[bool]) -> list[int]:
    """A lead heading followed by another heading of its rank or higher (or by nothing) heads
    nothing of its own: the label of a box whose links are gone ("Tools & Resources", "Quick
    links"), not a subheading of the article."""
    tags, b_node = pg.tag, pg.b_node
    keep = []
    last = len(out) - 1
    for k, j in enumerate(out):
        tag = tags[b_node[j]]
        if in_lead[b_node[j]] and tag in HEADINGS:
            nxt = tags[b_node[out[k + 1]]] if k < last else ""
            if k == last or (nxt in HEADINGS and nxt <= tag):  # "h1" < "h2": higher rank
                continue
        keep.append(j)
    return keep


def main_blocks(pg: Page, deadline: float) -> tuple[list[int], int]:
    """The blocks of the main content, and the node of the headline before it (-1: none; its
    text is not among the blocks: a candidate for the title)."""
    best: list[int] = []
    best_len = -1
    best_headline = -1
    # Readability's retries: each step trusts the page's markup less.
    for strip_unlikely, use_weights, clean in (
        (True, True, True),
        (False, True, True),
        (False, False, True),
        (False, False, False),
    ):
        blocks, headline = _attempt(pg, strip_unlikely, use_weights, clean, deadline)
        length = sum(pg.b_len[j] for j in blocks)
        # A looser setting must find much more text to be believed: a little more is only the
        # boilerplate it lets back in (on a page whose article is just short).
        if length > 2 * best_len:
            best, best_len, best_headline = blocks, length, headline
        if best_len >= _CHAR_THRESHOLD:
            break
    return best, best_headline


_SHORT_LINK_LINE = 40
_LINK_PARAGRAPH = 100  # a paragraph shorter than this, mostly (60%+) link and not a sentence
_ESCAPED_TAG_RE = re.compile(r"^<[a-zA-Z/!][^<>]*>$")
# Full stops (Latin, CJK ideographic and fullwidth, Devanagari danda, Arabic, Ethiopic): a
# cross-reference links to a headline, which ends without one (or with "?" or "!": measured,
# counting those as sentence ends let cross-references back in: trafilatura set F1 -0.0007).
_FULL_STOPS = (".", "\u3002", "\uff0e", "\uff61", "\u0964", "\u06d4", "\u1362")
_CLOSERS = "\"'\u2019\u201d\u00bb)]\u300d\u300f\uff09 "  # quotes and brackets after a full stop


def _ends_sentence(text: str) -> bool:
    return text.rstrip(_CLOSERS).endswith(_FULL_STOPS)


def polish(pg: Page, blocks: list[int]) -> list[int]:
    """Line-level clean-up of the chosen blocks: a short line that is all link ("Back to top",
    "Comment", "Print") is a control, not text; a short paragraph of its own that is mostly
    (60%+) link text and does not end with a full stop is a cross-reference ("Read more:
    <headline>", "Related: <headline>", a bare URL, "Source: <link>"), like trafilatura's link
    density test of a <p> (list items and table cells are judged with their list or table, by
    _clean); a line that is one escaped tag ("&lt;img ...>" in the page's text) is markup;
    headings left at the end introduced a list that has been removed ("Related articles")."""
    memo: dict[int, int] = {}
    b_len, b_link, b_text = pg.b_len, pg.b_link, pg.b_text
    out = [
        j
        for j in blocks
        if not (b_len[j] < _SHORT_LINK_LINE and b_link[j] >= 0.9 * b_len[j])
        and not (
            b_len[j] < _LINK_PARAGRAPH
            and b_link[j] >= 0.6 * b_len[j]
            and not _ends_sentence(b_text[j])
            and _line_group(pg, pg.b_node[j], memo) < 0
        )
        and not _ESCAPED_TAG_RE.match(b_text[j])
    ]
    while out and pg.tag[pg.b_node[out[-1]]] in HEADINGS:
        out.pop()
    return out


# Paragraph breaks. A paragraph is a block of its own tag (p, heading, pre, blockquote), a whole
# list or a whole table, or a run of text of any other block (a div's own text): paragraphs are
# separated by a blank line, like Markdown (and resiliparse, which also blanks only around <p>
# and headings). The items of one list (nested lists included) and the rows and cells of one
# table are lines of one paragraph: one newline between them, as between the lines of a <br>.
_OWN_PARAGRAPH = HEADINGS | frozenset(("p", "pre", "blockquote"))
_LISTS = frozenset(("ul", "ol", "dl", "menu"))


def _line_group(pg: Page, i: int, memo: dict[int, int]) -> int:
    """The list or table whose lines node ``i``'s text belongs to, or -1 (a paragraph of its
    own): the outermost of nested lists, the innermost of nested tables, nothing across a
    paragraph tag."""
    chain = []
    while i >= 0 and i not in memo:
        chain.append(i)
        i = pg.parent[i]
    group = memo.get(i, -1)
    tags = pg.tag
    for i in reversed(chain):  # top-down
        tag = tags[i]
        if tag in _OWN_PARAGRAPH:
            group = -1
        elif tag in _LISTS:
            if group < 0 or tags[group] not in _LISTS:
                group = i
        elif tag == "table":
            group = i
        memo[i] = group
    return group


def assemble(pg: Page, blocks: list[int], title: str | None = None) -> str:
    """The text of ``blocks``: a blank line between paragraphs, a newline between the lines
    of one list or table (and, inside a block, where a <br> broke the line)."""
    memo: dict[int, int] = {}
    parts = [title] if title else []
    last = -1
    for j in blocks:
        group = _line_group(pg, pg.b_node[j], memo)
        if parts:
            parts.append("\n" if group >= 0 and group == last else "\n\n")
        parts.append(pg.b_text[j])
        last = group
    return "".join(parts)

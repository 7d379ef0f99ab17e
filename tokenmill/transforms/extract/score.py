"""Readability's scoring: per-node sums over the walk's lists, paragraph scores given to their
ancestors, and the choice of the node (and siblings) that holds the article."""

from __future__ import annotations

import re

from tokenmill.transforms.deadline import check

from .blocks import HEADINGS, Page
from .hints import F_ANY_UNLIKELY, F_BOILERPLATE, F_POSITIVE

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
_MUCH_PROSE = 400  # characters of long, link-free paragraphs that make a softly unlikely box content
_NEAR_BEST = 0.8  # an ancestor scoring this share of the best node's score replaces it
_ARTICLE_MAX_LD = 0.3  # an <article> more link-heavy than this is a list of teasers, not the article
_SENTENCE_END_RE = re.compile(r"[.!?。！？](?:\s|$)")


class Aggregates:
    """Per-node sums over the subtree, leaving out excluded nodes."""

    __slots__ = ("excluded", "text", "link", "commas", "n_p", "n_li", "heading", "listed", "children")

    def __init__(self, pg: Page, strip_unlikely: bool):
        n = len(pg.tag)
        tags, parents, flags = pg.tag, pg.parent, pg.flags
        unlikely = [bool(f & F_ANY_UNLIKELY) for f in flags] if strip_unlikely else [False] * n
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
                    not unlikely[i] and (tags[i] in ("article", "main") or flags[i] & F_POSITIVE)
                ):
                    holds_content[p] = True
            for i in range(n):
                if unlikely[i] and (
                    holds_content[i] or (not flags[i] & F_BOILERPLATE and prose[i] >= _MUCH_PROSE)
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
                if tags[node] in HEADINGS:
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


def score(pg: Page, ag: Aggregates, use_weights: bool, deadline: float) -> dict[int, float]:
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
            check(deadline)
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


def ancestors(pg: Page, i: int) -> list[int]:
    out = []
    p = pg.parent[i]
    while p >= 0:
        out.append(p)
        p = pg.parent[p]
    return out


def choose(pg: Page, ag: Aggregates, scores: dict[int, float]) -> tuple[int, set[int], int, int]:
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
    alternatives = [set(ancestors(pg, c)) for c in ranked[1:5] if scores[c] >= 0.75 * top_score]
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
    for p in ancestors(pg, top):
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

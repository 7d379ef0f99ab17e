"""What an element's class names and id say about it: the name vocabularies, their hint bits,
and the node flags the walk and the scoring share."""

from __future__ import annotations

import re
from functools import lru_cache

# Node flags: set by the walk (from these hints, roles and itemprop), read by the scoring.
F_UNLIKELY = 1  # a "soft" negative class/id/role: excluded unless it holds much prose
F_BOILERPLATE = 2  # a "hard" negative class/id: excluded unless it holds the <article>
F_POSITIVE = 4  # schema.org articleBody and the like
F_ANY_UNLIKELY = F_UNLIKELY | F_BOILERPLATE


# Class/id hints, in the spirit of Readability's lists, extended with today's consent,
# newsletter and recommendation widgets. Long words match anywhere in a lower-cased class name
# or id (one literal alternation, faster than a re.I pattern with lookarounds:
# bench/MEASUREMENTS.md, class/id hints); short words must be a whole word of kebab/snake case,
# so that "ad" does not hit "header" or "load".
class _Words:
    __slots__ = ("literals", "parts", "words")

    def __init__(self, parts: str, words: str = ""):
        self.literals = tuple(parts.split())  # (page_walk.pxi's compiled twin reads these)
        # One alternation of plain literals: the regex engine scans the name once.
        self.parts = re.compile("|".join(re.escape(p) for p in self.literals))
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
UNLIKELY_ARTICLE_RE = re.compile(r"comment|repl(?:y|ies)|related|recommend|teaser|card", re.I)
# WordPress and friends list the post's tags and categories as classes ("tag-social-media").
TAXONOMY_PREFIXES = ("tag-", "category-", "categories-", "topic-")
_H_MAYBE, _H_BOILERPLATE, _H_UNLIKELY, _H_NEGATIVE, _H_POSITIVE = 1, 2, 4, 8, 16
# Each vocabulary and its hint bit (the compiled twin of ``hints`` in page_walk.pxi reads them).
VOCABULARIES = (
    (_H_MAYBE, _MAYBE),
    (_H_BOILERPLATE, _BOILERPLATE),
    (_H_UNLIKELY, _UNLIKELY),
    (_H_NEGATIVE, _NEGATIVE),
    (_H_POSITIVE, _POSITIVE),
)


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
    for bit, words in VOCABULARIES:
        if words.match(low, tokens):
            bits |= bit
    return bits


@lru_cache(maxsize=8192)
def hints(class_: str, id_: str) -> tuple[int, int]:
    """(unlikely flags, Readability-style class weight) for an element's class and id."""
    class_bits = 0
    for name in class_.split():
        if not name.startswith(TAXONOMY_PREFIXES):
            class_bits |= _name_hints(name)
    id_bits = _name_hints(id_) if id_ else 0
    return combine(class_bits, id_bits, bool(id_bits) and len(_TOKEN_SPLIT_RE.split(id_)) >= 4)


def combine(class_bits: int, id_bits: int, long_id: bool) -> tuple[int, int]:
    """``hints`` from the hint bits of the class names and of the id (``long_id``: an id of
    four or more words)."""
    if long_id:
        # An id of four or more words is mostly an anchor made from a heading's text
        # ("sharing-with-a-single-developer"): its good words count, its bad ones do not.
        id_bits &= _H_MAYBE | _H_POSITIVE
    both = class_bits | id_bits
    unlikely = 0
    if not both & _H_MAYBE:
        if both & _H_BOILERPLATE:
            unlikely = F_BOILERPLATE
        elif both & _H_UNLIKELY:
            unlikely = F_UNLIKELY
    weight = 0
    for bits in (class_bits, id_bits):
        if bits & _H_NEGATIVE:
            weight -= 25
        if bits & _H_POSITIVE:
            weight += 25
    return unlikely, weight

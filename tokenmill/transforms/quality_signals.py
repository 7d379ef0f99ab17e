"""Quality signals per document: every number the rules (quality.py) and the report read,
computed once per document (``measure``), as the papers define them, or as datatrove's filters
do with ``quality.compat=datatrove`` (quality_datatrove.py).

Word splitting depends on the script: languages written without spaces (Chinese, Japanese,
Thai, ...) count each letter as a word unit, so they are not dropped for having "one word";
rules that only make sense for space-separated languages (mean word length, stop words)
are skipped for them (``no_space_langs``).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from tokenmill.config import QualityConfig
from tokenmill.transforms import quality_datatrove as datatrove
from tokenmill.transforms.quality_datatrove import TERMINAL_PUNCTUATION, duplicates
from tokenmill.transforms.stage_base import check

_WORD = re.compile(r"\w+(?:['\u2019-]\w+)*")
_LETTER = re.compile(r"[^\W\d_]")
_PUNCT_RUN = re.compile(r"[^\w\s]+")  # a punctuation token, for FineWeb's count of all tokens
_BULLETS = ("•", "●", "○", "▪", "■", "–", "-", "*", "·", "‣", "⁃", "◦", "➤", "→")
_ELLIPSIS = ("...", "…")

# The signals, in the order they appear in the docs Parquet (float64 unless in INT_SIGNALS: the
# stored value is the value the rules saw, so refilter decides as prepare did).
SIGNALS = [
    "n_words", "mean_word_len", "hash_word_ratio", "ellipsis_word_ratio", "bullet_line_ratio",
    "ellipsis_line_ratio", "alpha_word_ratio", "stop_words",
    "dup_line_frac", "dup_para_frac", "dup_line_char_frac", "dup_para_char_frac",
    "top_2gram_frac", "top_3gram_frac", "top_4gram_frac",
    "dup_5gram_frac", "dup_6gram_frac", "dup_7gram_frac", "dup_8gram_frac", "dup_9gram_frac", "dup_10gram_frac",
    "terminal_punct_line_ratio", "short_line_ratio", "dup_line_chars_ratio", "newline_word_ratio",
    "c4_lorem_ipsum", "c4_curly_bracket", "c4_javascript_lines", "c4_policy_lines", "words_per_line",
    "c4_sentences",
    "char_entropy", "word_entropy",
]
INT_SIGNALS = {"n_words", "stop_words", "c4_lorem_ipsum", "c4_curly_bracket", "c4_javascript_lines", "c4_policy_lines",
               "c4_sentences"}
# A sentence end for C4's count: a run of . ! ? (and closing quotes or brackets) followed by a
# space or the line's end. The run is matched from its first mark only (the lookbehind fails at
# once inside it) and possessively: from every mark of a long run of dots that no space follows,
# "[.!?]+(?:\s|$)" scanned the rest of the run again (quadratic in the run).
_SENTENCE_END = re.compile(r"[.!?](?<![.!?]{2})[.!?]*+[\"'\u201d\u2019)\]]*+(?:\s|$)")
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")  # Wikipedia's marks, cut from C4's lines
C4_END_MARKS = (".", "?", "!", '"')  # C4's code: a period, question or exclamation mark, end quote
C4_MAX_WORD_CHARS = 1000  # C4 removes a line with a longer word


def words_of(text: str, no_space: bool) -> list[str]:
    if no_space:
        # One unit per letter: the honest count for scripts that put no spaces between words.
        return [ch for ch in text if _LETTER.match(ch)] + [w for w in _WORD.findall(text) if w.isascii()]
    return _WORD.findall(text)


def _dup_fracs(items: list[str]) -> tuple[float, float]:
    """(fraction of items that repeat an earlier one, fraction of characters in those repeats)."""
    if not items:
        return 0.0, 0.0
    dup, dup_chars = duplicates(items)
    return dup / len(items), dup_chars / (sum(map(len, items)) or 1)


def _ngram_ranks(lower_words: list[str], deadline: float | None):
    """For n = 2, 3, ...: (n, the positions of the n-grams that may repeat, each one's rank among
    them (equal n-grams, equal ranks: exact, no hashing), the number of occurrences of each rank,
    the first position of each rank), until no n-gram repeats: then no longer one does either
    (its first n words would repeat). An n-gram repeats only where its first n-1 words do: only
    those positions are ranked (the others occur once), a shrinking share as n grows."""
    vocab = {w: i for i, w in enumerate(dict.fromkeys(lower_words))}
    ids = np.fromiter(map(vocab.__getitem__, lower_words), np.int64, len(lower_words))
    size = len(vocab)
    at = np.flatnonzero(np.bincount(ids, minlength=size)[ids] >= 2)  # words that repeat
    rank = ids[at]
    for n in range(2, 11):
        keep = int(np.searchsorted(at, len(ids) - n + 1))  # the n-grams that fit
        at, rank = at[:keep], rank[:keep]
        if not keep:
            return
        # an n-gram is its (n-1)-gram's rank and its last word: one int64, ranked by np.unique
        keys = rank * size + ids[at + n - 1]
        _, first, rank, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
        yield n, at, rank, counts, at[first]
        repeats = counts[rank] >= 2
        if not repeats.any():
            return
        at, rank = at[repeats], rank[repeats]
        check(deadline)


def _top_ngram_frac(n: int, counts, first, ends, word_chars: int) -> float:
    """Characters of the most frequent word n-gram (the first seen on a tie) times its count,
    over all word characters (Gopher); 0 when none repeats. ``first``: each rank's first position."""
    top = int(counts.max())
    if top <= 1:
        return 0.0
    at = int(first[counts == top].min())
    return int(ends[at + n] - ends[at]) * top / (word_chars or 1)


def _dup_ngram_frac(n: int, at, rank, counts, ends, word_chars: int) -> float:
    """Characters of words inside n-grams that occur more than once (Gopher, non-overlapping:
    after a repeat, the next n-gram considered starts past it). Only n-grams that occur twice
    or more are looked at, in order (``at``: the positions of the ranked n-grams)."""
    where = np.flatnonzero(counts[rank] >= 2)
    seen: set[int] = set()
    covered = resume = 0
    for i, key in zip(at[where].tolist(), rank[where].tolist()):
        if i < resume:
            continue
        if key in seen:
            covered += int(ends[i + n] - ends[i])
            resume = i + n
        else:
            seen.add(key)
    return covered / (word_chars or 1)


def _entropy(counts: Counter) -> float:
    total = sum(counts.values())
    if not total:
        return 0.0
    return -sum(c / total * math.log2(c / total) for c in counts.values())


def _alpha_words(words: list[str]) -> int:
    """Words with a letter; each distinct word looked at once."""
    has_letter = {w: 1 if _LETTER.search(w) else 0 for w in dict.fromkeys(words)}
    return sum(map(has_letter.__getitem__, words))


def _gopher(text: str, words: list[str], lower_words: list[str], lines: list[str], stops: set[str]) -> dict[str, Any]:
    """Gopher's quality rules (Rae et al. 2021, appendix A): words are letter/digit runs."""
    n_words = len(words)
    n_lines = len(lines) or 1
    return {
        "n_words": n_words,
        "mean_word_len": (sum(map(len, words)) / n_words) if n_words else 0.0,
        # "symbol-to-word ratio greater than 0.1 for either the hash symbol or the ellipsis": two ratios.
        "hash_word_ratio": text.count("#") / max(n_words, 1),
        "ellipsis_word_ratio": sum(text.count(e) for e in _ELLIPSIS) / max(n_words, 1),
        "bullet_line_ratio": sum(ln.startswith(_BULLETS) for ln in lines) / n_lines,
        "ellipsis_line_ratio": sum(ln.endswith(_ELLIPSIS) for ln in lines) / n_lines,
        "alpha_word_ratio": _alpha_words(words) / n_words if n_words else 0.0,
        # "at least two of the following English words": distinct words of the list.
        "stop_words": len(stops.intersection(lower_words)),
    }


def _repetition(lower_words: list[str], lines: list[str], text: str, deadline: float | None) -> dict[str, Any]:
    """Gopher's repetition rules: lines and paragraphs, then word n-grams (case folded)."""
    s: dict[str, Any] = {}
    s["dup_line_frac"], s["dup_line_char_frac"] = _dup_fracs(lines)
    s["dup_para_frac"], s["dup_para_char_frac"] = _dup_fracs([p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()])
    check(deadline)
    for n in range(2, 11):
        s[f"top_{n}gram_frac" if n <= 4 else f"dup_{n}gram_frac"] = 0.0
    ngram_fracs = _ngram_fracs_numpy if len(lower_words) >= NUMPY_WORDS else _ngram_fracs_python
    s.update(ngram_fracs(lower_words, deadline))
    return s


# From this many words on, numpy ranks the n-grams; below, a dict does (numpy's fixed cost per
# call is most of a short document's time: bench/MEASUREMENTS.md, quality: short documents).
NUMPY_WORDS = 1000


def _ngram_fracs_numpy(lower_words: list[str], deadline: float | None) -> dict[str, float]:
    """The n-gram signals that apply (n-grams that repeat), computed with numpy."""
    s = {}
    # word characters before each word (lowercasing can change a length: "İ" -> "i̇")
    ends = np.zeros(len(lower_words) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, lower_words), np.int64, len(lower_words)), out=ends[1:])
    word_chars = int(ends[-1])
    for n, at, rank, counts, first in _ngram_ranks(lower_words, deadline):
        if n <= 4:
            s[f"top_{n}gram_frac"] = _top_ngram_frac(n, counts, first, ends, word_chars)
        else:
            s[f"dup_{n}gram_frac"] = _dup_ngram_frac(n, at, rank, counts, ends, word_chars)
    return s


def _ngram_fracs_python(lower_words: list[str], deadline: float | None) -> dict[str, float]:
    """_ngram_fracs_numpy's signals with a dict per n: the same steps (only n-grams whose first
    n-1 words repeat are ranked; a rank is a number per distinct (n-1)-gram rank and last word)."""
    s = {}
    ends = [0, *itertools.accumulate(map(len, lower_words))]
    word_chars = ends[-1] or 1
    vocab: dict[str, int] = {}
    ids = [vocab.setdefault(w, len(vocab)) for w in lower_words]
    once = Counter(ids)
    at = [i for i, x in enumerate(ids) if once[x] >= 2]  # words that repeat
    rank = [ids[i] for i in at]
    for n in range(2, 11):
        fit = bisect.bisect_left(at, len(ids) - n + 1)  # the n-grams that fit
        if not fit:
            break
        del at[fit:], rank[fit:]
        ranks: dict[tuple[int, int], int] = {}
        counts: list[int] = []
        first: list[int] = []
        for k, (i, r) in enumerate(zip(at, rank)):
            j = ranks.setdefault((r, ids[i + n - 1]), len(counts))
            if j == len(counts):
                counts.append(1)
                first.append(i)
            else:
                counts[j] += 1
            rank[k] = j
        top = max(counts)
        if n <= 4:
            if top > 1:  # the most frequent n-gram, the first seen on a tie
                i = min(f for f, c in zip(first, counts) if c == top)
                s[f"top_{n}gram_frac"] = (ends[i + n] - ends[i]) * top / word_chars
        else:  # non-overlapping repeats, in order
            seen: set[int] = set()
            covered = resume = 0
            for i, j in zip(at, rank):
                if counts[j] < 2 or i < resume:
                    continue
                if j in seen:
                    covered += ends[i + n] - ends[i]
                    resume = i + n
                else:
                    seen.add(j)
            s[f"dup_{n}gram_frac"] = covered / word_chars
        if top <= 1:
            break
        kept = [(i, j) for i, j in zip(at, rank) if counts[j] >= 2]
        at, rank = [i for i, _ in kept], [j for _, j in kept]
        check(deadline)
    return s


def c4_lines(text: str, *, end_marks: tuple[str, ...], min_words: int, terminal: bool,
             sentences: Callable[[str], int], words_before_citations: bool) -> tuple[list[str], int, int, int]:
    """C4's line cleaning (Raffel et al. 2020; tensorflow_datasets' c4_utils.clean_page): the
    lines it keeps, their sentence count, and whether "lorem ipsum" or "{" is on a line that
    passed the line rules (C4 drops the page there). Each rule is measured as if the page rules
    were off, so that each decides alone: a line with "{" still counts its sentences."""
    kept: list[str] = []
    n_sentences = lorem = curly = 0
    for raw in text.splitlines():
        raw = raw.strip()
        if len(raw) > C4_MAX_WORD_CHARS and any(len(w) > C4_MAX_WORD_CHARS for w in raw.split()):
            continue
        line = _CITATION.sub("", raw) if "[" in raw else raw
        if terminal and (not line.endswith(end_marks) or line.endswith("...")):
            continue
        if len((raw if words_before_citations else line).split()) < min_words:
            continue
        low = line.lower()
        lorem = lorem or int("lorem ipsum" in low)
        if "javascript" in low:  # "please enable JavaScript" notices
            continue
        curly = curly or int("{" in line)
        if any(p in low for p in _POLICY):
            continue
        n_sentences += sentences(line)
        kept.append(line)
    return kept, n_sentences, lorem, curly


def _count_sentences(line: str) -> int:
    return len(_SENTENCE_END.findall(line)) or 1


def _fineweb(text: str, n_tokens: int, cfg: QualityConfig) -> dict[str, Any]:
    """FineWeb's rules, as datatrove (their definition) computes them: non-blank lines as they
    are, terminal marks without quotes or ellipses, line breaks per token (punctuation too)."""
    lines = [ln for ln in text.split("\n") if ln.strip()] or [""]
    return {
        "terminal_punct_line_ratio": sum(ln.endswith(TERMINAL_PUNCTUATION) for ln in lines) / len(lines),
        "short_line_ratio": sum(len(ln) <= cfg.fineweb_short_line_chars for ln in lines) / len(lines),
        "dup_line_chars_ratio": duplicates(lines)[1] / (len(text.replace("\n", "")) or 1),
        "newline_word_ratio": text.count("\n") / max(n_tokens, 1),
    }


def measure(text: str, lang: str | None, cfg: QualityConfig,
            deadline: float | None = None) -> tuple[dict[str, Any], str | None]:
    """Every signal of ``text``, and the text C4's line removal leaves (None when it is off or
    does not apply). ``deadline`` (time.monotonic()) is checked between the passes over the text,
    each linear in it: past it, ``deadline.Timeout``. FineWeb's signals are measured on the text
    C4 leaves, as in FineWeb's pipeline (C4, then FineWeb)."""
    compat = cfg.compat == "datatrove"
    no_space = (lang or "") in cfg.no_space_langs
    words = words_of(text, no_space)
    check(deadline)
    lower_words = [w.lower() for w in words]
    lines = [ln for ln in (ln.strip() for ln in text.split("\n")) if ln]
    check(deadline)
    if compat:
        tokens = datatrove.words(text)
        check(deadline)
        s = datatrove.gopher(text, tokens)
        s.update(datatrove.repetition(text, tokens, deadline))
    else:
        s = _gopher(text, words, lower_words, lines, set(cfg.stop_words.get(lang or "", ())))
        s.update(_repetition(lower_words, lines, text, deadline))
    # C4: its line rules, the page rules on what they keep, and the sentence count. Defined for
    # languages written with spaces; compat applies it everywhere, as datatrove's defaults do.
    c4 = cfg.c4
    cleaned = None
    if compat or not no_space:
        kept, s["c4_sentences"], lorem, curly = c4_lines(
            text, end_marks=datatrove.C4_END_MARKS if compat else C4_END_MARKS,
            min_words=cfg.c4_value("min_words_per_line"),
            terminal=c4.line_terminal_punct, sentences=datatrove.sentences if compat else _count_sentences,
            words_before_citations=compat)
        if c4.remove_lines and c4.enabled and kept:
            cleaned = "\n".join(kept).strip()
    else:
        s["c4_sentences"], lorem, curly = 0, 0, 0
    low = text.lower()
    if not (compat or c4.remove_lines):  # lines stay: the paper's page rules on the whole page
        lorem, curly = int("lorem ipsum" in low), int("{" in text)
    s["c4_lorem_ipsum"], s["c4_curly_bracket"] = lorem, curly
    # Lines are looked at only where the page holds the words at all (most pages do not).
    s["c4_javascript_lines"] = sum("javascript" in ln.lower() for ln in lines) if "javascript" in low else 0
    s["c4_policy_lines"] = (sum(any(p in ln.lower() for p in _POLICY) for ln in lines)
                            if any(p in low for p in _POLICY) else 0)
    s["words_per_line"] = len(words) / (len(lines) or 1)
    check(deadline)
    if cleaned is None:
        s.update(_fineweb(text, len(tokens) if compat else len(words) + len(_PUNCT_RUN.findall(text)), cfg))
    else:
        n_tokens = (len(datatrove.words(cleaned)) if compat
                    else len(words_of(cleaned, no_space)) + len(_PUNCT_RUN.findall(cleaned)))
        s.update(_fineweb(cleaned, n_tokens, cfg))
    check(deadline)
    s["char_entropy"] = _entropy(Counter(text.replace("\n", "").replace(" ", "")))
    s["word_entropy"] = _entropy(Counter(lower_words))
    return s, cleaned


def signals(text: str, lang: str | None, cfg: QualityConfig, deadline: float | None = None) -> dict[str, Any]:
    """Every signal of ``text`` (``measure`` without the cleaned text)."""
    return measure(text, lang, cfg, deadline)[0]

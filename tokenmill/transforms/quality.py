"""Quality signals per document and the filters on them (Gopher, C4, FineWeb rules).

Signals are computed once (``signals``), stored as columns in the docs Parquet, and every
filter reads them (``first_failure``), so a drop always has one ``quality:<rule>`` reason and
the values that made it fire are on the row. Defaults are datatrove's published ones.

Word splitting depends on the script: languages written without spaces (Chinese, Japanese,
Thai, ...) count each letter as a word unit, so they are not dropped for having "one word";
rules that only make sense for space-separated languages (mean word length, stop words)
are skipped for them (``no_space_langs``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.config import QualityConfig
from tokenmill.errors import UserError
from tokenmill.transforms import classifier
from tokenmill.transforms import quality_datatrove as datatrove
from tokenmill.transforms.classifier import low as classifier_low
from tokenmill.transforms.doc import drop, stored
from tokenmill.transforms.quality_datatrove import TERMINAL_PUNCTUATION
from tokenmill.transforms.stage_base import Stage, StageFn, check

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


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(items that repeat an earlier one, characters in those repeats)."""
    seen: set[str] = set()
    dup = dup_chars = 0
    for it in items:
        if it in seen:
            dup += 1
            dup_chars += len(it)
        else:
            seen.add(it)
    return dup, dup_chars


def _dup_fracs(items: list[str]) -> tuple[float, float]:
    """(fraction of items that repeat an earlier one, fraction of characters in those repeats)."""
    if not items:
        return 0.0, 0.0
    dup, dup_chars = _duplicates(items)
    return dup / len(items), dup_chars / (sum(map(len, items)) or 1)


def _ngram_ranks(lower_words: list[str], deadline: float | None):
    """For n = 2, 3, ...: (n, each n-gram's rank (equal n-grams, equal ranks: exact, no hashing),
    the number of occurrences of each rank, the first position of each rank), until no n-gram
    repeats: then no longer one does either (its first n words would repeat)."""
    vocab = {w: i for i, w in enumerate(dict.fromkeys(lower_words))}
    ids = np.fromiter(map(vocab.__getitem__, lower_words), np.int64, len(lower_words))
    rank, size = ids, len(vocab)
    for n in range(2, 11):
        m = len(ids) - n + 1
        if m <= 0:
            return
        # an n-gram is its (n-1)-gram's rank and its last word: one int64, ranked by np.unique
        keys = rank[:m] * size + ids[n - 1:]
        _, first, rank, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
        size = len(vocab)
        yield n, rank, counts, first
        if counts.max() <= 1:
            return
        check(deadline)


def _top_ngram_frac(n: int, counts, first, ends, word_chars: int) -> float:
    """Characters of the most frequent word n-gram (the first seen on a tie) times its count,
    over all word characters (Gopher); 0 when none repeats."""
    top = int(counts.max())
    if top <= 1:
        return 0.0
    at = int(first[counts == top].min())
    return int(ends[at + n] - ends[at]) * top / (word_chars or 1)


def _dup_ngram_frac(n: int, rank, counts, ends, word_chars: int) -> float:
    """Characters of words inside n-grams that occur more than once (Gopher, non-overlapping:
    after a repeat, the next n-gram considered starts past it). Only n-grams that occur twice
    or more are looked at, in order."""
    where = np.flatnonzero(counts[rank] >= 2)
    seen: set[int] = set()
    covered = resume = 0
    for i, key in zip(where.tolist(), rank[where].tolist()):
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
    # word characters before each word (lowercasing can change a length: "İ" -> "i̇")
    ends = np.zeros(len(lower_words) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, lower_words), np.int64, len(lower_words)), out=ends[1:])
    word_chars = int(ends[-1])
    for n in range(2, 11):
        s[f"top_{n}gram_frac" if n <= 4 else f"dup_{n}gram_frac"] = 0.0
    for n, rank, counts, first in _ngram_ranks(lower_words, deadline):
        if n <= 4:
            s[f"top_{n}gram_frac"] = _top_ngram_frac(n, counts, first, ends, word_chars)
        else:
            s[f"dup_{n}gram_frac"] = _dup_ngram_frac(n, rank, counts, ends, word_chars)
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
        "dup_line_chars_ratio": _duplicates(lines)[1] / (len(text.replace("\n", "")) or 1),
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


# ---------------------------------------------------------------- the rules, as a table
# A rule is one entry: its reason (quality:<reason>), the signal it reads, its family (the
# QualityConfig section that switches it off and holds its limit), how it compares and the
# key of its limit. first_failure, the list of reasons and the report's histograms derive from
# it. "min": the document breaks it below the limit; "max": above it; "flag": a nonzero signal
# while the switch named by ``key`` is on. ``when``: where it applies (None: everywhere).


def _space_separated(s: dict[str, Any], lang: str, cfg: QualityConfig) -> bool:
    return lang not in cfg.no_space_langs or cfg.compat == "datatrove"


def _has_stop_words(s: dict[str, Any], lang: str, cfg: QualityConfig) -> bool:
    return lang in cfg.stop_words or cfg.compat == "datatrove"


def _javascript_stub(s: dict[str, Any], lang: str, cfg: QualityConfig) -> bool:
    # Where C4's lines stay, a short page that mentions javascript is a "please enable
    # JavaScript" stub; where they are removed (or with compat), the line goes, not the page.
    return s["n_words"] < cfg.c4.javascript_max_words and not cfg.c4.remove_lines and cfg.compat == "papers"


@dataclass(frozen=True)
class Rule:
    reason: str
    signal: str
    family: str  # gopher | repetition | c4 | fineweb
    compare: str  # min | max | flag
    key: str  # the family's key: "top_ngram_fracs[1]" is an item of a list
    when: Callable[[dict[str, Any], str, QualityConfig], bool] | None = None
    # What the report shows of the signal: a kept-vs-dropped histogram (low, high, bins, log10
    # scale), None: its value beside each sample document, False: nothing.
    report: tuple | None | bool = False

    def limit(self, cfg: QualityConfig) -> Any:
        name, _, index = self.key.partition("[")
        if self.family == "c4" and getattr(cfg.c4, name) is None:
            return cfg.c4_value(name)
        value = getattr(getattr(cfg, self.family), name)
        return value[int(index[:-1])] if index else value

_UNIT = (0.0, 1.0, 20, False)
RULES: tuple[Rule, ...] = (
    Rule("gopher_min_words", "n_words", "gopher", "min", "min_words", report=(0.0, 5.0, 25, True)),
    Rule("gopher_max_words", "n_words", "gopher", "max", "max_words"),
    Rule("gopher_mean_word_len", "mean_word_len", "gopher", "min", "min_mean_word_len", _space_separated,
         report=(0.0, 15.0, 30, False)),
    Rule("gopher_mean_word_len", "mean_word_len", "gopher", "max", "max_mean_word_len", _space_separated),
    Rule("gopher_hash_ratio", "hash_word_ratio", "gopher", "max", "max_symbol_word_ratio", report=None),
    Rule("gopher_ellipsis_ratio", "ellipsis_word_ratio", "gopher", "max", "max_symbol_word_ratio", report=None),
    Rule("gopher_bullet_lines", "bullet_line_ratio", "gopher", "max", "max_bullet_lines", report=None),
    Rule("gopher_ellipsis_lines", "ellipsis_line_ratio", "gopher", "max", "max_ellipsis_lines", report=None),
    Rule("gopher_alpha_words", "alpha_word_ratio", "gopher", "min", "min_alpha_words", report=_UNIT),
    Rule("gopher_stop_words", "stop_words", "gopher", "min", "min_stop_words", _has_stop_words, report=None),
    *(Rule(f"gopher_{key}", key, "repetition", "max", key, report=_UNIT if key == "dup_line_frac" else False)
      for key in ("dup_line_frac", "dup_para_frac", "dup_line_char_frac", "dup_para_char_frac")),
    *(Rule(f"gopher_top_{n}gram", f"top_{n}gram_frac", "repetition", "max", f"top_ngram_fracs[{i}]",
           report=_UNIT if n == 2 else False) for i, n in enumerate((2, 3, 4))),
    *(Rule(f"gopher_dup_{n}gram", f"dup_{n}gram_frac", "repetition", "max", f"dup_ngram_fracs[{i}]")
      for i, n in enumerate(range(5, 11))),
    Rule("c4_lorem_ipsum", "c4_lorem_ipsum", "c4", "flag", "drop_lorem_ipsum"),
    Rule("c4_curly_bracket", "c4_curly_bracket", "c4", "flag", "drop_curly_bracket"),
    Rule("c4_javascript", "c4_javascript_lines", "c4", "flag", "drop_javascript", _javascript_stub),
    Rule("c4_min_sentences", "c4_sentences", "c4", "min", "min_sentences", _space_separated),
    Rule("fineweb_terminal_punct", "terminal_punct_line_ratio", "fineweb", "min", "min_terminal_punct_lines",
         report=_UNIT),
    Rule("fineweb_short_lines", "short_line_ratio", "fineweb", "max", "max_short_lines", report=_UNIT),
    Rule("fineweb_dup_line_chars", "dup_line_chars_ratio", "fineweb", "max", "max_dup_line_chars"),
    Rule("fineweb_newlines_per_word", "newline_word_ratio", "fineweb", "max", "max_newline_word_ratio"),
)
assert all(r.signal in SIGNALS for r in RULES), "a rule reads a signal signals() does not compute"
REASONS = tuple(dict.fromkeys(r.reason for r in RULES))  # in the order they are tried


# Per config (one per language at most), the rules of its enabled families with their limits
# read once: first_failure runs per document.
_ACTIVE: dict[int, tuple[QualityConfig, list]] = {}


def _active(cfg: QualityConfig) -> list[tuple[Rule, Any]]:
    hit = _ACTIVE.get(id(cfg))
    if hit is None or hit[0] is not cfg:
        hit = _ACTIVE[id(cfg)] = (cfg, [(r, r.limit(cfg)) for r in RULES
                                        if getattr(cfg, r.family).enabled])
    return hit[1]


def failures(s: dict[str, Any], lang: str | None, cfg: QualityConfig) -> Iterator[str]:
    """The reasons of the rules ``s`` breaks, in RULES' order (Gopher quality, Gopher
    repetition, C4, FineWeb); a family whose section is off is skipped."""
    lang = lang or ""
    for rule, limit in _active(cfg):
        value = s[rule.signal]
        if value is None:  # not measured (datatrove's mean length of no words): no rule breaks
            continue
        if rule.compare == "min":
            hit = value < limit
        elif rule.compare == "max":
            hit = value > limit
        else:
            hit = bool(limit and value)
        if hit and (rule.when is None or rule.when(s, lang, cfg)):
            yield rule.reason


def first_failure(s: dict[str, Any], lang: str | None, cfg: QualityConfig) -> str | None:
    """The reason of the first rule ``s`` breaks, or None."""
    return next(failures(s, lang, cfg), None)


def quality_score(s: dict[str, Any], lang_score: float | None) -> float:
    """A single number to choose the dedup survivor by: fewer repeats, more prose."""
    return round((lang_score or 0.5) * (1 - s["dup_line_frac"]) * min(1.0, s["terminal_punct_line_ratio"] + 0.5), 6)


class QualityFn(StageFn):
    stage = "quality"
    _scorer = None  # the classifiers, loaded in setup when configured

    def setup(self):
        if self.cfg.classifier.model is not None:
            from tokenmill.transforms.classifier import Scorer

            self._scorer = Scorer(self.cfg.classifier)

    def apply(self, doc):
        lang = doc.get("lang")
        cfg = self.cfg.for_lang(lang)  # quality.per_lang overrides, merged once per language
        s, cleaned = measure(doc["text"], lang, cfg, self.deadline)
        doc.update(s)
        if cleaned is not None:  # quality.c4.remove_lines: the lines C4 keeps, whatever the verdict
            doc["text"] = cleaned
        doc["quality_score"] = stored(quality_score(s, doc.get("lang_score")))
        # Every document gets its classifier scores, whatever the rules say (the report's
        # histogram compares kept and dropped).
        if self._scorer is not None:
            self._scorer.apply(doc)
        return self.decide(doc)

    def decide(self, doc):
        """The rules and thresholds on the document's signals and scores (as stored: refilter
        calls this on a stored row); a rule's reason comes before the classifier's."""
        lang = doc.get("lang")
        cfg = self.cfg.for_lang(lang)
        s = {k: doc.get(k) for k in SIGNALS}
        reason = first_failure(s, lang, cfg) or classifier_low(doc, cfg.classifier)
        if self.cfg.mode == "tag":  # decided, stored, not applied (tokenmill refilter applies it)
            doc["quality_flag"] = f"{self.stage}:{reason}" if reason else None
            return doc
        return drop(doc, self.stage, reason) if reason else doc

    def redecide(self, doc):
        """refilter: ``decide`` on the stored signals, or None where the document has none (an
        earlier stage dropped it in the stored run)."""
        return None if doc.get("n_words") is None else self.decide(doc)


def fields(cfg: QualityConfig) -> list[pa.Field]:
    """The signal columns, the score, the classifiers' scores and, in tag mode, the decision a
    filter would have taken (quality_flag) and the MinHash signature (for refilter)."""
    out = [pa.field(n, pa.int32() if n in INT_SIGNALS else pa.float64()) for n in SIGNALS]
    out.append(pa.field("quality_score", pa.float32()))
    out += [pa.field(column, pa.float32()) for column in classifier.models(cfg.classifier)]
    if cfg.mode == "tag":
        out += [pa.field("quality_flag", pa.string()), pa.field("minhash", pa.binary())]
    return out


def _check(cfg: QualityConfig, job) -> None:
    if cfg.compat == "datatrove":
        datatrove.words("")  # spaCy is there, or one line before the run
    if cfg.classifier.model is not None:
        classifier.check(cfg.classifier)


# Settings that change the signals themselves or the stored text (not only the thresholds on
# them); a dotted key is a key of a subsection. c4.enabled counts where C4 removes lines.
SIGNAL_KEYS = ("compat", "no_space_langs", "stop_words", "fineweb_short_line_chars", "c4.remove_lines",
               "c4.line_terminal_punct", "c4.min_words_per_line")


def _signal_settings(q: dict, langs: set[str]) -> dict:
    """SIGNAL_KEYS' values in a quality section (a config dump), for every language and for
    each of ``langs`` (its overrides merged in)."""
    cfg = QualityConfig.model_validate(q)

    def values(c: QualityConfig) -> list:
        return ([c.c4_value(k[3:]) if k.startswith("c4.min_") else attrgetter(k)(c) for k in SIGNAL_KEYS]
                + [c.c4.enabled if c.c4.remove_lines else None])

    return {lang: values(cfg.for_lang(lang)) for lang in (None, *langs)}


def _refilter_check(new: dict, old: dict, src: str) -> None:
    if new["enabled"] and not old["enabled"]:
        raise UserError(f"refilter: {src} has no quality signals (they are computed before PII redaction): "
                        f"run prepare with quality on")
    langs = set(new["per_lang"]) | set(old["per_lang"])
    if _signal_settings(new, langs) != _signal_settings(old, langs):
        raise UserError(f"refilter: {', '.join(SIGNAL_KEYS)} change the stored signals or texts themselves (as does "
                        f"c4.enabled with c4.remove_lines): run prepare again")
    if new["classifier"]["model"] not in (None, old["classifier"]["model"]):
        raise UserError(f"refilter: the classifier scores come from {src}: other models need a prepare")


# The report: the rules' signals (their histograms first), then what no rule reads.
_REPORT: dict[str, tuple | None] = {}
for _rule in sorted(RULES, key=lambda r: r.report is None):
    if _rule.report is not False:
        _REPORT.setdefault(_rule.signal, _rule.report)
SPEC = Stage("quality", "quality", QualityFn, fields=fields, check=_check,
             report={**_REPORT, "char_entropy": (0.0, 8.0, 32, False), "quality_classifier": _UNIT},
             refilter="redecide", derived=("quality_flag",), refilter_check=_refilter_check)

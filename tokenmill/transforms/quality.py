"""The quality rules on the signals (quality_signals.py) and the quality stage (Gopher, C4,
FineWeb rules).

Signals are computed once (``measure``), stored as columns in the docs Parquet, and every
filter reads them (``first_failure``), so a drop always has one ``quality:<rule>`` reason and
the values that made it fire are on the row. The rules are the papers' by default (Gopher, C4;
FineWeb: datatrove's filters), datatrove's with ``quality.compat=datatrove``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import pyarrow as pa

from tokenmill.config import QualityConfig
from tokenmill.errors import UserError
from tokenmill.transforms import classifier
from tokenmill.transforms import quality_datatrove as datatrove
from tokenmill.transforms.classifier import low as classifier_low
from tokenmill.transforms.doc import drop, stored
from tokenmill.transforms.quality_signals import INT_SIGNALS, SIGNALS, measure, signals, words_of
from tokenmill.transforms.stage_base import Stage, StageFn

__all__ = ["RULES", "SIGNALS", "QualityFn", "failures", "first_failure", "measure", "signals", "words_of"]

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
             refilter="redecide", derived=("quality_flag",), refilter_check=_refilter_check,
             reads=lambda cfg: {"quality.classifier.model": list(classifier.models(cfg.classifier).values())})

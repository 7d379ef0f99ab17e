"""Hostile text: no document can stall a clean-phase stage.

Every per-document pass is linear in the document: a hostile text costs at most a generous
multiple (10x) of ordinary text of the same size, measured in the same test (a quadratic pattern
costs 30-1000x at these sizes). And every stage has a per-document deadline: past it the
document is dropped as ``<stage>:timeout``, never a hang.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tokenmill.config import DecontaminateConfig, NormalizeConfig, PiiConfig, QualityConfig, UrlConfig
from tokenmill.errors import UserError
from tokenmill.transforms.decontaminate import DecontaminateFn, EvalGrams
from tokenmill.transforms.normalize import NormalizeFn, normalize_text
from tokenmill.transforms.pii import PiiFn, redact
from tokenmill.transforms.quality import QualityFn, signals
from tokenmill.transforms.stage_base import Timeout
from tokenmill.transforms.urlfilter import UrlFn, UrlList, blocked

ALL = ["email", "phone", "ip", "card", "iban", "secret"]
# The same ordinary text and repeated units as bench/hostile.py (which prints the figures).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from hostile import ordinary, rep  # noqa: E402


def seconds(fn, arg) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fn(arg)
        best = min(best, time.perf_counter() - t0)
    return best


def assert_linear(fn, hostile, plain, factor: float = 10.0, slack: float = 0.005) -> None:
    """``fn(hostile)`` costs at most ``factor`` times ``fn(plain)`` (plus ``slack`` seconds of
    timer noise): best of three each, the hostile runs stopping at the first within budget (or
    far over it: a quadratic pass is not run three times)."""
    t_plain = seconds(fn, plain)
    budget = factor * t_plain + slack
    t_hostile = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fn(hostile)
        t_hostile = min(t_hostile, time.perf_counter() - t0)
        if t_hostile <= budget or t_hostile > 3 * budget:
            break
    assert t_hostile <= budget, f"{t_hostile:.3f} s vs {t_plain:.3f} s for ordinary text"


# ---------------------------------------------------------------- linear passes

N = 100_000

PII_SHAPES = {
    # The e-mail local part "\b[A-Za-z0-9._%+-]+@" restarted at every word boundary of a run
    # that no "@" ends, and scanned the rest of it each time.
    "email_local_run": rep("a.", N - 2) + " @",
    "email_dash_run": rep("a-", N - 7) + " x@y.z",
    # The same run after an "@": the domain, then the run as local parts.
    "email_domain_run": "x@" + rep("1.", N - 2),
    # "\beyJ" + a base64url run without the dots of a JWT: every "eyJ" scanned the run to its end.
    "jwt_run": rep("eyJ-", N),
    "jwt_run_dot": rep("eyJ-", N - 21) + "." + "a" * 20,
    # BEGIN lines without an END line: each searched the rest of the text for one.
    "key_begins": rep("-----BEGIN PRIVATE KEY-----\n", N),
    "key_body": "-----BEGIN PRIVATE KEY-----\n" + rep("A", N - 28),
    "key_ends": "-----BEGIN PRIVATE KEY-----\n" + rep("-----END A ", N - 28),
    # Guards: long runs of what the bounded patterns (cards, phones, IBANs, IPs) look at.
    "hex_colon_run": rep("a:", N),
    "digits_spaces": rep("1 ", N),
    "plus_digits": rep("+1111111111111111111111 ", N),
    "iban_run": rep("DE89 ", N),
    "dots_run": rep(".", N),
}


@pytest.mark.parametrize("shape", sorted(PII_SHAPES))
def test_pii_is_linear(shape):
    assert_linear(lambda t: redact(t, ALL), PII_SHAPES[shape], ordinary(N))


QUALITY_SHAPES = {
    # "[.!?]+(?:\s|$)" on a run of dots that no space follows: every dot scanned the rest of the
    # run (lines kept by C4: three words, a terminal dot).
    "dot_runs": rep("a b c " + "." * 2000 + "x.\n", N),
    "mixed_marks": rep("a b c " + "?!." * 700 + "x.\n", N),
    # The paragraph split "\n\s*\n" on long whitespace runs.
    "newline_spaces": "\n" + " " * (N - 2) + "x",
    "newline_space_runs": rep("\n" + " " * 50, N),
    # Words joined by apostrophes and hyphens, one long line of one word.
    "apostrophes": rep("a'", N),
    "hyphens": rep("a-", N),
    "one_line": rep("word ", N),
    "same_line": rep("same line\n", N),
}


@pytest.mark.parametrize("shape", sorted(QUALITY_SHAPES))
def test_quality_is_linear(shape):
    cfg = QualityConfig()
    assert_linear(lambda t: signals(t, "en", cfg), QUALITY_SHAPES[shape], ordinary(N))


NORMALIZE_SHAPES = {
    "newline_spaces": "\n" + " " * (N - 2) + "x",
    "whitespace_mix": rep("\n \t\u00a0", N),
    "blank_lines": rep("\n", N),
    "invisible": rep("\u200b\u00ad", N),
    "short_words": rep("a ", N),
}


@pytest.mark.parametrize("shape", sorted(NORMALIZE_SHAPES))
def test_normalize_is_linear(shape):
    cfg = NormalizeConfig(drop_short_words=True)
    assert_linear(lambda t: normalize_text(t, cfg), NORMALIZE_SHAPES[shape], ordinary(N))


def test_url_labels_are_linear():
    """A URL of 20,000 host labels: every label suffix was joined and looked up (quadratic)."""
    lists = UrlList([("example.com", "block.txt", 1), ("ads.example.org", "block.txt", 2)])
    hostile = "http://" + "a." * 20_000 + "com/"
    plain = "http://www.example.net/" + "a/" * 20_000
    assert_linear(lambda u: lists.match(u), hostile, plain)
    assert lists.match("http://" + "a." * 20_000 + "example.com/") and not lists.match(hostile)


@pytest.mark.parametrize("regex, path", [(r"(a+)+$", "a" * 26 + "!"), (r"(a|aa)+$", "a" * 34 + "!"),
                                         (r"(\w+\s?)+$", "a" * 26 + "!"), (r"(x+x+)+y", "x" * 26)],
                         ids=["nested_plus", "alternation", "word_space", "double_plus"])
def test_user_url_regex_runs_in_linear_time(regex, path):
    """A block-list regex that backtracks catastrophically in Python's re (2^26 steps here)
    runs on RE2."""
    lists = UrlList([(f"re:{regex}", "block.txt", 1)])
    assert_linear(lambda u: lists.match(u), "http://x.com/" + path, "http://x.com/" + "b" * len(path), slack=0.01)


@pytest.mark.parametrize("regex, feature", [
    (r"(a)\1", "backreference"), (r"(?<!x)y", "lookbehind"), (r"(?=x)", "lookahead"), (r"a++", "possessive"),
])
def test_url_regex_outside_re2_is_refused_in_one_line(regex, feature):
    with pytest.raises(UserError) as e:
        UrlList([("example.com", "block.txt", 1), (f"re:{regex}", "block.txt", 2)])
    msg = str(e.value)
    assert msg.startswith(f"block.txt:2: regex {regex!r} uses a feature RE2 does not support") and "\n" not in msg
    assert "linear time" in msg


def test_url_regexes_keep_their_meaning():
    lists = UrlList([(r"re:^https?://[^/]*casino", "b", 1), (r"re:(?i)/ADS?/", "b", 2), (r"re:\.(?:exe|zip)$", "b", 3)])
    assert lists.match("https://best-casino.example/x") and not lists.match("https://x.example/casino")
    assert lists.match("http://x.example/ads/1") and lists.match("http://x.example/Ad/1")
    assert lists.match("http://x.example/a.zip") and not lists.match("http://x.example/a.zip?x=1")


# ---------------------------------------------------------------- deadlines


def _now_past() -> float:
    return time.monotonic() - 1.0


def test_pure_cores_raise_timeout_past_the_deadline_and_never_without_one():
    text = ordinary(5_000)
    cfgq, cfgn = QualityConfig(), NormalizeConfig()
    for call in (lambda d: redact(text, ALL, d), lambda d: signals(text, "en", cfgq, d),
                 lambda d: normalize_text(text + " caf\u00e9", cfgn, d),
                 lambda d: blocked("http://x.example/a", UrlList([("re:zzz", "b", 1)]), None, d)):
        with pytest.raises(Timeout):
            call(_now_past())
        call(None)
        call(time.monotonic() + 60)


def _process(fn, doc):
    (out,) = list(fn.process(doc))
    return out


TINY = 1e-9  # the deadline passes before the stage's first check


def test_quality_deadline_drops_the_document():
    fn = QualityFn(QualityConfig(timeout_s=TINY))
    doc = _process(fn, {"id": "a", "text": ordinary(20_000), "lang": "en"})
    assert doc["dropped_by"] == "quality:timeout"
    assert _process(QualityFn(QualityConfig()), {"id": "b", "text": ordinary(20_000), "lang": "en"})["n_words"] > 0


def test_normalize_deadline_drops_the_document():
    doc = _process(NormalizeFn(NormalizeConfig(timeout_s=TINY)), {"id": "a", "text": ordinary(20_000)})
    assert doc["dropped_by"] == "normalize:timeout"


def test_url_deadline_drops_the_document():
    fn = UrlFn(UrlConfig(block_files=["unused"], timeout_s=TINY))
    fn._block, fn._allow = UrlList([("re:casino", "b", 1)]), None  # what setup() reads from the files
    assert _process(fn, {"id": "a", "url": "http://x.example/"})["dropped_by"] == "url:timeout"


def test_decontaminate_deadline_drops_the_document():
    fn = DecontaminateFn(DecontaminateConfig(files=["unused"], timeout_s=TINY))
    fn._grams = EvalGrams.build([("eval", ["the quick brown fox jumps over the lazy dog again and again"])], 13, 8)
    assert _process(fn, {"id": "a", "text": ordinary(20_000)})["dropped_by"] == "decontaminate:timeout"


def test_pii_deadline_publishes_no_unredacted_text():
    fn = PiiFn(PiiConfig(timeout_s=TINY))
    live = _process(fn, {"id": "a", "text": "mail jane.doe@example.com " + ordinary(20_000)})
    assert live["dropped_by"] == "pii:timeout" and live["text"] is None
    # A document an earlier stage dropped keeps its reason, and loses its text too.
    dropped = _process(fn, {"id": "b", "text": "mail jane.doe@example.com", "dropped_by": "quality:c4_min_sentences"})
    assert dropped["dropped_by"] == "quality:c4_min_sentences" and dropped["text"] is None
    # With time enough, the same documents are redacted.
    ok = _process(PiiFn(PiiConfig()), {"id": "c", "text": "mail jane.doe@example.com"})
    assert ok["text"] == "mail <EMAIL>" and not ok.get("dropped_by")

"""Hostile text per clean-phase stage: the seconds one document of ``--size`` characters of
ordinary text costs each stage's pure core, against the same size of each hostile shape (long
runs of punctuation, of e-mail or key characters, of digits, of whitespace; URLs of many
labels; block-list regexes that backtrack catastrophically in Python's re).

The goal (issue "a document can stall the job"): every per-document step is linear in the
document, so a hostile megabyte costs about what an ordinary one does (the ``x ordinary``
column), and a stage's deadline (``timeout_s``, 5 s) is never what saves a job.

Each figure runs in a forked child (inputs built there, not timed; best of ``--repeat``) that is
killed past ``--cap`` seconds: a quadratic pass on a megabyte takes hours, shown as ``> cap``.
Stages: ``normalize_text``, quality ``signals``, pii ``redact``, url ``UrlList.match`` (the
URL is the document), ``decontaminate`` (drop and cut modes against a small evaluation set).

    python bench/hostile.py [--size 1000000] [--cap 60] [--repeat 2] [--stages pii,quality]
                            [--shapes dot_runs,jwt_run]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from tokenmill.config import NormalizeConfig, QualityConfig  # noqa: E402
from tokenmill.transforms.decontaminate import EvalGrams, decontaminate  # noqa: E402
from tokenmill.transforms.normalize import normalize_text  # noqa: E402
from tokenmill.transforms.pii import redact  # noqa: E402
from tokenmill.transforms.quality import signals  # noqa: E402
from tokenmill.transforms.urlfilter import UrlList  # noqa: E402

ALL_PII = ["email", "phone", "ip", "card", "iban", "secret"]
_WORDS = ("the of and to in is was for that with on as by at from people water house light river green "
          "stone music paper garden market school city night morning window table story number").split()
_EXTRAS = ["jane.doe@example.com", "+1 555 0100", "192.0.2.10", "3.11.2", "2024-05-01", "caf\u00e9",
           "\u00fcber", "(555) 010-0199", "$49.99", "https://example.org/a/b?c=d", "x:y", "U.S.A."]
_FRENCH = ("le la les de des et \u00e0 o\u00f9 caf\u00e9 \u00e9t\u00e9 tr\u00e8s agr\u00e9able d\u00e9jeuner "
           "ann\u00e9e fen\u00eatre \u00e9cole ma\u00eetre gar\u00e7on na\u00eff c\u0153ur \u00e9l\u00e8ve "
           "for\u00eat rivi\u00e8re lumi\u00e8re soci\u00e9t\u00e9 \u00abici\u00bb co\u00fbt").split()


def ordinary(n: int, seed: int = 0, vocabulary: list[str] = _WORDS) -> str:
    """``n`` characters of prose (as tests/test_hostile_text.py): sentences of common words,
    some numbers, addresses and accents, paragraphs of a few lines."""
    rnd = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n:
        words = [rnd.choice(vocabulary) for _ in range(rnd.randint(6, 18))]
        if rnd.random() < 0.4:
            words.insert(rnd.randrange(len(words)), rnd.choice(_EXTRAS))
        sentence = " ".join(words).capitalize() + rnd.choice(".!?.") + rnd.choice(("  ", " ", "\n", "\n\n"))
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:n]


def rep(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


# Shapes of n characters. The first of each stage's list is its ordinary text.
TEXT_SHAPES = {
    "ordinary": ordinary,
    "ordinary_french": lambda n: ordinary(n, 1, _FRENCH),  # every line non-ASCII: ftfy's work
    "dot_runs": lambda n: rep("a b c " + "." * 2000 + "x.\n", n),
    "one_dot_run": lambda n: "a b c " + "." * (n - 8) + "x.",
    "email_local_run": lambda n: rep("a.", n - 2) + " @",
    "email_dash_run": lambda n: rep("a-", n - 7) + " x@y.z",
    "email_domain_run": lambda n: "x@" + rep("1.", n - 2),
    "emails_chained": lambda n: rep("a@b.co.", n),
    "jwt_run": lambda n: rep("eyJ-", n),
    "key_begins": lambda n: rep("-----BEGIN PRIVATE KEY-----\n", n),
    "key_body": lambda n: "-----BEGIN PRIVATE KEY-----\n" + rep("A", n - 28),
    "hex_colon_run": lambda n: rep("a:", n),
    "ipv4s": lambda n: rep("1.1.1.1 ", n),
    "ipv6s": lambda n: rep("::1 ", n),
    "cards": lambda n: rep("4111 1111 1111 1111 ", n),
    "digits_spaces": lambda n: rep("1 ", n),
    "plus_digits": lambda n: rep("+1111111111111111111111 ", n),
    "iban_run": lambda n: rep("DE89 ", n),
    "newline_spaces": lambda n: "\n" + " " * (n - 2) + "x",
    "whitespace_mix": lambda n: rep("\n \t\u00a0", n),
    "apostrophes": lambda n: rep("a'", n),
    "same_line": lambda n: rep("same line\n", n),
    "mojibake_lines": lambda n: rep("caf\u00c3\u00a9 \n", n),
    "c1_controls": lambda n: rep("\x80\x81", n),
}
STAGE_SHAPES = {
    "normalize": list(TEXT_SHAPES),
    "quality": list(TEXT_SHAPES),
    "pii": list(TEXT_SHAPES),
    "decontaminate": ["ordinary", "all_grams_hit", "one_word_run", "dot_runs"],
    "url": ["ordinary_url", "many_labels", "regex_nested_plus", "regex_alternation"],
}
STAGES = list(STAGE_SHAPES)

_EVAL = [("eval", ["the cat sat on the mat and the dog ran in the park today", "a " * 13,
                   "people water house light river green stone music paper garden market school city"])]


def build(stage: str, shape: str, n: int):
    """(function, argument) for one figure."""
    if stage == "url":
        # The URL is the document: its host labels, and regexes searched in it.
        lists = UrlList([("example.com", "block.txt", 1), ("ads.example.org", "block.txt", 2),
                         ("re:^https?://[^/]*casino", "block.txt", 3)])
        if shape.startswith("regex_"):
            regex = {"regex_nested_plus": "(a+)+$", "regex_alternation": "(a|aa)+$"}[shape]
            lists = UrlList([(f"re:{regex}", "block.txt", 1)])
        url = {"ordinary_url": lambda: "http://www.example.net/" + rep("path/", n - 23),
               "many_labels": lambda: "http://" + rep("a.", n - 11) + "com/",
               "regex_nested_plus": lambda: "http://x.com/" + "a" * (n - 14) + "!",
               "regex_alternation": lambda: "http://x.com/" + "a" * (n - 14) + "!"}[shape]()
        return lists.match, url
    text = {"all_grams_hit": lambda: rep("a ", n), "one_word_run": lambda: rep("people ", n)}.get(
        shape, lambda: TEXT_SHAPES[shape](n))()
    if stage == "normalize":
        cfg = NormalizeConfig()
        return (lambda t: normalize_text(t, cfg)), text
    if stage == "quality":
        cfg = QualityConfig()
        return (lambda t: signals(t, "en", cfg)), text
    if stage == "pii":
        return (lambda t: redact(t, ALL_PII)), text
    grams = EvalGrams.build(_EVAL, 13, 8)
    return (lambda t: (decontaminate({"text": t}, grams, "drop"), decontaminate({"text": t}, grams, "cut"))), text


def _child(conn, stage: str, shape: str, n: int, repeat: int) -> None:
    fn, arg = build(stage, shape, n)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(arg)
        best = min(best, time.perf_counter() - t0)
    conn.send(best)


def measure(stage: str, shape: str, n: int, repeat: int, cap: float) -> float | None:
    """Best seconds of ``repeat`` runs, or None past ``cap`` (the child is killed: a regex in
    C cannot be interrupted in-process)."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, stage, shape, n, repeat))
    proc.start()
    took = recv.recv() if recv.poll(cap) else None
    proc.kill()
    proc.join()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1_000_000, help="characters per document (default 1,000,000)")
    ap.add_argument("--cap", type=float, default=60.0, help="seconds after which a figure is given up (> cap)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per figure; the best is kept")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--shapes", default="", help="only these shapes (the ordinary one is always measured)")
    args = ap.parse_args()
    wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(STAGES))
    if unknown:
        ap.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    only = {s.strip() for s in args.shapes.split(",") if s.strip()}
    print(f"hostile: {args.size:,} characters per document, best of {args.repeat}, cap {args.cap:.0f} s; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs at start")
    print(f"{'stage':<14} {'shape':<18} {'seconds':>9} {'x ordinary':>10}")
    for stage in wanted:
        shapes = STAGE_SHAPES[stage]
        base = None
        for i, shape in enumerate(shapes):
            if i and only and shape not in only:
                continue
            took = measure(stage, shape, args.size, args.repeat, args.cap)
            if i == 0:
                base = took
            shown = f"{took:9.4f}" if took is not None else f"{'> ' + format(args.cap, '.0f'):>9}"
            ratio = f"{took / base:10.1f}" if took is not None and base else f"{'-':>10}"
            print(f"{stage:<14} {shape:<18} {shown} {ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

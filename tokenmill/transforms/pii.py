"""PII redaction: e-mail addresses, phone numbers, IPv4/IPv6 addresses, payment cards
(Luhn-checked), IBANs (mod-97 checked) and common secret formats, replaced with typed
placeholders (``<EMAIL>``, ``<PHONE>``, ``<IP>``, ``<CARD>``, ``<IBAN>``, ``<SECRET>``).

Patterns are written to miss version numbers (3.11.2), dates (2024-05-01), prices and plain
digit runs: phones need a leading ``+`` or the (555) 010-0199 / 555-010-0199 shapes, IPs and
cards are validated (``ipaddress``, Luhn) before they are replaced.

Unlike the filter stages, redaction also runs on documents an earlier stage dropped: their
text lands in the docs Parquet too, and must not leak what the survivors do not. A document
whose deadline (``pii.timeout_s``) passes loses its text, dropped or not: it is published
empty (``pii:timeout`` when it was live), never half redacted.

Every pass is linear in the text. A pattern that could start again at each position of a long
run it has just scanned (an e-mail's local part, a JWT's first segment, a key without an END
line) either cannot start inside the run (a lookbehind fails there at once) or, where it fails,
consumes the run in a match that changes nothing: a later start in the run would scan the same
run to the same failure.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter

import pyarrow as pa

from tokenmill.transforms.stage_base import Stage, StageFn, check, count

# PEM private keys, from BEGIN to the first END line after it. Without an END line the match
# (no "key" group, left as it is) takes the rest of the text: every later BEGIN would search
# the same rest in vain (quadratic in the number of BEGIN lines).
_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"
                  r"(?:(?P<key>[\s\S]+?-----END [A-Z ]*PRIVATE KEY-----)|[\s\S]*+)")
# JWTs: three base64url segments joined by dots, the first starting with "eyJ" at a word start
# ("eyJ(?<!\weyJ)" is "\beyJ", with a literal first). Each segment runs to the end of its run
# of base64url characters (possessive: "." is not one of them). A start that fails takes the
# rest of its run (no "jwt" group, left as it is): a later "eyJ" in it ("eyJ-eyJ-...") would
# reach the same end and fail too.
_JWT = re.compile(r"eyJ(?<!\weyJ)(?:(?P<jwt>[0-9A-Za-z_-]{10,}+\.[0-9A-Za-z_-]{10,}+\.[0-9A-Za-z_-]{10,}+)"
                  r"|[0-9A-Za-z_-]*+)")
# The other formats: a literal prefix, then characters up to a minimum, nothing to fail after.
_SECRET = re.compile(
    r"\b(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{16,}"
    r"|\bgh[pousr]_[0-9A-Za-z]{30,}|\bgithub_pat_[0-9A-Za-z_]{40,}"
    r"|\bAKIA[0-9A-Z]{16}\b|\bAIza[0-9A-Za-z_-]{35}\b|\bxox[abprs]-[0-9A-Za-z-]{10,}"
    r"|\bglpat-[0-9A-Za-z_-]{20,}"
)
# Literals one of which every _SECRET alternative contains: most texts have none, and this
# search is much cheaper than _SECRET's word-boundary alternatives (bench/MEASUREMENTS.md:
# secret marker).
_SECRET_MARKER = re.compile(r"_live_|_test_|gh[pousr]_|github_pat_|AKIA|AIza|xox[abprs]-|glpat-")
# E-mail addresses: "\b[A-Za-z0-9._%+-]+@" + domain, matched in linear time. The local part
# runs back to the first word boundary of its run of local-part characters; so the pattern
# starts only at a run's start (a start inside the run fails at its lookbehind, where
# "\b[...]+" scanned the rest of the run again) and skips the run's characters that precede
# its first word boundary: after a non-word character (or at the text's start), the leading
# ". % + -"; after a word character (a non-ASCII letter), the leading ASCII word characters.
_LOCAL = "A-Za-z0-9._%+-"
_ADDRESS = rf"[{_LOCAL}]++@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{{2,}}\b"
_EMAIL = re.compile(rf"(?<![{_LOCAL}])(?:(?<!\w)[.%+-]*+|(?<=\w)[A-Za-z0-9_]*+)(?={_ADDRESS})")
_EMAIL_AT = re.compile(_ADDRESS)
# Speed: each pattern below starts with a character (class), not with its boundary check, and
# checks the boundary right after it with a lookbehind: "\d(?<![\d.-]\d)" is
# "(?<![\d.-])\d". Python's re then jumps from candidate to candidate instead of trying the
# whole pattern at every position (same matches; bench/MEASUREMENTS.md: PII boundary checks).
_IBAN = re.compile(r"[A-Z](?<!\w[A-Z])[A-Z]\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b")
# "Not followed by a digit, or by a dot and a digit": a sentence's full stop may follow.
_CARD = re.compile(r"\d(?<![\d.-]\d)(?:[ -]?\d){12,18}(?![\d-]|\.\d)")
_IPV4 = re.compile(r"\d(?<![\d.]\d)\d{0,2}\.(?:\d{1,3}\.){2}\d{1,3}(?!\d|\.\d)")
_IPV6 = re.compile(r"(?<![0-9A-Za-z:])(?=[0-9A-Fa-f:]*:[0-9A-Fa-f:]*:)[0-9A-Fa-f:]{3,39}(?![0-9A-Za-z:])")
_PHONE = re.compile(
    r"\+(?<![\w+]\+)\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){1,4}(?!\w)"
    r"|\((?<!\w\()\d{3}\) ?\d{3}[ .-]\d{4}(?!\w)"
    r"|\d(?<![\w.-]\d)\d{2}[ .-]\d{3}[ .-]\d{4}(?![\w.-])"
)


def luhn_ok(digits: str) -> bool:
    total, parity = 0, len(digits) % 2
    for i, ch in enumerate(digits):
        d = int(ch)
        if i % 2 == parity:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_ok(candidate: str) -> bool:
    s = candidate.replace(" ", "")
    if not 15 <= len(s) <= 34:
        return False
    rearranged = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


def _email_sub(repl, text: str) -> str:
    """``re.sub(r"\b[A-Za-z0-9._%+-]+@<domain>", repl, text)``, in linear time (see _EMAIL)."""
    out, done, pos = [], 0, 0
    while (start := _EMAIL.search(text, pos)) is not None:
        m = _EMAIL_AT.match(text, start.end())
        while m is not None:
            out += [text[done:m.start()], repl(m)]
            done = pos = m.end()
            # The domain ended inside a run ("a@b.com.c@d.org"): the word boundary after its last
            # letter is where "\b[...]+@" starts next, with the rest of the run.
            m = _EMAIL_AT.match(text, pos)
    out.append(text[done:])
    return "".join(out)


def _card(m: re.Match) -> str | None:
    digits = re.sub(r"\D", "", m.group())
    return "<CARD>" if 13 <= len(digits) <= 19 and len(set(digits)) > 1 and luhn_ok(digits) else None


def _ip(m: re.Match) -> str | None:
    # The class the pattern can match (ip_address tries IPv4 first: a failed try, and its
    # exception, for every IPv6 candidate).
    try:
        (ipaddress.IPv6Address if ":" in m.group() else ipaddress.IPv4Address)(m.group())
    except ValueError:
        return None
    return "<IP>"


def _phone(m: re.Match) -> str | None:
    return "<PHONE>" if len(re.sub(r"\D", "", m.group())) >= 7 else None


# Order matters: secrets and e-mails first (they contain digits), cards before phones. Keys
# come first among secrets (in one alternation, a token running into a BEGIN line, as
# "xoxb-1234567890-----BEGIN", won and left the key's body), then JWTs.
# Each kind: (name, sub(repl, text) as re.Pattern.sub, check of a match, a cheap test the text
# must pass to be searched).
_KINDS = [
    ("secret", _KEY.sub, lambda m: "<SECRET>" if m.group("key") else None, lambda t: "PRIVATE KEY" in t),
    ("secret", _JWT.sub, lambda m: "<SECRET>" if m.group("jwt") else None, lambda t: "eyJ" in t),
    ("secret", _SECRET.sub, lambda m: "<SECRET>", lambda t: _SECRET_MARKER.search(t) is not None),
    ("email", _email_sub, lambda m: "<EMAIL>", lambda t: "@" in t),
    ("iban", _IBAN.sub, lambda m: "<IBAN>" if iban_ok(m.group()) else None, None),
    ("card", _CARD.sub, _card, None),
    ("ip", _IPV4.sub, _ip, lambda t: "." in t),
    ("ip", _IPV6.sub, _ip, lambda t: t.count(":") >= 2),
    ("phone", _PHONE.sub, _phone, None),
]
KINDS = list(dict.fromkeys(kind for kind, *_ in _KINDS))  # each kind once: the docs' pii column


def redact(text: str, kinds: list[str], deadline: float | None = None) -> tuple[str, Counter]:
    """``text`` with PII replaced, and the number of replacements per kind. ``deadline``
    (time.monotonic()) is checked before each pass: past it, ``deadline.Timeout``."""
    found: Counter = Counter()
    for kind, pattern_sub, verify, maybe in _KINDS:
        if kind not in kinds or (maybe is not None and not maybe(text)):
            continue
        check(deadline)

        def sub(m: re.Match, kind=kind, verify=verify) -> str:
            out = verify(m)
            if out is None:
                return m.group()
            found[kind] += 1
            return out

        text = pattern_sub(sub, text)
    return text, found


# ---------------------------------------------------------------- Beam wrapper


class PiiFn(StageFn):
    """Redacts every document that has text, dropped or not (see the module docstring)."""

    stage = "pii"
    on_dropped = True

    def apply(self, doc):
        if doc.get("text"):
            doc["text"], found = redact(doc["text"], self.cfg.kinds, self.deadline)
            doc["pii"] = dict(found)
            for kind, n in found.items():
                count(f"pii.{kind}", n)
        return doc

    def timed_out(self, doc):
        # Text that was not redacted in time is not published: the row keeps no text, and a
        # live document is dropped (pii:timeout); a dropped one keeps its first reason.
        doc["text"] = None
        count("pii.timeout")
        return super().timed_out(doc)


# Redactions per kind: a struct column (HF datasets reads structs, not Arrow maps).
# The stored text is its result (refilter keeps it); it changed a document's text where it
# replaced something, or took the text away (pii:timeout).
SPEC = Stage("pii", "pii", PiiFn, fields=lambda cfg: [pa.field("pii", pa.struct([(k, pa.int32()) for k in KINDS]))],
             changed_text=lambda doc: doc.get("text") is None or any((doc.get("pii") or {}).values()))

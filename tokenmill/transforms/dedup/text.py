"""What dedup compares: the exact-match text and its hash, and the word tokens and shingles
the MinHash signatures are built from."""

from __future__ import annotations

import re

import xxhash

_WORD = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")
_WORD_ASCII = re.compile(rb"\w+")
_DIGITS_TO_0 = bytes.maketrans(b"123456789", b"000000000")


def utf8(s: str) -> bytes:
    # surrogatepass: a lone surrogate (from a lossy decode upstream) must not crash the stage.
    return s.encode("utf-8", "surrogatepass")


def normalise_exact(text: str | None) -> str:
    """Text for the exact hash: lower-cased, whitespace runs collapsed to one space, stripped."""
    # str.split() splits on exactly the characters re's \s matches (str.isspace), and faster.
    return " ".join((text or "").lower().split())


def exact_hash(text: str | None) -> bytes:
    """16-byte xxh3-128 of ``normalise_exact(text)`` (128 bits: no accidental merges at 1e10 docs)."""
    return exact_hash_lower((text or "").lower())


def exact_hash_lower(low: str) -> bytes:
    """``exact_hash`` of an already lower-cased text: dedup lower-cases each text once, for both hashes."""
    return xxhash.xxh3_128_digest(utf8(" ".join(low.split())))


def tokens(text: str | None) -> list[str]:
    """Near-dup tokens: lower-cased ``\\w+`` runs (punctuation dropped), every digit folded to 0."""
    return lower_tokens((text or "").lower())


def lower_tokens(low: str) -> list[str]:
    return _WORD.findall(_DIGIT.sub("0", low))


def token_spans(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """``tokens`` with their character spans in ``text`` (matched on ``text`` itself, each
    token lower-cased: the same tokens but where lower-casing changes a text's length)."""
    found = list(_WORD.finditer(text))
    return [_DIGIT.sub("0", m.group().lower()) for m in found], [m.span() for m in found]


def has_tokens(text: str | None) -> bool:
    """Whether ``text`` has any near-dup token (else it gets no signature)."""
    return bool(_WORD.search(text or ""))


def token_bytes(low: str) -> list[bytes]:
    """``tokens`` of a lower-cased text as UTF-8 bytes. An ASCII text takes a faster road with
    the same result: bytes.translate folds the digits, and on ASCII ``\\w`` is [A-Za-z0-9_]
    for bytes and str patterns alike."""
    if low.isascii():
        return _WORD_ASCII.findall(low.encode("ascii").translate(_DIGITS_TO_0))
    toks = lower_tokens(low)
    # Encoded in one go, not token by token (same bytes).
    return utf8(" ".join(toks)).split(b" ") if toks else []


def shingles(toks: list[str], n: int) -> list[str]:
    """Space-joined word n-grams; fewer than ``n`` tokens make one shingle; none make none."""
    if not toks:
        return []
    if len(toks) < n:
        return [" ".join(toks)]
    return [" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)]

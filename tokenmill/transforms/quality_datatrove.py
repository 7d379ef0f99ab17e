"""`quality.compat=datatrove`: the signals as datatrove 0.10.1's filters compute them.

GopherQualityFilter, GopherRepetitionFilter, C4QualityFilter and FineWebQualityFilter, each with
its defaults: words are the tokens of spaCy's blank English pipeline, which is datatrove's word
tokenizer for English and, with its defaults (language=english), for every document, punctuation
tokens included; stop words are Gopher's English list, matched case-sensitively and for every
language; n-grams are the tokens as they are (case kept), joined with a space for the top n-gram
and without one for duplicate n-grams; fractions are over the whole text's characters.
tests/test_quality_compat.py runs datatrove's own classes beside this on real pages and asserts
equal verdicts per rule.

The character tables below are datatrove's (datatrove/utils/text.py, Apache-2.0), written out
because importing datatrove would pull dependencies that apache-beam's pins exclude; the same
test checks them against the installed datatrove.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from tokenmill.errors import UserError
from tokenmill.transforms.stage_base import check

# datatrove.utils.text.TERMINAL_PUNCTUATION: FineWeb's terminal marks (no quotes, no ellipsis).
TERMINAL_PUNCTUATION = tuple(
    "!.?\u0589\u061d\u061e\u061f\u06d4\u0700\u0701\u0702\u07f9\u0837\u0839\u083d\u083e\u0964\u0965\u104a\u104b\u1362\u1367\u1368\u166e\u1735\u1736\u17d4\u17d5\u17d6\u17d9\u17da\u1803\u1809\u1944\u1945\u1aa8\u1aa9\u1aaa\u1aab\u1b5a\u1b5b\u1b5e\u1b5f\u1b7d\u1b7e\u1c3b\u1c3c\u1c7e\u1c7f\u203c\u203d\u2047\u2048\u2049\u2e2e\u2e3c\u2e53\u2e54\u3002\ua4ff\ua60e\ua60f\ua6f3\ua6f7\ua876\ua877\ua8ce\ua8cf\ua92f\ua9c8\ua9c9\uaa5d\uaa5e\uaa5f\uaaf0\uaaf1\uabeb\ufe52\ufe56\ufe57\uff01\uff0e\uff1f\uff61\U00010a56\U00010a57\U00010f55\U00010f56\U00010f57\U00010f58\U00010f59\U00010f86\U00010f87\U00010f88\U00010f89\U00011047\U00011048\U000110be\U000110bf\U000110c0\U000110c1\U00011141\U00011142\U00011143\U000111c5\U000111c6\U000111cd\U000111de\U000111df\U00011238\U00011239\U0001123b\U0001123c\U000112a9\U0001144b\U0001144c\U000115c2\U000115c3\U000115c9\U000115ca\U000115cb\U000115cc\U000115cd\U000115ce\U000115cf\U000115d0\U000115d1\U000115d2\U000115d3\U000115d4\U000115d5\U000115d6\U000115d7\U00011641\U00011642\U0001173c\U0001173d\U0001173e\U00011944\U00011946\U00011a42\U00011a43\U00011a9b\U00011a9c\U00011c41\U00011c42\U00011ef7\U00011ef8\U00011f43\U00011f44\U00016a6e\U00016a6f\U00016af5\U00016b37\U00016b38\U00016b44\U00016e98\U0001bc9f\U0001da88")
# datatrove.utils.text.PUNCTUATION_SET: a token made only of these is a symbol, not a word.
PUNCTUATION_SET = frozenset(
    "!/\u2014\u201d:\uff05\uff11\u3008&(\u3001\u2501\\\u3010#%\u300c\u300d\uff0c\u3011\uff1b+^]~\u201c\u300a\u201e';\u2019{|"
    "\u2236\u00b4[=-`*\uff0e\uff08\u2013\uff1f\uff01\uff1a$\uff5e\u00ab\u3009,><\u300b)?\uff09\u3002\u2026@_.\"}\u25ba\u00bb"
    + "".join(map(chr, (x for a, b in ((0, 9), (11, 13), (13, 32), (127, 160)) for x in range(a, b))))
).union(TERMINAL_PUNCTUATION)
STOP_WORDS = frozenset(("the", "be", "to", "of", "and", "that", "have", "with"))  # GopherQualityFilter's
C4_END_MARKS = (".", "?", "!", '"', "'")  # C4QualityFilter's END_PUNCTUATION (C4's code: no "'")
C4_MIN_WORDS_PER_LINE = 3  # C4QualityFilter's defaults (C4's code: 5 words, 3 sentences)
C4_MIN_SENTENCES = 5

_PARAGRAPHS = re.compile(r"\n{2,}")
_LINES = re.compile("\n+")

_NLP = None


def _nlp():
    """spaCy's blank English pipeline with its sentencizer, as datatrove's SpaCyTokenizer builds it."""
    global _NLP
    if _NLP is None:
        try:
            import spacy
        except ImportError:
            raise UserError("quality.compat=datatrove needs spaCy, datatrove's word tokenizer: "
                            "pip install 'tokenmill[compat]'") from None
        nlp = spacy.blank("en")
        nlp.add_pipe("sentencizer")
        _NLP = nlp
    return _NLP


def words(text: str) -> list[str]:
    """datatrove's split_into_words(text) for English: spaCy's tokens, stripped, blanks left out.
    Inside a memory zone: the strings a document adds to spaCy's vocabulary are freed after it."""
    nlp = _nlp()
    with nlp.memory_zone():
        return [t for t in (tok.text.strip() for tok in nlp.tokenizer(text)) if t]


def sentences(line: str) -> int:
    """len(datatrove's split_into_sentences(line)): the sentencizer's sentences, at least one."""
    nlp = _nlp()
    with nlp.memory_zone():
        nlp.max_length = len(line) + 10
        return max(1, sum(1 for _ in nlp(line).sents))


def duplicates(items: list[str]) -> tuple[int, int]:
    """(items that repeat an earlier one, their characters): datatrove's find_duplicates, and
    Gopher's duplicate lines and paragraphs."""
    seen: set[str] = set()
    dup = dup_chars = 0
    for it in items:
        if it in seen:
            dup += 1
            dup_chars += len(it)
        else:
            seen.add(it)
    return dup, dup_chars


def _top_ngram_chars(tokens: list[str], n: int) -> int:
    """find_top_duplicate(get_n_grams(tokens, n)): the most frequent n-gram (the first seen on a
    tie, a unique one too), space-joined, times its count; 0 with no n-gram."""
    if len(tokens) < n:
        return 0
    gram, count = Counter(" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1)).most_common(1)[0]
    return len(gram) * count


def _dup_ngram_chars(tokens: list[str], n: int) -> int:
    """find_all_duplicate: characters of repeated n-grams (joined without spaces), a repeat
    skipping past itself."""
    unique: set[str] = set()
    chars = idx = 0
    while idx < len(tokens) - n + 1:
        gram = "".join(tokens[idx:idx + n])
        if gram in unique:
            chars += len(gram)
            idx += n
        else:
            unique.add(gram)
            idx += 1
    return chars


def gopher(text: str, tokens: list[str]) -> dict[str, Any]:
    n_tokens = len(tokens) or 1  # datatrove divides by zero on a text without tokens
    non_symbol = [w for w in tokens if any(ch not in PUNCTUATION_SET for ch in w)]
    lines = text.splitlines() or [""]
    return {
        "n_words": len(non_symbol),
        # np.mean of no words is nan, which no threshold breaks: None (no value) here.
        "mean_word_len": sum(map(len, non_symbol)) / len(non_symbol) if non_symbol else None,
        "hash_word_ratio": text.count("#") / n_tokens,
        "ellipsis_word_ratio": (text.count("...") + text.count("\u2026")) / n_tokens,
        "bullet_line_ratio": sum(s.lstrip().startswith(("\u2022", "-")) for s in lines) / len(lines),
        "ellipsis_line_ratio": sum(s.rstrip().endswith(("...", "\u2026")) for s in lines) / len(lines),
        "alpha_word_ratio": sum(any(c.isalpha() for c in w) for w in tokens) / n_tokens,
        "stop_words": len(STOP_WORDS.intersection(tokens)),
    }


def repetition(text: str, tokens: list[str], deadline: float | None) -> dict[str, Any]:
    size = len(text) or 1
    paragraphs = _PARAGRAPHS.split(text.strip())
    dup, dup_chars = duplicates(paragraphs)
    s: dict[str, Any] = {"dup_para_frac": dup / len(paragraphs), "dup_para_char_frac": dup_chars / size}
    lines = _LINES.split(text)
    dup, dup_chars = duplicates(lines)
    s["dup_line_frac"], s["dup_line_char_frac"] = dup / len(lines), dup_chars / size
    check(deadline)
    for n in (2, 3, 4):
        s[f"top_{n}gram_frac"] = _top_ngram_chars(tokens, n) / size
        check(deadline)
    for n in range(5, 11):
        s[f"dup_{n}gram_frac"] = _dup_ngram_chars(tokens, n) / size
        check(deadline)
    return s

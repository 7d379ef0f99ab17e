"""Normalisation: Unicode repair, straight quotes, whitespace collapsed with line breaks kept.

ftfy does the repair (mojibake such as "cafÃ©", HTML entities left in text, control
characters) and the quote straightening in one pass. The seed recipes' destructive steps
(ASCII only, lowercase, dropping 1-2 letter words) run only when asked for.
"""

from __future__ import annotations

import re
import unicodedata

import ftfy
from ftfy.fixes import uncurl_quotes

from tokenmill.config import NormalizeConfig
from tokenmill.transforms.doc import drop
from tokenmill.transforms.stage_base import Stage, StageFn, check

# Horizontal whitespace of every script (NBSP, thin/em spaces, ideographic space, tabs...).
_HSPACE = re.compile(r"[^\S\n]+")
# Zero-width characters and soft hyphens: invisible, but they split words for every later stage.
_INVISIBLE = re.compile("[\u00ad\u200b\u200c\u200d\u2060\ufeff]")
_BLANK_RUNS = re.compile(r"\n{3,}")
_SHORT_WORD = re.compile(r"(?<!\w)\w{1,2}(?!\w)")
# What ftfy can change in ASCII text: HTML entities, terminal escapes, control characters, CR.
# Every other fix (mojibake, quotes, ligatures, widths, NFC/NFKC) needs a non-ASCII character.
_FTFY_ASCII_WORK = re.compile(r"[&\x00-\x08\x0b-\x1f\x7f]")


def needs_ftfy(text: str) -> bool:
    """False when ftfy would return ``text`` unchanged, known without running it."""
    return not text.isascii() or _FTFY_ASCII_WORK.search(text) is not None


def fix_unicode(text: str, config: ftfy.TextFixerConfig, deadline: float | None = None) -> str:
    """``ftfy.fix_text(text, config)``, faster on web text: the same loop (one segment per
    line, HTML unescaping off from the first line with a "<"), but a line ftfy would leave as
    it is (plain ASCII, the common case even in non-English pages) skips ftfy's dozen passes,
    and a line seen before (with the same settings) gets the answer ftfy gave it then: ftfy
    has a fixed cost per call, so a page of short repeated non-ASCII lines ("\u00a0") would
    cost many times ordinary text (bench/MEASUREMENTS.md: fix_unicode skips and remembers).
    ``deadline`` (time.monotonic()) is checked before each call of ftfy."""
    out, pos = [], 0
    fixed: dict[str, str] = {}
    while pos < len(text):
        end = text.find("\n", pos) + 1 or len(text)
        end = min(end, pos + config.max_decode_length)
        segment = text[pos:end]
        if config.unescape_html == "auto" and "<" in segment:
            config = config._replace(unescape_html=False)
            fixed = {}
        if needs_ftfy(segment):
            done = fixed.get(segment)
            if done is None:
                check(deadline)
                done = fixed[segment] = ftfy.fix_and_explain(segment, config)[0]
            segment = done
        out.append(segment)
        pos = end
    return "".join(out)


def normalize_text(text: str, cfg: NormalizeConfig, deadline: float | None = None) -> str:
    """``text`` normalised as ``cfg`` says; ``deadline`` (time.monotonic()) is checked between
    the passes, each linear in the text: past it, ``deadline.Timeout``."""
    if cfg.fix_unicode:
        text = fix_unicode(text, ftfy.TextFixerConfig(
            explain=False,
            uncurl_quotes=cfg.straight_quotes,
            normalization=None if cfg.unicode_form == "none" else cfg.unicode_form,
            # ftfy would turn fullwidth CJK punctuation into ASCII: that changes CJK text.
            fix_character_width=False,
        ), deadline)
    else:
        if cfg.straight_quotes:
            text = uncurl_quotes(text)
        if cfg.unicode_form != "none":
            text = unicodedata.normalize(cfg.unicode_form, text)
    if cfg.lowercase:
        text = text.lower()
    if cfg.ascii_only:
        text = text.encode("ascii", "ignore").decode("ascii")
    check(deadline)
    if cfg.drop_short_words:
        text = _SHORT_WORD.sub("", text)
    if cfg.collapse_whitespace or cfg.drop_short_words:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        text = _INVISIBLE.sub("", text)
        lines = (_HSPACE.sub(" ", line).strip() for line in text.split("\n"))
        text = _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip()
    return text


# ---------------------------------------------------------------- Beam wrapper


class NormalizeFn(StageFn):
    stage = "normalize"

    def apply(self, doc):
        doc["text"] = normalize_text(doc["text"] or "", self.cfg, self.deadline)
        return doc if doc["text"] else drop(doc, self.stage, "empty")


SPEC = Stage("normalize", "normalize", NormalizeFn, changed_text=lambda doc: True)  # the stored text is its result

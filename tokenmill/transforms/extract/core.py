"""The entry point: ``extract_html`` runs sniff, decode, parse, walk and content choice on one
page under one deadline, and turns every failure into a reason."""

from __future__ import annotations

import time
import unicodedata
from dataclasses import dataclass

from tokenmill.transforms.deadline import Timeout, check

from .blocks import Page
from .content import assemble, main_blocks, polish, title_heading
from .decode import decode_page
from .sniff import looks_binary, looks_binary_text
from .tree import parse_page


@dataclass
class Extracted:
    # The main text, None when dropped: paragraphs (p, headings, div-level runs of text, whole
    # lists and tables) separated by a blank line; list items, table rows and <br> lines by one
    # newline.
    text: str | None
    # None on success, else "too_large", "timeout", "binary_content", "no_text" or "parse_error".
    reason: str | None
    title: str | None = None
    # The encoding that was used to decode the bytes (None for str input).
    encoding: str | None = None


def _nfc(text: str | None) -> str | None:
    """Composed Unicode (NFC): the same word is then the same code points whatever the page's
    editor produced (decomposed accents and Bengali nukta are common). Soft hyphens go: they
    are hyphenation hints, invisible on the page, and split the words they sit in ("auto\xadnome").
    (The normalize stage removes them too, with the zero-width characters; extract_html's text
    is also used without it, and the zero-width ones are kept here: they join in some scripts.)"""
    if text and not text.isascii():
        if "\xad" in text:
            text = text.replace("\xad", "")
        if not unicodedata.is_normalized("NFC", text):
            return unicodedata.normalize("NFC", text)
    return text


_NOSCRIPT_MIN = 200  # characters of main text the fallback must find to be believed
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _noscript_contents(text: str) -> list[str]:
    """What each <noscript>...</noscript> of ``text`` holds, in one pass (a pattern's lazy
    match would scan to the end again from every unclosed <noscript>: quadratic)."""
    low = text.translate(_ASCII_LOWER)  # the offsets stay those of ``text``
    out, i = [], 0
    while (i := low.find("<noscript", i)) >= 0:
        if low[i + 9 : i + 10] not in (" ", "\t", "\n", "\r", "\f", "/", ">"):  # not the name (<noscripts>)
            i += 9
            continue
        gt = low.find(">", i + 9)
        if gt < 0:
            break
        end = low.find("</noscript", gt + 1)
        if end < 0:  # unclosed: nothing later is closed either
            break
        out.append(text[gt + 1:end])
        i = end + 10
    return out


def _content(pg: Page, title: str | None, deadline: float) -> tuple[list[int], str | None]:
    """The page's main content (blocks) and its title: the headline where one repeats the
    <title> (cleaner than it; left out of the blocks, as metadata)."""
    blocks, before = main_blocks(pg, deadline)
    headline = title_heading(pg, title, blocks, before)
    if headline is not None:
        title = pg.b_text[headline].replace("\n", " ")
        blocks = [j for j in blocks if j != headline]
    return polish(pg, blocks), title


def _noscript_fallback(text: str, title: str | None, deadline: float) -> tuple[Page, list[int], str | None] | None:
    """The main text of the page's <noscript> content, for a page whose own text is empty: a
    page that writes its body with a script (Blogger's, for one) gives readers without
    scripts the same body in <noscript>. Elsewhere <noscript> stays junk (tracking pixels,
    "please enable JavaScript"); here too only a real text (200+ characters) is believed."""
    inner = _noscript_contents(text)
    if sum(map(len, inner)) < _NOSCRIPT_MIN:
        return None
    parsed = parse_page("<html><body>" + "\n".join(inner) + "</body></html>", deadline)
    if parsed is None:
        return None
    pg = parsed[1]
    blocks, title = _content(pg, title, deadline)
    if sum(pg.b_len[j] for j in blocks) < _NOSCRIPT_MIN:
        return None
    return pg, blocks, title


def extract_html(
    raw: bytes | str,
    *,
    encoding_hint: str | None = None,
    url: str | None = None,
    max_bytes: int = 5_000_000,
    timeout_s: float = 5.0,
    include_title: bool = False,
) -> Extracted:
    """The main text of one HTML page. Never raises; see the package docstring.

    ``encoding_hint`` is the charset from the HTTP header, if any. ``max_bytes`` bounds the
    input (characters for a str), ``timeout_s`` the whole call. ``url`` is accepted for the
    pipeline's sake (and for future per-URL rules); the extraction does not use it. The title
    is always returned in ``title``; with ``include_title`` it is also the first line of text
    (otherwise a headline that repeats it is left out of the text, as it is metadata).
    """
    deadline = time.monotonic() + timeout_s
    encoding = None
    title = None
    try:
        if raw is None:
            return Extracted(None, "no_text")
        if len(raw) > max_bytes:
            return Extracted(None, "too_large")
        if isinstance(raw, (bytes, bytearray, memoryview)):
            raw = bytes(raw)
            if looks_binary(raw):
                return Extracted(None, "binary_content")
            # text: None where utf8 holds it (made only if needed: most pages never need it)
            text, encoding, utf8 = decode_page(raw, encoding_hint, lazy=True)
            if utf8 is not None and b"\x00" in utf8:
                text, utf8 = utf8.decode("utf-8"), None
        elif isinstance(raw, str):
            text, utf8 = raw, None
            if looks_binary_text(text):
                return Extracted(None, "binary_content")
        else:
            return Extracted(None, "parse_error")
        if utf8 is None and "\x00" in text:
            text = text.replace("\x00", "")
        whole = text if text is not None else utf8  # (a page of Unicode spaces only finds no text later)
        if not whole or whole.isspace():
            return Extracted(None, "no_text", encoding=encoding)
        check(deadline)
        parsed = parse_page(text, deadline, utf8)
        if parsed is None:
            return Extracted(None, "no_text", encoding=encoding)
        title, pg = parsed
        blocks, title = _content(pg, title, deadline)
        if not blocks:
            text = text if text is not None else utf8.decode("utf-8")
            pg, blocks, title = _noscript_fallback(text, title, deadline) or (pg, blocks, title)
        if not blocks and not (include_title and title):
            return Extracted(None, "no_text", title=title, encoding=encoding)
        text = assemble(pg, blocks, title if include_title else None)
        return Extracted(_nfc(text), None, title=_nfc(title), encoding=encoding)
    except Timeout:
        return Extracted(None, "timeout", title=title, encoding=encoding)
    except Exception:  # noqa: BLE001 - the contract: a parser failure is a reason, never a crash
        return Extracted(None, "parse_error", title=title, encoding=encoding)

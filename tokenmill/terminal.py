"""Text from data, made safe to show on a terminal.

Document ids, URLs, language labels, tokenizer pieces, decoded and generated text, file names,
drop reasons and config values come from inputs that anyone may have written. Printed as they
are, an ESC sequence recolours or clears the terminal, hides a hyperlink (OSC 8), sets the
window title or moves the cursor over earlier lines; a bidi override reorders what follows; and
Rich reads ``[link=...]`` as markup or stops with a MarkupError on ``[/]``. Every string from
data that reaches a terminal passes through ``safe`` (plain ``print`` and logging) or ``markup``
(inside a Rich markup string or table cell), and Rich consoles come from ``console`` (no
``:emoji:`` codes read from data).

Control characters (C0 but tab and newline where a block of text keeps them, DEL, C1) and the
invisible direction marks and overrides are shown as Python writes them (``\\x1b``, ``\\u202e``):
visible, and unambiguous to a reader.
"""

from __future__ import annotations

import logging
import re
from typing import Any

# C0 and DEL and C1; ALM, LRM, RLM; the line and paragraph separators; LRE..RLO; LRI..PDI.
_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_BLOCK = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _visible(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(value: Any, newlines: bool = False) -> str:
    """``value`` as text with every control character and direction override shown as an
    escape; ``newlines``: keep newline and tab (a block of text), else one line."""
    s = value if isinstance(value, str) else str(value)
    return (_BLOCK if newlines else _LINE).sub(_visible, s)


def markup(value: Any, newlines: bool = False) -> str:
    """``safe(value)`` to put inside a Rich markup string or table cell: read literally."""
    from rich.markup import escape

    return escape(safe(value, newlines))


def console(**kwargs):
    """A Rich console that reads no ``:name:`` emoji codes (a label ``:warning:`` stays text)."""
    from rich.console import Console

    kwargs.setdefault("emoji", False)
    return Console(**kwargs)


class SafeFormatter(logging.Formatter):
    """A log line with what it quotes (file names, parse errors, URLs) made safe; a traceback
    keeps its lines."""

    def format(self, record: logging.LogRecord) -> str:
        from tokenmill.credentials import redact  # no store credential reaches a log line

        return redact(safe(super().format(record), newlines=True))

"""The cooperative deadline of one document in one stage (extraction, quality, PII, ...): no
signals (Beam runs DoFns in threads), so a stage's loops and passes call ``check(deadline)``
and its caller turns ``Timeout`` into the reason "timeout". Each pass itself must be linear in
the document, or a check can come too late. ``deadline`` is a ``time.monotonic()`` value;
None means no deadline (a pure core called without one never times out)."""

from __future__ import annotations

import time


class Timeout(Exception):
    """The document's deadline has passed (raised by ``check``)."""


def check(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise Timeout

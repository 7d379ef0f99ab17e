"""The cooperative deadline of one extraction: no signals (Beam runs DoFns in threads), so the
long loops call ``_check`` and the entry point turns ``_Timeout`` into the reason "timeout"."""

from __future__ import annotations

import time


class _Timeout(Exception):
    pass


def _check(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise _Timeout

"""Live progress of a local ``prepare``: one line, redrawn every second, in every local mode.

Each worker writes its running counts to a file of its own (transforms/progress_counts.py); the
launcher sums the files (``read_totals``) and draws the line (``Display``). The whole cost is
one tiny file write per worker per second.

On a remote runner the folder is not on this machine: no line is drawn, and the CLI prints the
job id instead.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter

from tokenmill.transforms.progress_counts import INTERVAL


def read_totals(folder: str) -> Counter:
    """The sum of every worker's last written counts."""
    totals: Counter = Counter()
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".json")]
    except OSError:
        return totals
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                totals.update(json.load(fh))
        except (OSError, ValueError):  # being replaced right now: next time
            pass
    return totals


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def progress_line(t: Counter, total_bytes: int, buckets: int, elapsed: float) -> str:
    """The line the launcher draws (a pure function of the totals, for tests)."""
    read_mb, total_mb = t["bytes"] / 2**20, total_bytes / 2**20
    frac = t["bytes"] / total_bytes if total_bytes else 0.0
    rate = t["read"] / elapsed if elapsed > 0 else 0.0
    parts = [f"read {read_mb:,.1f} of {total_mb:,.1f} MB ({100 * frac:.0f}%)", f"{t['read']:,} docs ({rate:,.0f}/s)",
             f"filtered {t['filtered']:,}"]
    if t["buckets"]:
        parts.append(f"kept {t['kept']:,}, duplicates {t['duplicates']:,} ({t['buckets']}/{buckets} buckets written)")
    elif frac >= 1.0:
        parts.append(f"{t['passed']:,} passed cleaning; deduplicating")
    parts.append(f"{_clock(elapsed)} elapsed")
    if 0 < frac < 1.0:
        parts.append(f"ETA {_clock(elapsed * (1 - frac) / frac)} to read")
    return " | ".join(parts)


class Display:
    """Redraws the progress line on stderr (rich) from a thread, while the pipeline runs."""

    def __init__(self, console=None):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.folder: str | None = None
        self.total_bytes, self.buckets = 0, 0
        self.totals: Counter = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, folder: str, total_bytes: int, buckets: int) -> None:
        self.folder, self.total_bytes, self.buckets = folder, total_bytes, buckets
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="tokenmill-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from rich.live import Live
        from rich.text import Text

        with Live(Text(""), console=self.console, refresh_per_second=2, transient=True) as live:
            while not self._stop.wait(INTERVAL):
                self.totals = read_totals(self.folder)
                line = progress_line(self.totals, self.total_bytes, self.buckets, time.monotonic() - self._t0)
                live.update(Text(line, no_wrap=True, overflow="ellipsis"))

    def stop(self) -> None:
        """Stops drawing, with the final totals read once more (the folder must still exist)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self.totals = read_totals(self.folder)
        self._thread = None

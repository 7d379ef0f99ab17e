"""A worker's side of the live progress line: its running counts, written to a file.

Beam reports a worker's counters to the runner only when a bundle ends, and in
multi_processing mode the launcher sees them only at the end of the job. So each worker
process keeps its own running counts (``Reporter``) and writes them, at most once a second
and at the end of every bundle, to a small JSON file of its own in the run's stage folder
(``.tmp/progress/``, never published). The launcher's side (pipelines/progress_line.py) sums the
files and draws the line.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter

KEYS = ("bytes", "read", "filtered", "passed", "kept", "duplicates", "buckets")
INTERVAL = 1.0  # seconds between a worker's writes, and between redraws


class Reporter:
    """A worker process's running counts, written to its own file (atomically: temp + rename)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, f"{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
        self.counts: Counter = Counter()
        self._last = 0.0
        self._lock = threading.Lock()  # a worker may run several bundles on threads

    def add(self, **n: int) -> None:
        with self._lock:
            self.counts.update(n)
            if time.monotonic() - self._last >= INTERVAL:
                self._write()

    def flush(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        self._last = time.monotonic()
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(self.folder, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(dict(self.counts), fh)
            os.replace(tmp, self.path)
        except OSError:  # progress is best effort: never a reason for a job to fail
            pass


_REPORTERS: dict[str, Reporter] = {}
_REPORTERS_LOCK = threading.Lock()


def reporter(folder: str | None) -> Reporter | None:
    """This process's reporter for ``folder`` (one file per process, shared by its DoFns);
    None when there is no local folder to report to."""
    if not folder or "://" in folder:
        return None
    with _REPORTERS_LOCK:
        if folder not in _REPORTERS:
            _REPORTERS[folder] = Reporter(folder)
        return _REPORTERS[folder]

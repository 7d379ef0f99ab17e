"""The local mode of a job given no runner flags: every core, unless in-process is faster.

With no ``--runner``, ``--direct_running_mode`` or ``--direct_num_workers``, a local ``prepare``
or ``refilter`` runs Beam's FnApiRunner in multi_processing mode with one worker per core (warm
workers: pipelines/warm.py), and in-process (one core) where that measures faster: one usable
core, or an input small enough that starting the workers costs more than a second core saves
(bench/default_mode.py measures the crossover). Workers are also held to one per GiB of
available memory. Every mode writes the same bytes (tests/test_runners.py). Any runner flag
given by the user is taken as it is. This module imports nothing of Beam: it runs before the
launcher's imports, so that the workers start while they happen.
"""

from __future__ import annotations

import glob
import os

RUNNER_FLAGS = ("--runner", "--direct_running_mode", "--direct_num_workers")
# Input bytes below which in-process is faster: between 8 MB (in-process 3.29 s, 2 workers
# 3.58 s) and 16 MB (4.38 s, 4.07 s) of real HTML pages on 2 cores (bench/MEASUREMENTS.md).
MIN_BYTES = 12 << 20
GIB = 1 << 30


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def input_bytes(paths: list[str], enough: int) -> int:
    """The bytes of the local files under ``paths`` (files, folders, globs), counted until
    ``enough`` is reached; a remote path counts as ``enough``."""
    total = 0
    for p in paths:
        if "://" in p:
            return enough
        for hit in glob.iglob(p) if glob.has_magic(p) else [p]:
            if os.path.isdir(hit):
                for root, _, files in os.walk(hit):
                    for f in files:
                        try:
                            total += os.stat(os.path.join(root, f)).st_size
                        except OSError:
                            pass
                        if total >= enough:
                            return total
            else:
                try:
                    total += os.stat(hit).st_size
                except OSError:
                    pass
            if total >= enough:
                return total
    return total


def default_flags(beam_args: list[str], inputs: list[str]) -> list[str]:
    """The Beam flags to add for a local job given ``beam_args`` (none when the user chose)."""
    if any(a.split("=", 1)[0] in RUNNER_FLAGS for a in beam_args):
        return []
    workers = min(usable_cores(), max(1, available_memory() // GIB))
    if workers < 2 or input_bytes(inputs, MIN_BYTES) < MIN_BYTES:
        return []
    return ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]

"""Allocator settings that keep a worker's resident memory near what it actually holds.

Applied once per process, on import of ``tokenmill.transforms.stage_base``: every Beam worker of
every runner imports it to unpickle the stages' DoFns, and so does the launcher. The ``tokenmill``
command and its local workers apply them earlier: the Arrow pool before pyarrow loads, malloc's
thresholds before Beam's import (``beamload.import_lean``). Their effect on
peak memory is in the README's performance section (bench/scaling.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import time

# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's own defaults, made fixed: see limit_heap_retention.
_THRESHOLD = 128 * 1024


@functools.cache
def _glibc():
    """The C library when it is glibc (only glibc answers CS_GNU_LIBC_VERSION), else None."""
    try:
        os.confstr("CS_GNU_LIBC_VERSION")
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except (OSError, ValueError, AttributeError):
        return None


def limit_heap_retention() -> bool:
    """Fix glibc's mmap and trim thresholds at 128 KiB; True when applied.

    By default glibc raises its mmap threshold (up to 32 MB) each time a large block is freed,
    so Beam's multi-MB data-plane buffers and encoded bundles then come from the heap, where
    small long-lived objects pin them: a worker's RSS only grew from one stage to the next.
    With fixed thresholds large
    blocks are mmapped and given back on free, and the heap top is trimmed.

    Left alone (False) off glibc (musl, macOS), when the user tunes malloc (any MALLOC_*
    variable, or a glibc.malloc tunable in GLIBC_TUNABLES), and with TOKENMILL_MALLOC_DEFAULTS=1,
    which keeps glibc's adaptive thresholds (faster by a few percent, more memory).
    """
    env = os.environ
    if (env.get("TOKENMILL_MALLOC_DEFAULTS") == "1" or any(k.startswith("MALLOC_") for k in env)
            or "glibc.malloc." in env.get("GLIBC_TUNABLES", "")):
        return False
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _THRESHOLD))


def choose_arrow_pool() -> None:
    """Arrow's system allocator for this process and those it starts, unless the user chose a
    pool: call it before pyarrow's import.

    Arrow's C++ code (Parquet and IPC writers) allocates from the pool that
    ARROW_DEFAULT_MEMORY_POOL names when it first allocates; ``pa.set_memory_pool`` changes only
    pyarrow's own default. Left to mimalloc, those buffers keep freed pages (and a 1 GiB arena)
    for reuse; with the variable set from the start, a worker's peak is lower
    (bench/MEASUREMENTS.md: Arrow's system pool).
    """
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def use_system_arrow_pool() -> None:
    """The same where pyarrow may be loaded already (a cluster's worker imports Beam first):
    pyarrow's default pool now, and the C++ one in the processes this one starts."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") is None:
        choose_arrow_pool()  # before pyarrow's import: in time for its C++ pool if not loaded yet
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())


def give_back() -> None:
    """Returns the free pages of every malloc arena to the OS (glibc's ``malloc_trim``; a no-op
    elsewhere). The finish phase calls it between encode batches (through ``GiveBack``): their
    blocks are freed in the tokenizer's threads' arenas, which the next batch may not reuse."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


class GiveBack:
    """``give_back`` as often as a ``share`` of the wall time allows: after a call that took t
    seconds, the next one waits t / share. One ``malloc_trim`` is cheap on a small heap but
    costly on a large fragmented one, so any fixed spacing is either too rare for a small job or
    too costly for a big one (bench/MEASUREMENTS.md: GiveBack's spacing)."""

    def __init__(self, share: float = 0.05, clock=time.monotonic):
        self._share, self._clock, self._next = share, clock, float("-inf")

    def __call__(self) -> bool:
        """Gives back now if it is time; True when it did."""
        start = self._clock()
        if start < self._next:
            return False
        give_back()
        end = self._clock()
        self._next = end + (end - start) / self._share
        return True


def tame_allocators() -> None:
    limit_heap_retention()
    use_system_arrow_pool()

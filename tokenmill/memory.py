"""Allocator settings that keep a worker's resident memory near what it actually holds.

Applied once per process, on import of ``tokenmill.transforms.stage``: every Beam worker of
every runner imports it to unpickle the stages' DoFns, and so does the launcher. Their effect on
peak memory is in the README's performance section (bench/scaling.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import pyarrow as pa

# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's own defaults, made fixed: see limit_heap_retention.
_THRESHOLD = 128 * 1024


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
    try:
        os.confstr("CS_GNU_LIBC_VERSION")  # only glibc answers this
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, ValueError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _THRESHOLD))


def use_system_arrow_pool() -> None:
    """pyarrow's system allocator instead of its jemalloc pool, unless the user chose one.

    Arrow buffers here are short-lived (Parquet row groups, shard batches). The jemalloc pool
    keeps freed pages for reuse, and over a long run that cache grew with the corpus; the system
    allocator returns them.
    """
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") is None:
        pa.set_memory_pool(pa.system_memory_pool())


def tame_allocators() -> None:
    limit_heap_retention()
    use_system_arrow_pool()

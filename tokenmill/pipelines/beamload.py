"""Beam loaded without the optional modules it imports at its own import for features tokenmill
does not use: pandas (its DataFrame API), BigQuery and Pub/Sub (``apache_beam.io``'s guarded
imports) and pymongo (MongoDB IO). They cost every launch and every multi_processing worker's
start, on the critical path of a job's first stage (most of ``refilter``'s cost is such fixed
cost; bench/MEASUREMENTS.md: lean Beam import). Each stays importable afterwards: pyarrow imports
pandas for some conversions, and GCS paths go through Beam's file systems, loaded either way."""

from __future__ import annotations

import importlib
import sys
import types

# Each one's import is guarded in Beam (an ImportError means "not installed").
OPTIONAL = ("pandas", "apache_beam.io.gcp.bigquery", "pymongo")


def import_lean(name: str) -> types.ModuleType:
    """``importlib.import_module(name)``, with the OPTIONAL modules not loaded yet failing to
    import meanwhile. The allocator settings go first: Beam's import allocates through them."""
    from tokenmill.memory import tame_allocators

    tame_allocators()
    blocked = [m for m in OPTIONAL if m not in sys.modules]
    for m in blocked:
        sys.modules[m] = None  # type: ignore[assignment]
    try:
        return importlib.import_module(name)
    finally:
        for m in blocked:
            del sys.modules[m]

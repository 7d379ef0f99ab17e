"""Beam imported without pandas: when pandas is installed, Beam imports it at its own import, for
its DataFrame API, which tokenmill does not use. That is 0.15 s of every launch and of every
multi_processing worker's start, on the critical path of a job's first stage (and most of
``refilter``'s cost is such fixed cost). pandas stays importable afterwards: pyarrow imports it
for some conversions."""

from __future__ import annotations

import importlib
import sys
import types


def import_without_pandas(name: str) -> types.ModuleType:
    """``importlib.import_module(name)``, with ``import pandas`` failing meanwhile (Beam goes
    without its pandas type hints), unless pandas is loaded already."""
    if "pandas" in sys.modules:
        return importlib.import_module(name)
    sys.modules["pandas"] = None  # type: ignore[assignment]
    try:
        return importlib.import_module(name)
    finally:
        del sys.modules["pandas"]

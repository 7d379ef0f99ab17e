"""The stages in pipeline order, from one list: ``prepare`` builds the clean phase, the docs
schema's stage columns and the pre-flight checks from ``CLEAN``, and the report orders its
funnel by ``ORDER``. A new clean-phase stage is its module's ``SPEC`` added here, and its
config section."""

from __future__ import annotations

from typing import Any

from tokenmill.transforms import decontaminate, langid, normalize, pii, quality, urlfilter
from tokenmill.transforms.extract import stage as extract
from tokenmill.transforms.stage import Stage

CLEAN: list[Stage] = [urlfilter.SPEC, extract.SPEC, normalize.SPEC, langid.SPEC, quality.SPEC, pii.SPEC,
                      decontaminate.SPEC]
# After the clean phase, on small records and buckets (prepare.decide_and_finish wires them),
# with the columns of theirs the report shows (as Stage.report).
LATER: dict[str, dict[str, tuple | None]] = {"dedup": {"dup_cluster": None}, "boilerplate": {},
                                             "tokenize": {"n_tokens": (0.0, 6.0, 24, True)}, "shards": {}}
ORDER = ["read", *(s.name for s in CLEAN), *LATER]
REPORT_COLUMNS: dict[str, tuple | None] = {k: v for cols in [*(s.report for s in CLEAN), *LATER.values()]
                                           for k, v in cols.items()}


def enabled(cfg) -> list[tuple[Stage, Any]]:
    """The clean-phase stages the job config turns on, each with its config section."""
    return [(s, section) for s in CLEAN if (section := getattr(cfg, s.section)).enabled]

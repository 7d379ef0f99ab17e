"""The stages in pipeline order, from one list: ``prepare`` builds the clean phase, the docs
schema's stage columns and the pre-flight checks from ``STAGES``, the clean phase's last step
(pipelines/phases.StashFn) takes the later stages' records through their ``stash`` hooks,
``refilter`` treats each stage as its spec says, and the report orders its funnel by ``ORDER``.
A new stage is its module's ``SPEC`` added here, and its config section (a later stage is also
wired into prepare.decide_and_finish and the finish phase)."""

from __future__ import annotations

from typing import Any

from tokenmill.transforms import (
    boilerplate,
    decontaminate,
    dedup,
    extract,
    langid,
    normalize,
    pii,
    quality,
    shards,
    tokenization,
    urlfilter,
)
from tokenmill.transforms.stage_base import Stage

# Reading comes first; prepare.build wires it itself (it makes the documents). Its result is the
# stored text, as a ``fixed`` stage's is.
READ = "read"
STAGES: list[Stage] = [
    # clean phase: one document after the other
    urlfilter.SPEC, extract.SPEC, normalize.SPEC, langid.SPEC, quality.SPEC, pii.SPEC, decontaminate.SPEC,
    # then on small records and buckets (prepare.decide_and_finish)
    dedup.SPEC, boilerplate.SPEC, tokenization.SPEC, shards.SPEC,
]
ORDER = [READ, *(s.name for s in STAGES)]
REPORT_COLUMNS: dict[str, tuple | None] = {k: v for s in STAGES for k, v in s.report.items()}


def enabled(cfg, phase: str | None = "clean") -> list[tuple[Stage, Any]]:
    """The stages of ``phase`` (None: all) the job config turns on, each with its config section."""
    return [(s, section) for s in STAGES
            if phase in (None, s.phase) and ((section := getattr(cfg, s.section)).enabled or s.runs_disabled)]

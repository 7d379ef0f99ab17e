"""The thin Beam layer every stage shares: a DoFn that skips dropped docs and counts.

A stage is a pure function ``doc -> doc`` (it may mark the doc dropped); ``StageFn`` wraps
it, passes already-dropped documents through untouched, and keeps the Beam counters
``<stage>.in``, ``<stage>.out`` and ``dropped.<stage>:<reason>`` that every runner reports.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

NAMESPACE = "tokenmill"


_COUNTERS: dict[str, Any] = {}


def count(name: str, n: int = 1) -> None:
    # Metrics.counter() builds and validates a MetricName on every call (1.4 us, and stages
    # count twice per document); the counter it returns finds the running step's container at
    # each inc(), so one per name serves every step, bundle and thread.
    counter = _COUNTERS.get(name)
    if counter is None:
        counter = _COUNTERS[name] = Metrics.counter(NAMESPACE, name)
    counter.inc(n)


class StageFn(beam.DoFn):
    stage = ""

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def process(self, doc: dict[str, Any]):
        if doc.get("dropped_by"):
            yield doc
            return
        count(f"{self.stage}.in")
        doc = self.apply(doc)
        if doc.get("dropped_by"):
            count(f"dropped.{doc['dropped_by']}")
        else:
            count(f"{self.stage}.out")
        yield doc

"""The thin Beam layer every stage shares: a DoFn that skips dropped docs and counts, and the
``Stage`` spec each stage module exports as ``SPEC``.

A stage is a pure function ``doc -> doc`` (it may mark the doc dropped); ``StageFn`` wraps
it, passes already-dropped documents through untouched, and keeps the Beam counters
``<stage>.in``, ``<stage>.out`` and ``dropped.<stage>:<reason>`` that every runner reports.

Each document gets the stage's deadline, ``timeout_s`` of its config section (extraction has
its own; both use transforms/deadline.py): the pure core calls ``check(deadline)`` between its passes, and ``StageFn`` turns the
``Timeout`` into the drop ``<stage>:timeout``, counted like any other, never a hang. It is
cooperative (no signals: Beam runs DoFns in threads), so each pass itself must be linear in
the document; a pure core called without a deadline (None) never times out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import apache_beam as beam
from apache_beam.metrics import Metrics

from tokenmill.memory import tame_allocators
from tokenmill.transforms.deadline import Timeout, check  # noqa: F401 - the stages' check
from tokenmill.transforms.doc import drop

NAMESPACE = "tokenmill"

# Every worker of every runner imports this module (every stage's DoFn does), so the allocator
# settings hold wherever documents are processed.
tame_allocators()


_COUNTERS: dict[str, Any] = {}


def count(name: str, n: int = 1) -> None:
    # Metrics.counter() builds and validates a MetricName on every call (and stages count twice
    # per document: bench/MEASUREMENTS.md); the counter it returns finds the running step's container at
    # each inc(), so one per name serves every step, bundle and thread.
    counter = _COUNTERS.get(name)
    if counter is None:
        counter = _COUNTERS[name] = Metrics.counter(NAMESPACE, name)
    counter.inc(n)


class StageFn(beam.DoFn):
    stage = ""
    # True for a stage that also works on dropped documents (PII: their rows are published too);
    # they pass through ``apply`` uncounted.
    on_dropped = False
    # The deadline (time.monotonic()) of the document ``apply`` works on, for the pure core's
    # check() calls; None when the stage's section has no timeout_s.
    deadline: float | None = None

    def __init__(self, cfg: Any):
        self.cfg = cfg  # the stage's config section; what its setup() loads goes on the instance
        # Read once: a pydantic section without the field raises inside getattr (3 us a document).
        self.timeout_s = getattr(cfg, "timeout_s", None)

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def timed_out(self, doc: dict[str, Any]) -> dict[str, Any]:
        """What becomes of a document whose deadline passed in ``apply``: dropped as
        ``<stage>:timeout`` (a stage whose half-done work must not be published overrides it)."""
        return drop(doc, self.stage, "timeout")

    def _apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        try:
            return self.apply(doc)
        except Timeout:
            return self.timed_out(doc)

    def process(self, doc: dict[str, Any]):
        if doc.get("dropped_by"):
            yield self._apply(doc) if self.on_dropped else doc
            return
        count(f"{self.stage}.in")
        doc = self._apply(doc)
        if doc.get("dropped_by"):
            count(f"dropped.{doc['dropped_by']}")
        else:
            count(f"{self.stage}.out")
        yield doc


def _no_fields(section: Any) -> list:
    return []


class Stash:
    """A later stage's share of the clean phase's last step (pipelines/phases.StashFn), for each
    live document: ``take`` before the document is stored (it may add a column to it), ``place``
    once it is, with the ``Locator`` (transforms/buckets) of where it waits; what ``place``
    returns, unless None, goes to the tagged output ``tag``. ``key``: the Locator's key from what
    ``take`` gave (dedup's node key, which its verdict is found by), or None."""

    tag = ""

    def take(self, doc: dict[str, Any]) -> Any:
        return None

    def key(self, taken: Any) -> bytes | None:
        return None

    def place(self, taken: Any, doc: dict[str, Any], loc: Any) -> Any:
        return taken


@dataclass(frozen=True)
class Stage:
    """A stage as the pipelines wire it from one list (transforms/stages.py): its name (counters,
    drop reasons ``name:reason``, the report's order), its JobConfig section (which turns it on),
    the docs Parquet columns it adds, its pre-flight check ``check(section, job_config)``, run
    before the job (one clear line), and what the report shows of its columns.

    A ``clean`` stage is a DoFn made from its section (``fn``), run on every document in turn; a
    ``later`` one runs on small records and buckets after the clean phase (prepare.decide_and_finish
    wires it), and may take its records from each live document at the clean phase's end
    (``stash(section, job_config)``: a ``Stash``, or None).

    What ``tokenmill refilter`` (pipelines/refilter.py) does with a stored output's result of it:
    ``fixed``: the stored text is its result (it keeps the stage's drops and refuses other
    settings of its section); ``redecide``: decided again on the columns it stored, by its DoFn's
    ``redecide(doc)`` (None where the document has none: the stage then runs on the stored text,
    which must be the text it would have seen); ``rerun``: run again on the stored text."""

    name: str
    section: str
    fn: Callable[[Any], beam.DoFn] | None = None
    fields: Callable[[Any], list] = _no_fields
    check: Callable[[Any, Any], None] | None = None
    # The files its workers read (``reads(section)``: setting -> paths): on a cluster whose
    # workers are other hosts, a local one is refused before submission (launch.check_paths_reach_workers).
    reads: Callable[[Any], dict[str, list[str]]] | None = None
    # The columns it sets that the report shows: a kept-vs-dropped histogram (low, high, bins,
    # log10 scale), or None for a value shown with each sample document only.
    report: dict[str, tuple | None] = field(default_factory=dict)
    phase: Literal["clean", "later"] = "clean"
    # False for a stage that drops nothing and has no row in the report's funnel (shards).
    funnel: bool = True
    stash: Callable[[Any, Any], Stash | None] | None = None
    refilter: Literal["fixed", "redecide", "rerun"] = "fixed"
    # The columns it sets that a rerun sets again: refilter empties them first, except those
    # ``reusable(new_section, old_section)`` names (still right with the new settings).
    derived: tuple[str, ...] = ()
    reusable: Callable[[dict, dict], tuple[str, ...]] | None = None
    # refilter_check(new_section, old_section, src): raises UserError (one line) for settings
    # whose result refilter cannot derive from what ``src`` stored.
    refilter_check: Callable[[dict, dict, str], None] | None = None
    # A fixed stage that changes the text: whether it changed this stored document's text (a
    # stage before it cannot be computed on the stored text then).
    changed_text: Callable[[dict], bool] | None = None
    # True for a stage whose DoFn also runs with its section off, to say what that means for a
    # record (extract: raw HTML that nothing else can turn into text is extract:disabled).
    runs_disabled: bool = False


class _OrEmpty(beam.CombineFn):
    """The one combined value among None seeds, else ``fn``'s output for no inputs."""

    def __init__(self, fn: beam.CombineFn):
        self._fn = fn

    def setup(self, *args, **kwargs):
        self._fn.setup(*args, **kwargs)

    def teardown(self, *args, **kwargs):
        self._fn.teardown(*args, **kwargs)

    def create_accumulator(self):
        return None

    def add_input(self, acc, value):
        return acc if value is None else value

    def merge_accumulators(self, accs):
        return next((a for a in accs if a is not None), None)

    def extract_output(self, acc):
        return self._fn.apply([]) if acc is None else acc


class CombineOnce(beam.PTransform):
    """``CombineGlobally(fn)``: exactly one output, also for an empty input (``fn``'s output for
    no inputs; ``fn`` never outputs None). CombineGlobally's own default reads the output
    through a side input, which kept it decoded in a worker and encoded in the runner until the
    job's end (the tokenizer sample; the boilerplate sketch: 64 MB; bench/MEASUREMENTS.md). Here
    the output (or nothing) meets a None seed in a second combine, over at most two elements.
    The seed joins after the first combine, which stays lifted into its producer's stage:
    flattened before it, the inputs themselves (the report's documents) would wait in the
    runner."""

    def __init__(self, fn: beam.CombineFn, label: str | None = None):
        super().__init__(label)
        self._fn = fn

    def expand(self, pcoll):
        combined = pcoll | "Combine" >> beam.CombineGlobally(self._fn).without_defaults()
        seed = pcoll.pipeline | "Seed" >> beam.Create([None])
        return ((combined, seed) | "WithSeed" >> beam.Flatten()
                | "OrEmpty" >> beam.CombineGlobally(_OrEmpty(self._fn)).without_defaults())

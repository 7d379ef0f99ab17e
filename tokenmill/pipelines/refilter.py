"""``tokenmill refilter OUT --output OUT2 [--config job.yaml] [--set ...]``: the filters, dedup
and the shards again, from what OUT stored, with other settings. Nothing is read, extracted or
language-labelled again, and the MinHash signatures of a ``quality.mode: tag`` run are reused,
so trying a threshold costs a fraction of a prepare.

The settings are OUT's own (its report.json) with the file and ``--set`` on top, and
``quality.mode`` back to ``filter`` unless set. The output is the one ``prepare`` would write
with those settings, because the decisions are taken on the stored values themselves (signals,
scores and language scores are decided on as the float32 the Parquet keeps, doc.stored).

Each stage's spec (transforms/stages.py) says how: a ``fixed`` stage's result is the stored text
(read, URL, extraction, normalisation, PII: their drops stay), a ``redecide`` one decides again
on the columns it stored (language, quality), a ``rerun`` one runs again (decontamination, and
dedup, boilerplate, tokenize and shards as in prepare), its ``derived`` columns emptied first.

What cannot be redone from OUT is refused in one line: other settings of a fixed stage, another
language model, other classifier models, settings that change the quality signals, an OUT whose
boilerplate lines or evaluation overlaps were cut (each stage's ``refilter_check``); and, once
the job runs, a document that an earlier stage dropped in OUT and the new settings keep (a
looser ``language``) when it lacks what a stage stores and a later fixed stage changed its text
since: its quality signals, which prepare computes before PII redaction, on a document PII was
found in. Without PII found, they are computed on the stored text, which is that text.
"""

from __future__ import annotations

import json
from typing import Any

import apache_beam as beam
from pydantic import ValidationError

from tokenmill.beamfs import FileSystems
from tokenmill.config import JobConfig, load_validated
from tokenmill.errors import UserError, first_line
from tokenmill.format import published
from tokenmill.pipelines import output as output_folder
from tokenmill.pipelines import prepare
from tokenmill.transforms import stages
from tokenmill.transforms.readers import InputFile, InputScan

# Read, and the stages whose result is the stored text: their drops stay, their settings too.
FIXED = [stages.READ, *(s.name for s in stages.STAGES if s.refilter == "fixed")]
FIXED_SECTIONS = [stages.READ, *(s.section for s in stages.STAGES if s.refilter == "fixed")]


def original_config(src: str) -> dict[str, Any]:
    """OUT's settings, with the defaults of keys added since it was written."""
    for name in ("report/report.json", "manifest.json"):
        path = FileSystems.join(src, name)
        if FileSystems.exists(path):
            with FileSystems.open(path) as fh:
                raw = json.loads(fh.read()).get("config") or {}
            try:
                return JobConfig.model_validate(raw).model_dump(mode="json")
            except ValidationError as e:
                raise UserError(f"{path}: its settings no longer validate ({first_line(e)})") from None
    raise UserError(f"{src}: not a prepared output (no report/report.json or manifest.json)")


def settings(src: str, output: str, config: str | None, sets: list[str]) -> tuple[JobConfig, dict[str, Any]]:
    """(the refilter's settings, the original run's) with what cannot be redone refused."""
    original = original_config(src)
    base = json.loads(json.dumps(original))
    base["quality"]["mode"] = "filter"
    cfg = load_validated(JobConfig, config, sets, base=base)
    cfg.output = output
    new = cfg.model_dump(mode="json")
    for section in FIXED_SECTIONS:
        if new[section] != original[section]:
            raise UserError(f"refilter: {section} settings differ from {src}'s, and its stored text is their "
                            f"result: run prepare again")
    for spec in stages.STAGES:
        if spec.refilter_check is not None:
            spec.refilter_check(new[spec.section], original[spec.section], src)
    return cfg, original


def input_scan(src: str) -> InputScan:
    """OUT's input list (the bucket count derives from it, as in prepare) and its skipped files."""
    with FileSystems.open(FileSystems.join(src, prepare.INPUT_LIST)) as fh:
        files = [InputFile(**json.loads(line)) for line in fh.read().decode("utf-8").splitlines() if line.strip()]
    report = FileSystems.join(src, "report", "report.json")
    skipped = {}
    if FileSystems.exists(report):
        with FileSystems.open(report) as fh:
            skipped = json.loads(fh.read()).get("inputs_skipped", {})
    return InputScan(files, skipped)


def cleared(cfg: JobConfig, original: dict[str, Any]) -> list[str]:
    """The columns the redone stages derive again (their ``derived``, less what the new settings
    can reuse: dedup's stored MinHash signatures when they are computed the same way)."""
    new = cfg.model_dump(mode="json")
    out = []
    for spec in stages.STAGES:
        keep = spec.reusable(new[spec.section], original[spec.section]) if spec.reusable else ()
        out += [k for k in spec.derived if k not in keep]
    return out


def refilter_doc(row: dict[str, Any], cleared: list[str]) -> dict[str, Any]:
    """The pure core of the head: a stored row, ready for the stages that are redone (its
    decision and the ``cleared`` columns emptied, the fixed stages' drops kept as they are)."""
    doc = dict(row)
    if isinstance(doc.get("pii"), dict):  # the struct column gives every kind back, null where none
        doc["pii"] = {k: n for k, n in doc["pii"].items() if n}
    stage = (doc.get("dropped_by") or "").split(":", 1)[0]
    if stage in FIXED:
        return doc
    for k in ("dropped_by", *cleared):
        doc[k] = None
    return doc


class RefilterFn(beam.DoFn):
    """Stored rows -> documents through the clean stages that are redone, in order: a
    ``redecide`` stage decides on what it stored, a ``rerun`` one runs on the stored text.

    A redecide stage that finds nothing stored (an earlier stage dropped the document in
    ``src``, and now keeps it) runs on the stored text, as prepare would, unless a fixed stage
    after it changed that text (PII redaction, after the quality signals): prepare computes it on
    the text before, which ``src`` no longer has, so the job stops with one line."""

    def __init__(self, cfg: JobConfig, cleared: list[str], src: str):
        self._cfg, self._cleared, self._src = cfg, cleared, src

    def setup(self):
        # (spec, its DoFn, the enabled fixed stages after it that change the text)
        self._steps = []
        changing = []
        for spec, section in reversed(stages.enabled(self._cfg)):
            if spec.refilter == "fixed":
                if spec.changed_text is not None:
                    changing.insert(0, spec)
                continue
            self._steps.insert(0, (spec, spec.fn(section), list(changing)))
        self._set_up = set()

    def _run(self, fn, doc):
        if fn not in self._set_up:  # what setup loads (models, evaluation sets) only where a stage runs
            fn.setup()
            self._set_up.add(fn)
        return next(iter(fn.process(doc)))

    def process(self, row):
        doc = refilter_doc(row, self._cleared)
        for spec, fn, changed_after in self._steps:
            if doc.get("dropped_by"):
                break
            if spec.refilter == "redecide":
                decided = fn.redecide(doc)
                if decided is not None:
                    doc = decided
                    continue
                if changer := next((s for s in changed_after if s.changed_text(doc)), None):
                    raise UserError(
                        f"refilter: {doc.get('id')!r} has no {spec.name} columns in {self._src} (an earlier stage "
                        f"dropped it there), and {spec.name} sees the text before {changer.name}, which changed "
                        f"it: run prepare with these settings")
            doc = self._run(fn, doc)
        yield doc


def graph(src: str, cleared: list[str]):
    def build(p: beam.Pipeline, cfg: JobConfig, scan: InputScan, out: str, progress_to: str | None) -> None:
        with FileSystems.open(FileSystems.join(src, prepare.INPUT_LIST)) as fh:  # read and written:
            listed = fh.read()                                                  # src and out may be on
        with FileSystems.create(FileSystems.join(out, prepare.INPUT_LIST)) as fh:  # different stores
            fh.write(listed)
        docs = (p
                | "ReadDocs" >> beam.io.ReadFromParquet(FileSystems.join(src, "docs", "*.parquet"))
                | "Refilter" >> beam.ParDo(RefilterFn(cfg, cleared, src)))
        prepare.decide_and_finish(p, docs, cfg, scan, out, progress_to)
    return build


def run(src: str, output: str, config: str | None, sets: list[str], beam_args: list[str]) -> str | None:
    """Refilter ``src`` into ``output``; returns report.json's path, None when the report is off."""
    output_folder.check_separate(src, output, "refilter")
    given, src = src, published(src)  # on an object store: the root its manifest commits
    if not FileSystems.match([FileSystems.join(src, "docs", "*.parquet")])[0].metadata_list:
        raise UserError(f"{given}: not a prepared output (no docs/*.parquet)")
    cfg, original = settings(src, output, config, sets)
    prepare.check_settings(cfg)
    scan = input_scan(src)
    cfg.inputs = original["inputs"]
    report_path = prepare.run(cfg, beam_args, None, graph(src, cleared(cfg, original)), scan)
    return report_path if cfg.report.enabled else None

"""``tokenmill refilter OUT --output OUT2 [--config job.yaml] [--set ...]``: the filters, dedup
and the shards again, from what OUT stored, with other settings. Nothing is read, extracted or
language-labelled again, and the MinHash signatures of a ``quality.mode: tag`` run are reused,
so trying a threshold costs a fraction of a prepare.

The settings are OUT's own (its report.json) with the file and ``--set`` on top, and
``quality.mode`` back to ``filter`` unless set. The output is the one ``prepare`` would write
with those settings, because the decisions are taken on the stored values themselves (signals,
scores and language scores are decided on as the float32 the Parquet keeps, doc.stored).

What cannot be redone from OUT is refused in one line: other read, URL, extraction,
normalisation or PII settings (the stored text is their result), another language model,
other classifier models, and an OUT whose boilerplate lines were cut.
"""

from __future__ import annotations

import json
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from pydantic import ValidationError

from tokenmill.config import JobConfig, load_validated
from tokenmill.errors import UserError, first_line
from tokenmill.pipelines import output as output_folder
from tokenmill.pipelines import prepare
from tokenmill.transforms import doc as docmod
from tokenmill.transforms.readers import InputScan
from tokenmill.transforms.readers.inputs import InputFile

# Stages whose result is the stored text, or that ran before it existed: kept as they were.
_FIXED_STAGES = ("read", "url", "extract", "normalize")
_FIXED_SECTIONS = ("read", "url", "extract", "normalize", "pii")
# Columns a run derives again; cleared before the row goes through the stages.
_DERIVED = ("dropped_by", "dup_cluster", "dup_cluster_size", "quality_flag", "decontaminated",
            "boilerplate_chars", "n_tokens")
_MINHASH_KEYS = ("near", "ngram", "bands", "rows", "seed")
# Quality settings that change the signals (not only the thresholds on them).
_SIGNAL_KEYS = ("no_space_langs", "stop_words", "fineweb_short_line_chars")


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
    for section in _FIXED_SECTIONS:
        if new[section] != original[section]:
            raise UserError(f"refilter: {section} settings differ from {src}'s, and its stored text is their "
                            f"result: run prepare again")
    lang_new, lang_old = new["language"], original["language"]
    if lang_new["enabled"] != lang_old["enabled"] or (lang_new["enabled"] and (
            lang_new["model"] != lang_old["model"] or lang_new["max_chars"] != lang_old["max_chars"])):
        raise UserError(f"refilter: language labels come from {src} (on or off, its model, max_chars): "
                        f"run prepare again to label them anew")
    q_new, q_old = new["quality"], original["quality"]
    if q_new["enabled"] and not q_old["enabled"]:
        raise UserError(f"refilter: {src} has no quality signals (they are computed before PII redaction): "
                        f"run prepare with quality on")
    def signal_settings(q: dict) -> list:
        return [[q[k] for k in _SIGNAL_KEYS]] + [
            (lang, {k: v for k, v in o.items() if k in _SIGNAL_KEYS}) for lang, o in sorted(q["per_lang"].items())
            if set(o) & set(_SIGNAL_KEYS)]

    if signal_settings(q_new) != signal_settings(q_old):
        raise UserError(f"refilter: {', '.join(_SIGNAL_KEYS)} change the stored signals themselves: run prepare again")
    d_old = original["decontaminate"]
    if d_old["enabled"] and d_old["mode"] == "cut":
        raise UserError(f"refilter: {src}'s texts had evaluation overlaps cut; refilter a run with mode drop")
    if new["quality"]["classifier"]["model"] not in (None, original["quality"]["classifier"]["model"]):
        raise UserError(f"refilter: the classifier scores come from {src}: other models need a prepare")
    if original.get("boilerplate", {}).get("enabled"):
        raise UserError(f"refilter: {src} had its boilerplate lines cut; refilter a run without boilerplate.enabled")
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


def refilter_doc(row: dict[str, Any], reuse_minhash: bool) -> dict[str, Any]:
    """The pure core of the head: a stored row, ready for the stages that are redone (its
    derived columns cleared, the fixed stages' drops kept)."""
    doc = dict(row)
    if isinstance(doc.get("pii"), dict):  # the struct column gives every kind back, null where none
        doc["pii"] = {k: n for k, n in doc["pii"].items() if n}
    stage = (doc.get("dropped_by") or "").split(":", 1)[0]
    if stage in _FIXED_STAGES:
        return doc
    for k in _DERIVED:
        doc[k] = None
    if not reuse_minhash or doc.get("minhash") is None:
        doc.pop("minhash", None)
    return doc


class RefilterFn(beam.DoFn):
    """Stored rows -> documents through the redone clean stages (language decision, quality on
    the stored signals, decontamination)."""

    def __init__(self, cfg: JobConfig, reuse_minhash: bool):
        self._cfg, self._reuse = cfg, reuse_minhash

    def setup(self):
        from tokenmill.transforms.langid import decide

        self._decide = decide
        self._steps = [(stage, fn) for stage, fn, _ in prepare.clean_steps(self._cfg)
                       if stage in ("quality", "decontaminate")]
        for _, fn in self._steps:
            fn.setup()

    def process(self, row):
        doc = refilter_doc(row, self._reuse)
        if doc.get("dropped_by"):
            yield doc
            return
        lang = self._cfg.language
        if lang.enabled:
            reason = self._decide(doc.get("lang"), doc.get("lang_score"), lang)
            if reason:
                docmod.drop(doc, "language", reason)
        for stage, fn in self._steps:
            if doc.get("dropped_by"):
                break
            if stage == "quality" and doc.get("n_words") is not None:
                doc = fn.decide(doc)  # on the stored signals and scores
            else:
                doc = next(iter(fn.process(doc)))
        yield doc


def graph(src: str, reuse_minhash: bool):
    def build(p: beam.Pipeline, cfg: JobConfig, scan: InputScan, out: str, progress_to: str | None) -> None:
        FileSystems.copy([FileSystems.join(src, prepare.INPUT_LIST)], [FileSystems.join(out, prepare.INPUT_LIST)])
        docs = (p
                | "ReadDocs" >> beam.io.ReadFromParquet(FileSystems.join(src, "docs", "*.parquet"))
                | "Refilter" >> beam.ParDo(RefilterFn(cfg, reuse_minhash)))
        prepare.decide_and_finish(p, docs, cfg, scan, out, progress_to)
    return build


def run(src: str, output: str, config: str | None, sets: list[str], beam_args: list[str]) -> str | None:
    """Refilter ``src`` into ``output``; returns report.json's path, None when the report is off."""
    if not FileSystems.exists(FileSystems.join(src, "docs")):
        raise UserError(f"{src}: not a prepared output (no docs folder)")
    cfg, original = settings(src, output, config, sets)
    output_folder.check_separate(src, output, "refilter")
    prepare.check_settings(cfg)
    reuse = all(cfg.dedup.model_dump()[k] == original["dedup"][k] for k in _MINHASH_KEYS)
    scan = input_scan(src)
    cfg.inputs = original["inputs"]
    report_path = prepare.run(cfg, beam_args, None, graph(src, reuse), scan)
    return report_path if cfg.report.enabled else None

"""The ``prepare`` pipeline graph, in three phases (design.md, "Bounded memory by construction"):
clean (read -> extract -> normalize -> language -> quality -> pii -> stash), decide (dedup on
small records; the tokenizer), finish (per bucket: verdicts, tokenize, shards), plus the
cleaned-docs Parquet and the report.

The graph only wires the stages (each a pure core in ``tokenmill.transforms`` with a thin
DoFn); it has no logic of its own, so it runs unchanged on every Beam runner.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import apache_beam as beam
import pyarrow as pa

from tokenmill import __version__
from tokenmill.beamfs import FileSystems
from tokenmill.config import JobConfig
from tokenmill.errors import UserError
from tokenmill.format import published
from tokenmill.pipelines import launch, output, phases, progress_line
from tokenmill.pipelines.export_formats import export, export_format
from tokenmill.pipelines.phases import FinishFn, StashFn
from tokenmill.transforms import doc as docmod
from tokenmill.transforms import shards, stages, tokenization
from tokenmill.transforms.boilerplate import SketchFn
from tokenmill.transforms.buckets import TMP, bucket_count
from tokenmill.transforms.dedup import Dedup, cluster_stats
from tokenmill.transforms.readers import InputScan, ReadFn, plan_task, scan_inputs, write_input_list
from tokenmill.transforms.report import ReportFn, write_report
from tokenmill.transforms.spill import SpillFn
from tokenmill.transforms.stage_base import NAMESPACE, CombineOnce

INPUT_LIST = "inputs.jsonl"


def check_job(cfg: JobConfig) -> InputScan:
    """Everything a user can get wrong, checked before the pipeline is built (one clear line each)."""
    # The output folder is never read back as input, even where a symlink in an input reaches it.
    scan = scan_inputs(cfg.inputs, exclude=[cfg.output])
    if not scan.files:
        raise UserError(f"no input files left once the output folder {cfg.output} is excluded")
    check_settings(cfg)
    return scan


def check_settings(cfg: JobConfig) -> None:
    """The checks of check_job that do not read the inputs (refilter has no inputs to read)."""
    for spec, section in stages.enabled(cfg, phase=None):
        if spec.check is not None:
            spec.check(section, cfg)
    if cfg.shards.enabled and not cfg.tokenize.enabled:
        raise UserError("shards.enabled needs tokenize.enabled (shards hold token ids)")
    if cfg.shards.formats and not cfg.shards.enabled:
        raise UserError("shards.formats needs shards.enabled (the formats are written from the shards)")
    def vocab() -> int:
        if not cfg.tokenize.tokenizer:
            return cfg.tokenize.vocab_size
        return tokenization.tokenizer_info(tokenization.read_tokenizer_json(cfg.tokenize.tokenizer),
                                           cfg.tokenize.eos_token)["vocab_size"]

    for fmt in cfg.shards.formats:  # one line now (mosaicml-streaming missing, ids past uint16), not after the job
        if (spec := export_format(fmt)).check is not None:
            spec.check("shards.formats", vocab)


def clean_steps(cfg: JobConfig) -> list[tuple[str, Any, list[pa.Field]]]:
    """The clean phase after Read, in order: (stage, its DoFn, the docs Parquet fields it adds),
    for the stages the config turns on. ``refilter`` derives the same stage list and fields."""
    return [(spec.name, spec.fn(section), spec.fields(section)) for spec, section in stages.enabled(cfg)]


def build(p: beam.Pipeline, cfg: JobConfig, scan: InputScan, out: str, progress_to: str | None = None) -> None:
    """The job's graph, writing under ``out`` (run() gives it a stage folder, published once the
    job succeeds). The candidate files go to ``out``/.tmp, which the caller removes afterwards
    (run() does); ``progress_to``: the folder the workers write their progress counts to (None:
    they don't)."""
    tasks = write_input_list(scan.files, FileSystems.join(out, INPUT_LIST), cfg.read)
    docs = (
        p
        | "Inputs" >> beam.Create(tasks)
        | "Plan" >> beam.FlatMap(plan_task, cfg.read)
        # Tasks fan out to all workers here: without it the runner may fuse planning and
        # reading, and one big file would again be one worker's job.
        | "Spread" >> beam.Reshuffle()
        | "Read" >> beam.ParDo(ReadFn(cfg.read, progress_to))
    )
    steps = clean_steps(cfg)
    for stage, fn, _ in steps:
        docs = docs | stage.capitalize() >> beam.ParDo(fn)
    decide_and_finish(p, docs, cfg, scan, out, progress_to)


def decide_and_finish(p: beam.Pipeline, docs, cfg: JobConfig, scan: InputScan, out: str,
                      progress_to: str | None = None) -> None:
    """From the clean documents on: stash, dedup and the tokenizer, then the finish phase, the
    manifest and the report."""
    on = stages.enabled(cfg, phase=None)
    funnel = [stages.READ] + [spec.name for spec, _ in on if spec.funnel]
    extra_fields: list[pa.Field] = [f for spec, section in on for f in spec.fields(section)]
    # Clean phase ends here: every document waits in a candidate file of its bucket, and only
    # small records go on (a locator, a live document's dedup node, a bounded tokenizer sample).
    # Documents never cross a shuffle or wait for a side input: local runners would hold them
    # all in memory, cluster runners ship them.
    buckets = bucket_count(scan.files, cfg.shards.target_bytes, cfg.shards.buckets)
    t = cfg.tokenize
    stashed = docs | "Stash" >> beam.ParDo(StashFn(cfg, out, buckets, progress_to)).with_outputs(
        phases.NODES, phases.SAMPLE, phases.LINES, main="located")
    by_bucket = [stashed.located]
    dedup_stats = None
    if cfg.dedup.enabled:  # decide phase: dedup on the small records, verdicts to their buckets
        verdicts = stashed[phases.NODES] | "Dedup" >> Dedup(cfg.dedup, tmp=phases.spill_folder(out), groups=buckets)
        dedup_stats = cluster_stats(verdicts, cfg.dedup)
        # Spilled by bucket like the locators: a GroupByKey of every verdict is held in the runner
        # (decoded, then copied again per worker), growing with the corpus (bench/MEASUREMENTS.md).
        by_bucket.append(verdicts | "VerdictBuckets" >> beam.ParDo(SpillFn(
            phases.spill_folder(out), functools.partial(phases.verdict_bucket, buckets=buckets,
                                                        mode=cfg.dedup.survivor))))
    side = {}
    if cfg.boilerplate.enabled:  # a fixed-size sketch of every document's lines, for the finish phase
        side["sketch"] = beam.pvalue.AsSingleton(
            stashed[phases.LINES] | "LineSketch" >> CombineOnce(SketchFn(cfg.boilerplate.sketch_bits)))
    if t.enabled:
        tok_json = tokenizer_json(p, stashed[phases.SAMPLE], cfg, out)
        side["tok_json"] = beam.pvalue.AsSingleton(tok_json)
    # Finish phase: per bucket, the docs Parquet files and the shards.
    finished = (
        by_bucket
        | "BucketRecords" >> beam.Flatten()
        | "Buckets" >> beam.GroupByKey()
        | "Finish" >> beam.ParDo(FinishFn(cfg, out, buckets, docmod.docs_schema(extra_fields), progress_to), **side).with_outputs(
            phases.SHARDS, main="docs")
    )
    if t.enabled and cfg.shards.enabled:
        write_manifest(finished[phases.SHARDS], tok_json, cfg, out)
    if cfg.report.enabled:
        extra = {"tokenmill_version": __version__, "config": cfg.model_dump(mode="json"),
                 "inputs_skipped": dict(sorted(scan.skipped.items()))}
        if dedup_stats is None:
            dedup_stats = p | "NoDedupStats" >> beam.Create([None])
        _ = (
            finished.docs
            | "Count" >> CombineOnce(ReportFn(cfg.report.samples_per_reason))
            | "WriteReport" >> beam.Map(write_report, FileSystems.join(out, "report"), funnel, extra,
                                        dedup=beam.pvalue.AsSingleton(dedup_stats))
        )


def tokenizer_json(p: beam.Pipeline, samples, cfg: JobConfig, out: str):
    """The tokenizer as a one-element PCollection of its JSON (the user's, or one trained on the
    bounded sample), also written to OUT/tokenizer.json."""
    t = cfg.tokenize
    tok_path = FileSystems.join(out, "tokenizer.json")
    if t.tokenizer:
        # The launcher copies it to OUT and a worker reads it back from there: a JSON given to
        # Create would be pickled and bz2-compressed into the graph (bench/MEASUREMENTS.md).
        # check_job has parsed it already.
        shards.write_atomically(tok_path, tokenization.read_tokenizer_json(t.tokenizer).encode("utf-8"))
        return p | "TokenizerPath" >> beam.Create([tok_path]) | "TokenizerFile" >> beam.Map(
            tokenization.read_tokenizer_json)
    tok_json = samples | "TrainTokenizer" >> tokenization.TrainOnSample(
        t.train_docs, t.train_chars, t.vocab_size, t.kind, t.min_frequency,
        phases.SampleReader(t.train_max_chars))
    _ = tok_json | "WriteTokenizer" >> beam.Map(lambda js: shards.write_atomically(tok_path, js.encode("utf-8")))
    return tok_json


def write_manifest(shard_metas, tok_json, cfg: JobConfig, out: str) -> None:
    """OUT/manifest.json, once every shard is written (it waits for all their entries)."""
    tok_info = tok_json | "TokenizerInfo" >> beam.Map(tokenization.tokenizer_info, cfg.tokenize.eos_token)
    config = cfg.model_dump(mode="json")
    extractor = None
    if cfg.extract.enabled:
        from tokenmill.transforms.extract.tree import identity

        extractor = identity()

    def manifest(metas, tok):
        dtype = tokenization.token_dtype(tok["vocab_size"]).name
        return shards.write_manifest(metas, out, tok, dtype, config, __version__, extractor)

    _ = (shard_metas
         | "AllShards" >> beam.combiners.ToList()
         | "Manifest" >> beam.Map(manifest, tok=beam.pvalue.AsSingleton(tok_info)))


def worker_paths(cfg: JobConfig) -> dict[str, list[str]]:
    """Every path the job's workers open, by the flag or setting that names it (the tokenizer is
    not one: the launcher copies it into OUT, where the workers read it)."""
    paths = {"--input": cfg.inputs, "--output": [cfg.output]}
    for spec, section in stages.enabled(cfg, phase=None):
        if spec.reads is not None:
            paths.update({k: v for k, v in spec.reads(section).items() if v})
    return paths


def check_accounted(result, report_path: str, out: str) -> None:
    """Every record read reached the report, by the runner's own count of the records read (the
    read step's committed ``read.records``): a runner that calls a job done after one of its
    steps failed (Prism 2.65 did, and its output was empty) gets one line, not a publication.
    Not checked where the runner keeps no committed counters, or the graph reads no input files
    (refilter)."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE).with_name("read.records"))
    except (NotImplementedError, AttributeError):  # a runner without metrics
        return
    committed = [c.committed for c in found["counters"]]
    if not committed or any(not isinstance(n, int) for n in committed):
        return
    read = sum(committed)
    with FileSystems.open(report_path, compression_type="uncompressed") as f:
        reported = json.load(f)["documents"]["read"]
    if reported != read:
        raise UserError(f"the runner called the job done, but {read - reported:,} of the {read:,} records read "
                        f"never reached the report (a step failed and the runner went on); the previous output "
                        f"in {out} is untouched")


def run(cfg: JobConfig, beam_args: list[str], display: progress_line.Display | None = None, graph=None,
        scan: InputScan | None = None) -> str:
    """Run the job into a stage folder and publish it when it succeeds; returns report.json's path.
    ``display``: draws the live progress line while the pipeline runs (local runners only).
    ``graph`` and ``scan``: another job's graph (same arguments as ``build``) and its inputs,
    already checked (refilter); ``scan.files`` is emptied once the graph is built."""
    scan = scan if scan is not None else check_job(cfg)
    graph = graph or build
    options, runner = launch.beam_options(beam_args)
    launch.check_paths_reach_workers(options, runner, worker_paths(cfg))
    with output.locked(cfg.output):
        output.remove_leftovers(cfg.output)
        stage = output.new_stage(cfg.output)
        progress_to = phases.progress_folder(stage) if display is not None and "://" not in stage else None
        if progress_to:
            display.start(progress_to, sum(f.size for f in scan.files),
                          bucket_count(scan.files, cfg.shards.target_bytes, cfg.shards.buckets))
        try:
            with launch.harness_output(options, runner) as harness_log:
                try:
                    with launch.interruptible(), beam.Pipeline(runner=runner, options=options) as p:
                        graph(p, cfg, scan, stage, progress_to)
                        # The graph holds what it needs (read tasks over inputs.jsonl, the bucket
                        # count); the file list, which grows with the inputs, is not kept in the launcher.
                        scan.files.clear()
                    if cfg.report.enabled:
                        check_accounted(p.result, FileSystems.join(stage, "report", "report.json"), cfg.output)
                except (UserError, KeyboardInterrupt):
                    raise
                except Exception as e:  # noqa: BLE001 - whatever a worker raised becomes one line
                    if (stop := launch.interrupted(e)) is not None:
                        raise type(stop)() from None
                    raise launch.failure(e, cfg.output, harness_log) from None
        except BaseException:
            output.discard(stage)
            raise
        finally:
            if progress_to:
                display.stop()
        output.discard(FileSystems.join(stage, TMP))  # the candidate files: never published
        export_error = None
        try:
            for fmt in cfg.shards.formats if cfg.shards.enabled else []:
                export(stage, fmt, FileSystems.join(stage, "export", fmt))
        except (UserError, OSError) as e:  # the job's output is good: publish it, without the exports
            output.discard(FileSystems.join(stage, "export"))
            export_error = e
        with launch.sigint_ignored():  # a Ctrl-C now would cut the renames short; the run is done
            output.publish(stage, cfg.output)
        if cfg.tokenize.enabled and cfg.shards.enabled:  # this job wrote the manifest
            shards.warn_if_empty(cfg.output)
        if export_error is not None:
            raise UserError(f"{cfg.output} is written, but not its shards.formats exports: {export_error}; "
                            f"retry them with `tokenmill export {cfg.output} --format ...`")
    return published(cfg.output, "report", "report.json")

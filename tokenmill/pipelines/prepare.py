"""The ``prepare`` pipeline graph: read -> extract -> normalize -> language -> quality -> pii ->
dedup -> tokenize -> shards, plus the cleaned-docs Parquet and the report.

The graph only wires the stages (each a pure core in ``tokenmill.transforms`` with a thin
DoFn); it has no logic of its own, so it runs unchanged on every Beam runner.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shlex
import signal
import sys
import threading

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.runner import create_runner
from apache_beam.transforms.environments import SubprocessSDKEnvironment

from tokenmill import __version__
from tokenmill.config import JobConfig
from tokenmill.errors import UserError
from tokenmill.pipelines import output
from tokenmill.transforms import doc as docmod
from tokenmill.transforms import shards, tokenize
from tokenmill.transforms.dedup import Dedup, cluster_stats
from tokenmill.transforms.extract import ExtractFn
from tokenmill.transforms.langid import LanguageFn, check_languages
from tokenmill.transforms.normalize import NormalizeFn
from tokenmill.transforms.pii import PiiFn
from tokenmill.transforms.quality import QualityFn
from tokenmill.transforms.readers import InputScan, plan_task, read_task, scan_inputs, write_input_list
from tokenmill.transforms.report import MergeReportsFn, ReportFn, write_report
from tokenmill.transforms.stage import count

ROW_GROUP_BYTES = 8 * 1024 * 1024
INPUT_LIST = "inputs.jsonl"


class ReadFn(beam.DoFn):
    def __init__(self, cfg):
        self.cfg = cfg

    def process(self, task):
        if isinstance(task, dict):  # a dropped doc from planning a big file (an unreadable footer)
            count(f"dropped.{task['dropped_by']}")
            yield task
            return
        for d in read_task(task, self.cfg):
            count("read.records")  # every row the docs Parquet will hold, dropped ones too
            if d.get("dropped_by"):
                count(f"dropped.{d['dropped_by']}")
            yield d


def check_job(cfg: JobConfig) -> InputScan:
    """Everything a user can get wrong, checked before the pipeline is built (one clear line each)."""
    # The output folder is never read back as input, even where a symlink in an input reaches it.
    scan = scan_inputs(cfg.inputs, exclude=[cfg.output])
    if not scan.files:
        raise UserError(f"no input files left once the output folder {cfg.output} is excluded")
    if cfg.language.enabled:
        check_languages(cfg.language)
    if cfg.tokenize.enabled and cfg.tokenize.tokenizer:
        tokenize.check_tokenizer(cfg.tokenize.tokenizer, cfg.tokenize.eos_token)
    if cfg.shards.enabled and not cfg.tokenize.enabled:
        raise UserError("shards.enabled needs tokenize.enabled (shards hold token ids)")
    return scan


def build(p: beam.Pipeline, cfg: JobConfig, scan: InputScan, out: str | None = None) -> None:
    """The job's graph, writing under ``out`` (default: the configured output folder)."""
    out = out or cfg.output
    tasks = write_input_list(scan.files, FileSystems.join(out, INPUT_LIST), cfg.read)
    docs = (
        p
        | "Inputs" >> beam.Create(tasks)
        | "Plan" >> beam.FlatMap(plan_task, cfg.read)
        # Tasks fan out to all workers here: without it the runner may fuse planning and
        # reading, and one big file would again be one worker's job.
        | "Spread" >> beam.Reshuffle()
        | "Read" >> beam.ParDo(ReadFn(cfg.read))
        | "Extract" >> beam.ParDo(ExtractFn(cfg.extract))
    )
    stages = ["read", "extract"]
    extra_fields: list[pa.Field] = []
    if cfg.normalize.enabled:
        docs = docs | "Normalize" >> beam.ParDo(NormalizeFn(cfg.normalize))
        stages.append("normalize")
    if cfg.language.enabled:
        docs = docs | "Language" >> beam.ParDo(LanguageFn(cfg.language))
        stages.append("language")
    if cfg.quality.enabled:
        docs = docs | "Quality" >> beam.ParDo(QualityFn(cfg.quality))
        stages.append("quality")
        extra_fields += quality_fields()
    if cfg.pii.enabled:
        docs = docs | "Pii" >> beam.ParDo(PiiFn(cfg.pii))
        stages.append("pii")
    # Documents leave the graph in the step that dropped them: each branch below writes its own
    # Parquet files and report partial. Merging the branches back (a Flatten) would make local
    # runners materialise every document, text included, in memory at once (the FnApiRunner
    # buffers every multi-input Flatten), so memory would grow with the corpus.
    live, filtered = docs | "SplitFiltered" >> beam.Partition(docmod.partition_dropped, 2)
    branches = [("filtered", filtered)]
    dedup_stats = None
    if cfg.dedup.enabled:
        deduped = live | "Dedup" >> Dedup(cfg.dedup)
        dedup_stats = cluster_stats(deduped, cfg.dedup)
        live, duplicates = deduped | "SplitDuplicates" >> beam.Partition(docmod.partition_dropped, 2)
        branches.append(("duplicates", duplicates))
        stages.append("dedup")
    if cfg.tokenize.enabled:
        live = tokenize_and_shard(p, live, cfg, out)
        stages.append("tokenize")
        extra_fields.append(pa.field("n_tokens", pa.int32()))
    branches.append(("kept", live))

    schema = docmod.docs_schema(extra_fields)
    partials = []
    for name, branch in branches:
        title = name.title()
        _ = (
            branch
            | f"{title}Rows" >> beam.Map(docmod.to_row, schema)
            | f"Write{title}" >> beam.io.WriteToParquet(
                FileSystems.join(out, "docs", name), schema, file_name_suffix=".parquet", codec="zstd",
                # Beam's default holds 64 MB of rows per writer before a row group goes to disk:
                # a fixed cost per worker and branch; 8 MB keeps memory flat and row groups sane.
                row_group_buffer_size=ROW_GROUP_BYTES)
        )
        if cfg.report.enabled:
            partials.append(branch | f"Count{title}" >> beam.CombineGlobally(ReportFn(cfg.report.samples_per_reason)))
    if cfg.report.enabled:
        extra = {"tokenmill_version": __version__, "config": cfg.model_dump(mode="json"),
                 "inputs_skipped": dict(sorted(scan.skipped.items()))}
        if dedup_stats is None:
            dedup_stats = p | "NoDedupStats" >> beam.Create([None])
        _ = (
            partials
            | "Partials" >> beam.Flatten()
            | "Count" >> beam.CombineGlobally(MergeReportsFn(cfg.report.samples_per_reason))
            | "WriteReport" >> beam.Map(write_report, FileSystems.join(out, "report"), stages, extra,
                                        dedup=beam.pvalue.AsSingleton(dedup_stats))
        )


def quality_fields() -> list[pa.Field]:
    from tokenmill.transforms.quality import INT_SIGNALS, SIGNALS

    return [pa.field(n, pa.int32() if n in INT_SIGNALS else pa.float32()) for n in SIGNALS] + [
        pa.field("quality_score", pa.float32())]


def tokenize_and_shard(p: beam.Pipeline, docs, cfg: JobConfig, out: str):
    """Tokenize survivors (with the user's tokenizer or one trained on a sample of them), write
    OUT/tokenizer.json, the shards and the manifest. ``docs`` holds survivors only; returns
    them with their tokens."""
    t = cfg.tokenize
    tok_path = FileSystems.join(out, "tokenizer.json")
    if t.tokenizer:
        # The launcher copies it to OUT and a worker reads it back from there: a JSON given to
        # Create would be pickled and bz2-compressed into the graph (200 ms for a 32k vocab).
        # check_job has parsed it already.
        shards.write_atomically(tok_path, tokenize.read_tokenizer_json(t.tokenizer).encode("utf-8"))
        tok_json = p | "TokenizerPath" >> beam.Create([tok_path]) | "TokenizerFile" >> beam.Map(
            tokenize.read_tokenizer_json)
    else:
        tok_json = (docs
                    | "TrainTokenizer" >> tokenize.TrainOnSample(t.train_docs, t.train_max_chars, t.vocab_size,
                                                                 t.kind, t.min_frequency))
        _ = tok_json | "WriteTokenizer" >> beam.Map(lambda js: shards.write_atomically(tok_path, js.encode("utf-8")))
    tok_info = tok_json | "TokenizerInfo" >> beam.Map(tokenize.tokenizer_info, t.eos_token)
    dtype = tok_info | "Dtype" >> beam.Map(lambda info: tokenize.token_dtype(info["vocab_size"]).name)
    docs = (docs
                 | "Batch" >> beam.BatchElements(min_batch_size=min(16, t.batch_size), max_batch_size=t.batch_size)
                 | "Tokenize" >> beam.ParDo(tokenize.TokenizeBatchFn(t.eos_token),
                                            tok_json=beam.pvalue.AsSingleton(tok_json)))
    if cfg.shards.enabled:
        s = cfg.shards
        config = cfg.model_dump(mode="json")
        _ = (docs
             | "Shards" >> shards.WriteShards(out, s.val_fraction, s.target_bytes, s.batch_tokens, tok_info, dtype)
             | "AllShards" >> beam.combiners.ToList()
             | "Manifest" >> beam.Map(lambda metas, tok, dtype: shards.write_manifest(metas, out, tok, dtype, config,
                                                                                   __version__),
                                      tok=beam.pvalue.AsSingleton(tok_info), dtype=beam.pvalue.AsSingleton(dtype)))
    return docs


def beam_options(beam_args: list[str]) -> PipelineOptions:
    """Beam's options, checked now: a bad flag value or an unknown runner is one line, not
    Beam's usage text or a traceback from deep inside the pipeline."""
    if not any(a == "--runner" or a.startswith("--runner=") for a in beam_args):
        # Beam's DirectRunner first tries Prism, a binary it downloads at run time; the FnApiRunner
        # it falls back to is the same in-process engine (honouring --direct_running_mode and
        # --direct_num_workers), with no download. By measurement (bench/runners.py) it is also
        # the fastest local mode here.
        beam_args = [*beam_args, "--runner=FnApiRunner"]
    options = PipelineOptions(beam_args)
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):  # argparse prints its usage, then exits
            options.get_all_options(retain_unknown_options=True)
    except SystemExit:
        said = [ln for ln in usage.getvalue().splitlines() if ": error: " in ln]
        raise UserError("Beam option: " + (said[-1].split(": error: ", 1)[1] if said else " ".join(beam_args))) from None
    runner = options.view_as(StandardOptions).runner
    try:
        create_runner(runner)
    except (ValueError, ImportError) as e:
        raise UserError(f"--runner={runner}: {str(e).splitlines()[0]}") from None
    return options


def _chain(e: BaseException) -> list[BaseException]:
    chain, cause = [e], e
    while (cause := cause.__cause__ or cause.__context__) is not None and len(chain) < 20:
        chain.append(cause)
    return chain


def _failure(e: BaseException, out: str) -> UserError:
    """One line for a pipeline that failed on a worker: disk full, or the step and its error."""
    text = f"{type(e).__name__}: {e}"
    if any(isinstance(c, OSError) and c.errno == errno.ENOSPC for c in _chain(e)) or "No space left on device" in text:
        return UserError(f"disk full while writing {out}; the previous output is untouched")
    step = re.findall(r"\[while running '([^']+)'\]", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith((" ", "Traceback"))]
    last = lines[-1] if lines else type(e).__name__
    where = f" in step {step[-1].split('/')[0]!r}" if step else ""
    return UserError(f"the pipeline failed{where}: {last[:500]}; the previous output in {out} is untouched")


def _interrupted(e: BaseException) -> bool:
    # Beam re-raises a KeyboardInterrupt from inside a step as RuntimeError("KeyboardInterrupt
    # [while running ...]"), raised while the KeyboardInterrupt is handled.
    return any(isinstance(c, KeyboardInterrupt) for c in _chain(e))


WORKER_MODULE = "tokenmill.pipelines.worker"


def _runner(options: PipelineOptions):
    """The runner instance, or None for the one ``--runner`` names. FnApiRunner's multi_processing
    workers are started through tokenmill/pipelines/worker.py (Ctrl-C, stderr)."""
    direct = options.view_as(DirectOptions)
    runner = create_runner(options.view_as(StandardOptions).runner)
    if not isinstance(runner, FnApiRunner) or direct.direct_running_mode != "multi_processing":
        return None
    # Run by sh -c. A SIGINT ignored before exec stays ignored, and Python then installs no
    # KeyboardInterrupt handler: a Ctrl-C during the worker's start-up is ignored too.
    env = SubprocessSDKEnvironment.from_command_string(
        f"trap '' INT; exec {shlex.quote(sys.executable)} -m {WORKER_MODULE}")
    # FnApiRunner picks Beam's worker command in multi_processing mode and keeps a given one
    # otherwise: the same workers (direct_num_workers of them), started our way.
    direct.direct_running_mode = "in_memory"
    return FnApiRunner(default_environment=env)


def _end_workers() -> None:
    """SIGTERM to this process's multi_processing workers (Linux: found in /proc)."""
    me, parent, cmd = os.getpid(), {}, {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat", "rb") as fh:
                parent[pid] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd[pid] = fh.read()
    mine, todo = set(), [me]
    while todo:  # descendants: Beam starts each worker through sh -c
        pid = todo.pop()
        kids = [p for p, pp in parent.items() if pp == pid and p not in mine]
        mine.update(kids)
        todo += kids
    for pid in mine:
        if WORKER_MODULE.encode() in cmd.get(pid, b""):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)


@contextlib.contextmanager
def _interruptible():
    """Ctrl-C ends the run promptly. Beam's teardown waits for every multi_processing worker to
    finish its bundle, and one the launcher stopped feeding never finishes: the workers, which
    ignore SIGINT, are ended first. What Beam's threads then raise about the workers they lost
    (gRPC stream errors, "Worker subprocess exited") is the interrupt's fallout, not news: after
    an interrupt, thread exceptions are not printed, for the rest of the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted = False

    def on_sigint(signum, frame):
        nonlocal interrupted
        interrupted = True
        _end_workers()
        raise KeyboardInterrupt

    def hook(args):
        if not interrupted:
            old_hook(args)

    old_handler, old_hook = signal.signal(signal.SIGINT, on_sigint), threading.excepthook
    threading.excepthook = hook
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_handler)
        if not interrupted:  # Beam's threads may still be failing after the run has unwound
            threading.excepthook = old_hook


@contextlib.contextmanager
def _sigint_ignored():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_handler)


def run(cfg: JobConfig, beam_args: list[str]) -> str:
    """Run the job into a stage folder and publish it when it succeeds; returns report.json's path."""
    scan = check_job(cfg)
    options = beam_options(beam_args)
    runner = _runner(options)
    with output.locked(cfg.output):
        output.remove_leftovers(cfg.output)
        stage = output.new_stage(cfg.output)
        try:
            with _interruptible(), beam.Pipeline(runner=runner, options=options) as p:
                build(p, cfg, scan, stage)
        except (UserError, KeyboardInterrupt):
            output.discard(stage)
            raise
        except Exception as e:  # noqa: BLE001 - whatever a worker raised becomes one line
            output.discard(stage)
            if _interrupted(e):
                raise KeyboardInterrupt from None
            raise _failure(e, cfg.output) from None
        with _sigint_ignored():  # a Ctrl-C now would cut the renames short; the run is done
            output.publish(stage, cfg.output)
    return FileSystems.join(cfg.output, "report", "report.json")

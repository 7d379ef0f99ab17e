"""The ``tokenmill`` command line. Every error a user can cause ends as one line on stderr."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
from importlib import resources

from tokenmill import __version__, memory
from tokenmill.credentials import store_flags
from tokenmill.errors import Terminated, UserError


def sample_dir() -> str:
    return str(resources.files("tokenmill") / "sample")


def sample_inputs() -> list[str]:
    """The bundled corpus (its README is documentation, not input)."""
    d = sample_dir()
    return [f"{d}/pages", f"{d}/crawl.warc.gz", f"{d}/docs.jsonl", f"{d}/notes.txt"]


def _quiet_logging() -> None:
    # Beam logs import-time noise (e.g. "apitools not found") on the root logger; the user
    # wants tokenmill's own warnings (bad records, broken files) and real errors.
    from tokenmill.terminal import SafeFormatter

    # A log line quotes file names and parse errors from the inputs: shown safe (terminal.py).
    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.ERROR, handlers=[handler])
    logging.getLogger("tokenmill").setLevel(logging.WARNING)
    # A failed step is logged by Beam with its traceback (and re-logged from each worker); the
    # error that ends the run says it in one line (launch.failure).
    logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    # A portable runner's job messages reach the root logger (a failed job's Java and Python
    # tracebacks among them): the one-line error says what failed.
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda r: not (r.name == "root" and f"apache_beam{os.sep}" in r.pathname))


def _load_beam() -> None:
    from tokenmill.pipelines.beamload import import_lean

    import_lean("apache_beam")


@contextlib.contextmanager
def _beam_job(beam_args: list[str]):
    """Around a Beam verb: its multi_processing workers start first, while this process loads
    Beam and builds the graph (warm), and those no job took are ended after it."""
    from tokenmill.pipelines import warm

    warm.start(beam_args)
    try:
        _load_beam()
        yield
    finally:
        warm.stop()


def cmd_prepare(args: argparse.Namespace, beam_args: list[str]) -> int:
    from tokenmill.config import load_config
    from tokenmill.pipelines.local_mode import default_flags

    cfg = load_config(args.config, args.set)
    beam_args = store_flags(beam_args)
    beam_args = [*beam_args, *default_flags(beam_args, args.input or cfg.inputs or sample_inputs())]
    with _beam_job(beam_args):
        return _prepare(args, cfg, beam_args)


def _prepare(args: argparse.Namespace, cfg, beam_args: list[str]) -> int:
    from tokenmill.terminal import console

    if args.input:
        cfg.inputs = args.input
    if not cfg.inputs:
        cfg.inputs = sample_inputs()
    if args.output is not None:
        if not args.output.strip():
            raise UserError("--output: an empty path")
        cfg.output = args.output
    from tokenmill.pipelines import launch, prepare, progress_line

    options, runner = launch.beam_options(beam_args)
    display = None
    if args.quiet:
        pass
    elif launch.is_local(options, runner):
        # The live line only on a terminal: redirected to a file it would be noise.
        display = progress_line.Display() if sys.stdout.isatty() and sys.stderr.isatty() else None
    else:
        # refused before "submitting" is said (prepare.run checks it again for every caller)
        launch.check_paths_reach_workers(options, runner, prepare.worker_paths(cfg))
        launch.announce_remote(options)
    report_path = prepare.run(cfg, beam_args, display)
    _print_report(report_path if cfg.report.enabled else None, console(), cfg.output)
    return 0


def _load_report(path: str) -> dict:
    from tokenmill.beamfs import FileSystems

    try:
        with FileSystems.open(path) as fh:
            report = json.loads(fh.read().decode("utf-8"))
    except Exception:
        raise UserError(f"no readable report at {path} (did `tokenmill prepare` finish?)") from None
    from tokenmill.transforms.report import check_summary

    return check_summary(report, path)


def cmd_refilter(args: argparse.Namespace, beam_args: list[str]) -> int:
    from tokenmill.pipelines.local_mode import default_flags
    from tokenmill.terminal import console

    beam_args = store_flags(beam_args)
    beam_args = [*beam_args, *default_flags(beam_args, [os.path.join(args.out, "docs")])]
    with _beam_job(beam_args):
        from tokenmill.pipelines import refilter

        report_path = refilter.run(args.out, args.output, args.config, args.set, beam_args)
    _print_report(report_path, console(), args.output)
    return 0


def _print_report(report_path: str | None, console, output: str = "") -> None:
    from tokenmill.terminal import markup  # with the report off (report_path None): where the docs are
    from tokenmill.transforms.report import print_summary

    if report_path is None:
        console.print(f"cleaned docs: {markup(output)}/docs/ (report disabled)")
        return
    print_summary(_load_report(report_path), console)
    out = markup(report_path.rsplit("/report/", 1)[0])
    console.print(f"cleaned docs: {out}/docs/   shards: {markup(output) if output else out}/manifest.json\n"
                  f"report: {out}/report/report.html (data: {markup(report_path)})")


def cmd_report(args: argparse.Namespace, _: list[str]) -> int:
    from tokenmill.format import published  # on a store: under the root its manifest commits
    from tokenmill.terminal import console

    _print_report(published(args.out.rstrip("/"), "report", "report.json"), console(), args.out.rstrip("/"))
    return 0


def cmd_config(args: argparse.Namespace, _: list[str]) -> int:
    from tokenmill.config_doc import default_yaml

    print(default_yaml(args.train), end="")
    return 0


def cmd_inspect(args: argparse.Namespace, _: list[str]) -> int:
    from tokenmill.pipelines.inspect_output import inspect_output

    return inspect_output(args.out.rstrip("/"), args.docs)


def cmd_tokenizer_train(args: argparse.Namespace, _: list[str]) -> int:
    from tokenmill.pipelines.tokenizer_train import train_from_inputs
    from tokenmill.terminal import safe

    n = train_from_inputs(args.input, args.output, args.kind, args.vocab_size, args.max_docs)
    print(f"trained a {args.kind} tokenizer (vocab {args.vocab_size:,}) on {n:,} documents -> {safe(args.output)}")
    return 0


def cmd_classifier_train(args: argparse.Namespace, _: list[str]) -> int:
    from tokenmill.pipelines.classifier_train import train
    from tokenmill.terminal import safe

    r = train(args.positive, args.negative, args.output, args.label, args.holdout, args.max_docs,
              {"dim": args.dim, "wordNgrams": args.word_ngrams, "epoch": args.epoch, "lr": args.lr,
               "bucket": args.bucket})
    auc = "no held-out set" if r["auc"] is None else f"held-out AUC {r['auc']:.4f}"
    print(f"trained a fastText classifier on {r['positive']:,} positive and {r['negative']:,} negative documents "
          f"-> {safe(args.output)}; {auc} ({r['held_out_positive']:,} + {r['held_out_negative']:,} held out)")
    return 0


def cmd_train(args: argparse.Namespace, _: list[str]) -> int:
    import time

    from tokenmill.trainer.train_config import load_train_config

    cfg = load_train_config(args.config, args.set, args.data)
    try:
        from tokenmill.trainer.train import run
    except ImportError as e:
        raise UserError(f"the trainer needs torch: pip install 'tokenmill[train]' ({e})") from None
    import signal

    from tokenmill.terminal import safe
    from tokenmill.trainer.parallel import SharedError
    from tokenmill.trainer.train import on_main_thread, rank_prefix

    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        return run(cfg, args.run)
    except SharedError as e:
        # Every rank raised it together: one line from rank 0 says it for all.
        if int(os.environ.get("RANK", "0")) != 0:
            time.sleep(2)  # torchrun kills the other ranks when one exits: let rank 0 print first
            return 2
        print(f"tokenmill: error: {safe(e)}", file=sys.stderr, flush=True)
        return 2
    except UserError as e:
        # This rank's own error (an OOM, a failed write, a lost peer): every rank prints its
        # own line, saying whose it is.
        print(f"tokenmill: error: {rank_prefix()}{safe(e)}", file=sys.stderr, flush=True)
        return 2
    finally:  # after a failure the trainer ignores SIGTERM until the line above is out
        if sigterm is not None and on_main_thread():
            signal.signal(signal.SIGTERM, sigterm)


def cmd_export(args: argparse.Namespace, _: list[str]) -> int:
    import time

    from tokenmill.pipelines.export_formats import export_to
    from tokenmill.terminal import safe

    t0 = time.perf_counter()
    written = export_to(args.out, args.format, args.output)
    dt = time.perf_counter() - t0
    print(f"exported {safe(args.out)} as {args.format} -> {safe(args.output)}: {written / 2**20:,.1f} MB of tokens in {dt:.1f} s "
          f"({written / 2**20 / max(dt, 1e-9):,.0f} MB/s)")
    return 0


def cmd_generate(args: argparse.Namespace, _: list[str]) -> int:
    try:
        from tokenmill.trainer.generate import generate
    except ImportError as e:
        raise UserError(f"generate needs torch: pip install 'tokenmill[train]' ({e})") from None
    from tokenmill.terminal import safe

    text, source = generate(args.run, args.prompt, args.max_tokens, args.temperature, args.top_k, args.seed)
    print(f"tokenmill generate: weights from {safe(source)}", file=sys.stderr)
    print(safe(args.prompt + text, newlines=True))  # a model trained on data says what data said
    return 0


def cmd_spikes(args: argparse.Namespace, _: list[str]) -> int:
    from tokenmill.trainer.spikes import show

    show(args.run, args.data, args.chars)
    return 0


def cmd_compare(args: argparse.Namespace, _: list[str]) -> int:
    try:
        from tokenmill.trainer.compare import compare, print_table
    except ImportError as e:
        raise UserError(f"compare needs torch: pip install 'tokenmill[train]' ({e})") from None
    result = compare(args.outs, args.eval, args.tokens, args.seeds, args.output, args.config, args.set, args.eval_docs)
    from tokenmill.terminal import safe

    print_table(result)
    print(safe(f"compare: {args.output}/compare.html, {args.output}/compare.json"))
    return 0


def _trainer_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="train.yaml", help="trainer config file (default: the tiny preset)")
    p.add_argument("--set", action="append", default=[], metavar="key=value",
                   help="override one config value (YAML syntax), e.g. model.preset=125m; repeatable")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (no usage block); subcommands inherit it."""

    def error(self, message: str):
        raise UserError(f"{message} (see {self.prog} --help)")


_INT64 = 2**63 - 1


def _number(kind: type, lo: float, hi: float):
    """An argparse type: a finite ``kind`` in [lo, hi], else one line saying so."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (math.isfinite(value) and lo <= value <= hi):
            raise argparse.ArgumentTypeError(f"{text!r} is not between {lo:,} and {hi:,}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _export_format(name: str) -> str:
    """An argparse type: a format pipelines/export_formats declares."""
    from tokenmill.pipelines.export_formats import FORMATS

    if name not in FORMATS:
        raise argparse.ArgumentTypeError(f"{name!r} is not one of {', '.join(FORMATS)}")
    return name


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tokenmill",
        description="Raw web text to LLM training shards (Apache Beam), and a trainer that streams them.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"tokenmill {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND")

    p = sub.add_parser(
        "prepare",
        help="run the data pipeline (reads the bundled sample when no --input is given)",
        description="Run the data pipeline. Flags not listed here (--runner, --project, "
        "--direct_num_workers, ...) pass through to Apache Beam.",
        allow_abbrev=False,
    )
    p.add_argument("--input", action="append", metavar="PATH_OR_GLOB",
                   help="file, folder or glob; repeatable (default: the bundled sample corpus)")
    p.add_argument("--output", metavar="DIR", help="output directory (default: ./out)")
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    p.add_argument("--config", metavar="job.yaml", help="job config file")
    p.add_argument("--set", action="append", default=[], metavar="section.key=value",
                   help="override one config value (YAML syntax), repeatable")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser(
        "refilter",
        help="apply other filter, dedup and shard settings to a prepared output, without reading it again",
        description="Re-apply the filters, dedup and the shards to OUT's stored documents with its settings plus "
        "--config/--set (quality.mode back to filter). Beam flags pass through as for prepare.",
        allow_abbrev=False,
    )
    p.add_argument("out", metavar="OUT", help="a prepared output (best made with --set quality.mode=tag)")
    p.add_argument("--output", required=True, metavar="DIR")
    p.add_argument("--config", metavar="job.yaml", help="settings on top of OUT's own")
    p.add_argument("--set", action="append", default=[], metavar="section.key=value")
    p.set_defaults(func=cmd_refilter)

    p = sub.add_parser("config", help="print the default job config as YAML, every key under its help (`> job.yaml`)")
    p.add_argument("--train", action="store_true", help="the trainer's config (tokenmill train --config) instead")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("report", help="print the summary of a prepared output and the path of its report")
    p.add_argument("out", metavar="OUT")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("inspect", help="verify every shard checksum and count, print the splits, decode a few docs")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--docs", type=_number(int, 0, 10_000), default=3, help="documents to decode (default 3)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("classifier", help="train a fastText quality classifier (for quality.classifier.model)")
    csub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = csub.add_parser("train", help="train model.bin on positive and negative texts", allow_abbrev=False)
    for side in ("positive", "negative"):
        c.add_argument(f"--{side}", action="append", required=True, metavar="PATH",
                       help="a prepared OUT folder (its kept docs) or raw inputs (file, folder, glob); repeatable")
    c.add_argument("--output", required=True, metavar="model.bin")
    c.add_argument("--label", default="hq", help="the positive label (quality.classifier.label)")
    c.add_argument("--holdout", type=_number(float, 0.0, 0.9), default=0.1, help="share held apart to measure AUC (default 0.1)")
    c.add_argument("--max-docs", type=_number(int, 1, _INT64), default=500_000, help="per side")
    c.add_argument("--dim", type=_number(int, 1, 4096), default=64)
    c.add_argument("--word-ngrams", type=_number(int, 1, 10), default=2)
    c.add_argument("--epoch", type=_number(int, 1, 10_000), default=5, help="5 with lr 0.1 for 100k+ docs; ~50 with lr 0.5 for a few hundred")
    c.add_argument("--lr", type=_number(float, 1e-9, 100.0), default=0.1)
    c.add_argument("--bucket", type=_number(int, 0, 2**31 - 1), default=500_000, help="hashed n-gram rows (model size: (words + bucket) x dim x 4 B)")
    c.set_defaults(func=cmd_classifier_train)

    p = sub.add_parser("tokenizer", help="train a tokenizer (BPE, WordPiece, Unigram) on cleaned docs")
    tsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    t = tsub.add_parser("train", help="train a tokenizer.json", allow_abbrev=False)
    t.add_argument("--input", action="append", required=True, metavar="PATH",
                   help="a prepared OUT folder (its kept docs) or raw inputs (file, folder, glob); repeatable")
    t.add_argument("--output", required=True, metavar="tokenizer.json")
    t.add_argument("--kind", choices=["bpe", "wordpiece", "unigram"], default="bpe")
    t.add_argument("--vocab-size", type=_number(int, 257, 2**32 - 1), default=32000)
    t.add_argument("--max-docs", type=_number(int, 1, _INT64), default=100_000, help="train on at most this many documents")
    t.set_defaults(func=cmd_tokenizer_train)

    p = sub.add_parser(
        "train",
        help="train a Llama-style model on prepared shards (FSDP2; also under torchrun)",
        description="Train on what `tokenmill prepare` wrote. Rerunning the same command resumes from the "
        "newest complete checkpoint in RUN. Multi-GPU/-node: torchrun --nproc_per_node N --no-python tokenmill train "
        "--data OUT --run-dir RUN ...",
        allow_abbrev=False,
    )
    p.add_argument("--data", action="append", metavar="OUT",
                   help="a prepared output folder; repeatable for a mixture (weights: --set data.weights=[0.7,0.3])")
    # --run-dir, not --run: torchrun's parser takes --run for an abbreviation of its --run-path.
    p.add_argument("--run-dir", "--run", dest="run", required=True, metavar="RUN",
                   help="run folder: metrics, checkpoints, hf export (--run is kept as an alias outside torchrun)")
    _trainer_config_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("export", help="write the shards as Megatron .bin/.idx, nanoGPT train.bin/val.bin or MosaicML MDS",
                       allow_abbrev=False)
    p.add_argument("out", metavar="OUT", help="a prepared output folder")
    p.add_argument("--format", required=True, type=_export_format, help="megatron, nanogpt or mds")
    p.add_argument("--output", required=True, metavar="DIR")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("generate", help="sample text from a trained run (newest checkpoint, else RUN/hf)",
                       allow_abbrev=False)
    p.add_argument("run", metavar="RUN", help="a `tokenmill train` run folder")
    p.add_argument("--prompt", default="", help="text to continue (default: start a new document)")
    p.add_argument("--max-tokens", "--max-new-tokens", dest="max_tokens", type=_number(int, 1, 1 << 20), default=100,
                   help="tokens to generate at most (default 100; --max-new-tokens as in transformers)")
    p.add_argument("--temperature", type=_number(float, 0.0, 1e6), default=0.8, help="0: greedy")
    p.add_argument("--top-k", type=_number(int, 0, 2**31 - 1), default=50, help="0: the whole vocabulary")
    p.add_argument("--seed", type=_number(int, 0, _INT64), default=0)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("spikes", help="the loss spikes of a run, with the documents of their batches",
                       allow_abbrev=False)
    p.add_argument("run", metavar="RUN", help="a `tokenmill train` run folder")
    p.add_argument("--data", required=True, metavar="OUT", help="the prepared output it trained on (its docs)")
    p.add_argument("--chars", type=_number(int, 0, 1 << 20), default=100, help="characters of each document's text to show")
    p.set_defaults(func=cmd_spikes)

    p = sub.add_parser(
        "compare",
        help="train the same proxy model on several prepared outputs and compare them in bits per byte",
        description="Does a data recipe help? Each OUT gets the same proxy model (the trainer's config), "
        "seeds and number of training tokens; every arm is then scored on the same --eval text in bits per byte "
        "(through its own tokenizer) and on every other arm's val split. Rerunning resumes: finished runs are kept.",
        allow_abbrev=False,
    )
    p.add_argument("outs", nargs="+", metavar="OUT", help="prepared output folders (two or more)")
    p.add_argument("--eval", required=True, metavar="EVAL",
                   help="evaluation documents: JSONL or Parquet with a text field, or an OUT folder (its kept docs)")
    p.add_argument("--tokens", type=_number(int, 1, _INT64), required=True, metavar="N", help="training tokens per arm")
    p.add_argument("--seeds", type=_number(int, 1, 100), default=2, help="seeds per arm (default 2: the spread tells noise from gain)")
    p.add_argument("--eval-docs", type=_number(int, 1, _INT64), default=2000, metavar="N", help="evaluate on at most N documents")
    p.add_argument("--output", required=True, metavar="DIR")
    _trainer_config_args(p)
    p.set_defaults(func=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    memory.choose_arrow_pool()  # before pyarrow loads: it holds for the workers this process starts
    parser = build_parser()
    _quiet_logging()
    try:
        args, extra = parser.parse_known_args(argv)
        if not args.verb:
            parser.print_help()
            return 2
        extra = extra if args.verb in ("prepare", "refilter") else store_flags(extra, beam=False)  # --s3_*: any verb
        if extra and args.verb not in ("prepare", "refilter"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return args.func(args, extra)
    except UserError as e:
        from tokenmill.credentials import redact
        from tokenmill.terminal import safe

        print(f"tokenmill: error: {redact(safe(e))}", file=sys.stderr)  # data shown safe; no credential
        return 2
    except Terminated:
        print("tokenmill: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("tokenmill: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The ``tokenmill`` command. A Beam job leaves gRPC and the runner's idle threads loaded,
    and Python's teardown of them is a real share of a short job: once the output is written and
    flushed, a Beam verb's process ends at once (bench/MEASUREMENTS.md: Beam verbs end with
    os._exit)."""
    code = main()
    if sys.argv[1:2] in (["prepare"], ["refilter"]):
        # The atexit handlers still run: Beam stops the Flink or Spark job server's JVM there
        # (bench/MEASUREMENTS.md: job-server JVMs stopped at exit), and the LOOPBACK worker's servers.
        from tokenmill import ending

        ending.exit_after_handlers(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()

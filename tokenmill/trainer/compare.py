"""``tokenmill compare``: does a data recipe help? Train the same proxy model on each prepared
output, with the same seeds and the same number of training tokens, then evaluate every arm on
the same text in bits per byte (each arm through its own tokenizer, so arms with different
tokenizers compare), and each arm on every other arm's validation split.

    DIR/runs/<arm>-seed<s>/   each run: the trainer's own RUN folder (metrics, hf/), done.json
    DIR/compare.json          every figure below
    DIR/compare.html          one self-contained page (compare_html.py)

Training is `tokenmill train` itself, one process per run (one GPU, or the CPU), one run at a
time. A run whose done.json matches the settings is not trained or evaluated again, so an
interrupted compare resumes where it stopped.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys

from tokenmill.errors import UserError
from tokenmill.terminal import safe
from tokenmill.trainer.train_config import load_train_config

EVAL_DOCS = 2000  # default cap on evaluation documents (the first ones, in file order)


# ---------------------------------------------------------------- inputs


def read_texts(path: str, limit: int) -> list[str]:
    """Documents' text from a JSONL file (field "text"), a Parquet file (column "text"), or a
    prepared OUT folder (its kept docs), in a fixed order; at most ``limit``."""
    import pyarrow.parquet as pq

    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "docs", "kept-*.parquet")))
        if not files:
            raise UserError(f"--eval {path}: a folder, but not a prepared output (no docs/kept-*.parquet)")
    elif os.path.isfile(path):
        files = [path]
    else:
        raise UserError(f"--eval {path}: no such file or folder")
    texts: list[str] = []
    for f in files:
        try:
            if f.endswith(".parquet"):
                texts.extend(t for t in pq.read_table(f, columns=["text"]).column("text").to_pylist() if t)
            else:
                with open(f, encoding="utf-8") as fh:
                    for line in fh:
                        if line.strip():
                            text = json.loads(line).get("text")
                            if isinstance(text, str) and text:
                                texts.append(text)
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise UserError(f"--eval {f}: not JSONL or Parquet documents with a text field ({e})") from None
        if len(texts) >= limit:
            break
    if not texts:
        raise UserError(f"--eval {path}: no documents with text")
    return texts[:limit]


def val_texts(out: str, manifest: dict, limit: int) -> list[str]:
    """An arm's validation split as text: its documents' tokens decoded by its own tokenizer."""
    import pyarrow as pa

    from tokenmill.format import tokenizer_path
    from tokenmill.native import load_tokenizer

    tok = manifest["tokenizer"]
    tokenizer = load_tokenizer(tokenizer_path(out, manifest))
    texts: list[str] = []
    for shard in manifest["splits"].get("val", {}).get("shards", []):
        with pa.memory_map(os.path.join(out, shard["file"])) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                for ids in reader.get_batch(i).column("tokens").to_pylist():
                    texts.append(tokenizer.decode([t for t in ids if t != tok["eos_id"]]))
                    if len(texts) >= limit:
                        return texts
    return texts


def arm_names(outs: list[str]) -> list[str]:
    """Short, unique names: the folder names, numbered where two are the same."""
    base = [os.path.basename(os.path.normpath(o)) or "out" for o in outs]
    return [b if base.count(b) == 1 else f"{b}-{i + 1}" for i, b in enumerate(base)]


# ---------------------------------------------------------------- training and evaluation


def train_run(out: str, run_dir: str, seed: int, steps: int, config: str | None, sets: list[str], label: str) -> None:
    """`tokenmill train` in its own process; its progress lines pass through, its error line
    (if any) becomes ours."""
    cmd = [sys.executable, "-m", "tokenmill.cli", "train", "--data", out, "--run-dir", run_dir]
    if config:
        cmd += ["--config", config]
    # data.verify_checksums=false: compare() hashed every shard just before; each run checks sizes.
    for s in [*sets, f"seed={seed}", f"train.steps={steps}", "export.enabled=true", "checkpoint.final=none",
              "checkpoint.best=false", "data.verify_checksums=false"]:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    error = None
    for line in proc.stderr:
        if line.startswith("tokenmill: error:"):
            error = line.removeprefix("tokenmill: error:").strip()
        elif line.startswith("step ") or "exported" in line:
            print(safe(f"  {label}: {line.rstrip()}"), file=sys.stderr, flush=True)
    if proc.wait() != 0:
        raise UserError(f"compare: training {label} failed: {error or f'exit code {proc.returncode}'}")


def read_curve(run_dir: str) -> list[list[float]]:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [[r["step"], r["loss"]] for r in rows if r.get("loss") is not None]


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values),
            "std": statistics.stdev(values) if len(values) > 1 else None}


def verdicts(arms: list[dict]) -> list[dict]:
    """Each arm against the best one (lowest mean eval bpb): the gap is real when the two arms'
    seed ranges do not overlap (needs 2+ seeds)."""
    best = min(arms, key=lambda a: a["eval_bpb"]["mean"])
    out = []
    for a in arms:
        if a is best:
            continue
        gap = a["eval_bpb"]["mean"] - best["eval_bpb"]["mean"]
        noise = (a["eval_bpb"]["max"] - a["eval_bpb"]["min"]) + (best["eval_bpb"]["max"] - best["eval_bpb"]["min"])
        known = a["eval_bpb"]["n"] > 1 and best["eval_bpb"]["n"] > 1
        out.append({"best": best["name"], "arm": a["name"], "gap_bpb": gap, "seed_spread_bpb": noise if known else None,
                    "exceeds_spread": (a["eval_bpb"]["min"] > best["eval_bpb"]["max"]) if known else None})
    return out


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def compare(outs: list[str], eval_path: str, tokens: int, seeds: int, output: str, config: str | None = None,
            sets: list[str] | None = None, eval_docs: int = EVAL_DOCS) -> dict:
    from tokenmill import __version__
    from tokenmill.format import local_view, tokenizer_path
    from tokenmill.trainer import windows as D
    from tokenmill.trainer.evaluation import text_bpb
    from tokenmill.trainer.hf_export import load_exported

    sets = list(sets or [])
    if len(outs) < 2:
        raise UserError("compare: give at least two prepared outputs")
    if tokens <= 0 or seeds <= 0:
        raise UserError("compare: --tokens and --seeds must be positive")
    from tokenmill.folders import output_folder

    output_folder(output, "compare: --output")
    names = arm_names(outs)
    # An OUT on an object store: its files fetched into the local cache, checked, read from there.
    outs = [local_view(o, files=True) for o in outs]
    if "://" in eval_path:
        eval_path = local_view(eval_path, files=True)
    cfg = load_train_config(config, sets, outs[:1])
    manifests = [D.open_output(o, cfg.data.verify_checksums) for o in outs]
    texts = read_texts(eval_path, eval_docs)
    per_step = cfg.train.micro_batch * cfg.train.grad_accum * cfg.data.seq_len
    steps = max(1, math.ceil(tokens / per_step))
    os.makedirs(os.path.join(output, "runs"), exist_ok=True)
    device = _device()
    # What a finished run's done.json must match to be reused: the settings and the eval text.
    config_text = None
    if config:
        with open(config, encoding="utf-8") as fh:
            config_text = fh.read()
    key = hashlib.sha256(json.dumps([config_text, sets, steps, eval_docs, texts]).encode()).hexdigest()
    val = {name: val_texts(o, m, eval_docs) for name, o, m in zip(names, outs, manifests)}
    arms = []
    for i, (name, out, m) in enumerate(zip(names, outs, manifests)):
        tok = m["tokenizer"]
        tokenizer_json = tokenizer_path(out, m)
        # A run is reused only for the same settings, eval text and data (its shards' hashes).
        shard_hashes = sorted(sh["sha256"] for info in m["splits"].values() for sh in info.get("shards", []))
        arm_key = hashlib.sha256(json.dumps([key, tok["sha256"], shard_hashes]).encode()).hexdigest()
        runs = []
        for seed in range(seeds):
            label = f"{name} seed {seed} ({i * seeds + seed + 1}/{len(outs) * seeds})"
            run_dir = os.path.join(output, "runs", f"{name}-seed{seed}")
            done_path = os.path.join(run_dir, "done.json")
            done = None
            if os.path.exists(done_path):
                with open(done_path, encoding="utf-8") as fh:
                    done = json.load(fh)
            if not done or done.get("key") != arm_key:
                # Anything there is another setting's run: the trainer would resume from it.
                shutil.rmtree(run_dir, ignore_errors=True)
                print(safe(f"compare: training {label}: {steps} steps x {per_step:,} tokens"), file=sys.stderr,
                      flush=True)
                train_run(out, run_dir, seed, steps, config, sets, label)
                model = load_exported(os.path.join(run_dir, "hf")).to(device)
                on_val = {other: text_bpb(model, tokenizer_json, tok["eos_id"], t, cfg.data.seq_len, device)["bpb"]
                          for other, t in val.items() if t}
                done = {"key": arm_key, "seed": seed,
                        "eval": text_bpb(model, tokenizer_json, tok["eos_id"], texts, cfg.data.seq_len, device),
                        "val_bpb": on_val}
                with open(done_path, "w", encoding="utf-8") as fh:
                    json.dump(done, fh, indent=2)
            else:
                print(safe(f"compare: {label} already done"), file=sys.stderr, flush=True)
            curve = read_curve(run_dir)
            runs.append({"seed": seed, "run_dir": run_dir, "eval_bpb": done["eval"]["bpb"],
                         "eval_tokens": done["eval"]["tokens"], "final_loss": curve[-1][1] if curve else None,
                         "curve": curve, "val_bpb": done["val_bpb"]})
        report = {}
        report_path = os.path.join(out, "report", "report.json")
        if os.path.exists(report_path):
            with open(report_path, encoding="utf-8") as fh:
                r = json.load(fh)
            report = {"documents": r.get("documents"), "funnel": r.get("funnel"), "tokens_kept": r.get("tokens_kept"),
                      "top_drops": sorted(r.get("dropped_by", {}).items(), key=lambda kv: (-kv[1], kv[0]))[:10]}
        arms.append({"name": name, "out": out, "tokenizer": {"vocab_size": tok["vocab_size"], "sha256": tok["sha256"]},
                     "train_tokens": steps * per_step,
                     "corpus_tokens": sum(s["tokens"] for s in m["splits"].get("train", {}).get("shards", [])),
                     "runs": runs, "eval_bpb": spread([r["eval_bpb"] for r in runs]), "report": report})
    matrix = [[statistics.fmean(r["val_bpb"][col] for r in a["runs"]) if col in a["runs"][0]["val_bpb"] else None
               for col in names] for a in arms]
    result = {"tokenmill_version": __version__, "tokens_per_arm": steps * per_step, "steps": steps,
              "seq_len": cfg.data.seq_len, "batch_tokens": per_step, "seeds": list(range(seeds)),
              "model": cfg.model.dims(), "eval": {"path": eval_path, "docs": len(texts),
                                                  "bytes": sum(len(t.encode()) for t in texts)},
              "arms": arms, "verdicts": verdicts(arms),
              "val_matrix": {"models": names, "val_splits": names, "bpb": matrix}}
    from tokenmill.trainer.compare_html import render

    with open(os.path.join(output, "compare.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
    with open(os.path.join(output, "compare.html"), "w", encoding="utf-8") as fh:
        fh.write(render(result))
    return result


def print_table(result: dict, console=None) -> None:
    from rich.table import Table

    from tokenmill.terminal import console as safe_console
    from tokenmill.terminal import markup as m

    console = console or safe_console()  # arm names are the outputs' folder names: terminal.markup
    t = Table(title=f"eval bits per byte ({result['eval']['docs']:,} docs, {result['tokens_per_arm']:,} training "
                    f"tokens per arm, {len(result['seeds'])} seed(s))")
    for col in ("arm", "bpb mean", "seed min-max", "vocab", "kept tokens"):
        t.add_column(col, justify="left" if col == "arm" else "right")
    for a in result["arms"]:
        b = a["eval_bpb"]
        t.add_row(m(a["name"]), f"{b['mean']:.4f}", f"{b['min']:.4f}-{b['max']:.4f}", f"{a['tokenizer']['vocab_size']:,}",
                  f"{a['corpus_tokens']:,}")
    console.print(t)
    for v in result["verdicts"]:
        said = ("seed spread unknown (1 seed)" if v["exceeds_spread"] is None else
                "beyond the seed spread" if v["exceeds_spread"] else "within the seed spread")
        console.print(f"{m(v['best'])} beats {m(v['arm'])} by {v['gap_bpb']:.4f} bpb: {said}")

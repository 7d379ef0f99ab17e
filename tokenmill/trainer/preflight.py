"""Refusals before any training work: everything a user can get wrong is found at start and
said in one line on every rank (a folder that cannot be written, data that fails its checksums,
a step that will not fit in memory, a RUN of another tokenizer or model shape)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import torch.distributed as dist

from tokenmill.errors import UserError
from tokenmill.trainer import checkpoint as ckpt
from tokenmill.trainer import windows as D
from tokenmill.trainer.metrics import available_memory
from tokenmill.trainer.model import ModelArgs, count_params
from tokenmill.trainer.parallel import Dist, SharedError, raise_if_any, wants_fsdp
from tokenmill.trainer.train_config import TrainJobConfig


def cpu_memory_needed(args: ModelArgs, cfg: TrainJobConfig, precision: str, shards: int) -> tuple[float, float]:
    """(weights + gradients + AdamW moments, activations + logits) of one rank, in bytes. Fitted
    on measured peaks (fp32, no checkpointing): each block keeps ~16 d + 4 ffn values per token for
    backward, the loss ~4 x vocab (logits, log-softmax and their gradients). Attention matrices
    of data.doc_mask are left out: the figure errs low rather than refuse a run that fits."""
    n_all, _ = count_params(args)
    value = 2 if precision in ("bf16", "fp16") else 4
    block = (16 * args.d_model + 4 * args.ffn_hidden) * value
    every = cfg.parallel.activation_checkpointing
    recomputed = -(-args.n_layers // every) if every else 0  # these keep only their input, plus one block's worth
    per_token = (args.n_layers - recomputed) * block + recomputed * args.d_model * value + (block if every else 0) \
        + 16 * args.vocab_size
    return 16 * n_all / shards, per_token * cfg.train.micro_batch * cfg.data.seq_len


def open_data(cfg: TrainJobConfig, d: Dist) -> list[dict]:
    """Manifests of every --data output. Each rank hashes its own slice of the shards (rank r
    the r-th of every world), then the ranks agree: at TB scale one rank hashing everything
    while the others wait would take the start-up past any timeout."""
    manifests, error = None, None
    try:
        manifests = [D.open_output(p, cfg.data.verify_checksums, part=(d.rank, d.world)) for p in cfg.data.paths]
    except UserError as e:
        error = str(e)
    raise_if_any(error, d)
    return manifests


_HELD: list[int] = []  # the lock on RUN, held until the run ends (release_run_dir) or this process does


def release_run_dir() -> None:
    while _HELD:
        os.close(_HELD.pop())


def prepare_run_dir(run: str, d: Dist) -> None:
    """RUN must be a folder every rank can write to: found now, not at the first checkpoint;
    and no other `tokenmill train` may be writing into it (rank 0 holds RUN's lock)."""
    from tokenmill.folders import output_folder, take_lock

    error = None
    try:
        if d.main:
            output_folder(run, "--run-dir")
            _HELD.append(take_lock(run, "train", "--run-dir", "--run-dir (or let it finish to resume)"))
    except UserError as e:
        error = str(e)
    raise_if_any(error, d)
    try:  # every rank writes there too (on several hosts, RUN must be a shared folder)
        output_folder(run, "--run-dir")
    except UserError as e:
        error = str(e)
    raise_if_any(error, d)


def check_cpu_memory(args: ModelArgs, cfg: TrainJobConfig, precision: str, d: Dist) -> None:
    """On CPU a step that does not fit is OOM-killed without a word: refuse it up front. (On a
    GPU the loop's OutOfMemoryError handler says what to lower.)"""
    available = available_memory() if d.device.type == "cpu" else None
    if available is None:
        return
    state, act = cpu_memory_needed(args, cfg, precision, d.world if wants_fsdp(d, cfg.parallel.shard_single_rank) else 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # ranks sharing this machine's memory
    error = None
    if local * (state + act) > available:
        gib = 2**30
        error = (f"training needs about {local * (state + act) / gib:.1f} GiB of memory, {available / gib:.1f} GiB "
                 f"is available: {local} rank(s) x ({state / gib:.1f} GiB weights, gradients and AdamW state + "
                 f"{act / gib:.1f} GiB activations for a micro-batch of {cfg.train.micro_batch} x {cfg.data.seq_len} "
                 f"tokens); lower train.micro_batch (raise train.grad_accum to keep the batch) or data.seq_len, set "
                 f"parallel.activation_checkpointing=1, or use a smaller model")
    raise_if_any(error, d)


def check_same_tokenizer(found: tuple[int, str] | None, tok: dict, cfg: TrainJobConfig, run: str) -> str | None:
    """A RUN keeps one tokenizer: the same ids from another one are other tokens, and the export
    would ship the new tokenizer with weights trained on the old. Returns a warning for a
    checkpoint written before trainer.json recorded it."""
    if not found:
        return None
    before = ckpt.read_state(found[1]).get("tokenizer_sha256")
    if before is None:
        return f"{found[1]} does not record its tokenizer (an older tokenmill): cannot check it is the data's"
    if before != tok["sha256"]:
        raise SharedError(f"{run} was trained with tokenizer {before[:12]} and --data {' '.join(cfg.data.paths)} has "
                        f"tokenizer {tok['sha256'][:12]}: use a new --run-dir, or data prepared with the run's tokenizer")
    return None


def check_same_model(run: str, args: ModelArgs, d: Dist) -> None:
    """A RUN keeps one model shape: resuming a different one would fail deep inside DCP."""
    path = os.path.join(run, "model.json")
    existed = os.path.exists(path)
    if existed:
        with open(path, encoding="utf-8") as fh:
            before = json.load(fh)
        if before != asdict(args):
            diff = ", ".join(f"{k} {before.get(k)} -> {v}" for k, v in asdict(args).items() if before.get(k) != v)
            raise SharedError(f"{run} holds a run of another model shape ({diff}): use a new --run-dir or the same settings")
    dist.barrier()  # every rank has looked before rank 0 writes
    if d.main and not existed:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(asdict(args), fh, indent=2)

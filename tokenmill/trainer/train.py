"""The training loop. Reads top to bottom: set up, resume, then one step at a time
(micro-steps, clip, optimizer, metrics, eval, checkpoint), then export.

Every decision that ends or changes the run (skip a non-finite step, save on the wall clock,
stop on SIGTERM, give up) is taken on values all-reduced across ranks, so all ranks always
take it together.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import re
import shutil
import signal
import sys
import time
from collections import deque

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tokenmill.data import PackedDataset
from tokenmill.data import loader as data_loader
from tokenmill.errors import UserError, first_line
from tokenmill.format import tokenizer_path
from tokenmill.trainer import checkpoint as ckpt
from tokenmill.trainer import data as D
from tokenmill.trainer.config import OptimConfig, TrainJobConfig
from tokenmill.trainer.evaluation import evaluate, token_byte_lengths
from tokenmill.trainer.metrics import (
    Metrics,
    PendingSteps,
    memory_row,
    peak_flops,
    run_summary,
    truncate_after,
)
from tokenmill.trainer.model import ModelArgs, Transformer, count_params, flops_per_token
from tokenmill.trainer.parallel import (
    LOW,
    Dist,
    SharedError,
    agree_on_host,
    close_distributed,
    fsdp_casts,
    init_distributed,
    lost_peer,
    parallelize,
    raise_if_any,
    set_train_timeout,
    wants_fsdp,
)
from tokenmill.trainer.preflight import (
    check_cpu_memory,
    check_same_model,
    check_same_tokenizer,
    open_data,
    prepare_run_dir,
)
from tokenmill.trainer.spikes import FILE as SPIKES
from tokenmill.trainer.spikes import SpikeLog

# ---------------------------------------------------------------- pure pieces


def lr_at(step: int, peak: float, total: int, warmup: int, start_frac: float = 0.1, final_frac: float = 0.01) -> float:
    """Linear warmup from peak*start_frac to peak over ``warmup`` steps, then cosine down to
    peak*final_frac at ``total``."""
    if step < warmup:
        return peak * (start_frac + (1.0 - start_frac) * step / warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (final_frac + (1.0 - final_frac) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only: never on norm gains or biases (vectors)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 and "norm" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, o: OptimConfig, lr: float) -> torch.optim.Optimizer:
    # Fused (one kernel over all params, CPU and GPU): with DTensor params torch would
    # otherwise fall back to its per-tensor loop. It also skips a step on the device (step_unless).
    return torch.optim.AdamW(param_groups(model, o.weight_decay), lr=lr, betas=(o.beta1, o.beta2), eps=o.eps,
                             fused=True)


def step_unless(optim: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """optimizer.step(), skipped inside the fused kernel when ``skip`` (a device bool) is true:
    no host round trip to decide. The same contract GradScaler uses (``found_inf``); the
    kernel also takes back its step count. With CPU offload the parameters are on the CPU: the
    flag is copied there first, blocking (the kernel's own copy would not wait for it)."""
    optim.found_inf = skip.float().to(optim.param_groups[0]["params"][0].device)
    try:
        optim.step()
    finally:
        del optim.found_inf


def agree_found_inf(scaler, optim: torch.optim.Optimizer, finite: torch.Tensor) -> None:
    """GradScaler.unscale_ looks for inf/NaN in this rank's shards of the gradients only, so with
    FSDP one rank could skip a step (and halve its scale) while the others step. Every rank
    takes the global verdict instead (``finite`` is computed from all-reduced values); the same
    as ShardedGradScaler's all-reduce, without its extra collective. (GradScaler keeps the
    per-device flags in its private per-optimizer state.)"""
    state = scaler._per_optimizer_states[id(optim)]
    for dev, found in state["found_inf_per_device"].items():
        found.copy_((~finite).float().to(dev))


def resolve_precision(precision: str, device: torch.device) -> str:
    """auto: bf16 on a GPU whose tensor cores have it (Ampere and newer); not on one that only
    emulates it (V100, T4: slower than fp32 there), else fp32."""
    if precision == "auto":
        native = device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
        return "bf16" if native else "fp32"
    return precision


def autocast(precision: str, device: torch.device):
    """Where FSDP's policy does not cast (CPU), bf16 and fp16 run under autocast."""
    if precision in LOW and not fsdp_casts(precision, device):
        return torch.autocast(device.type, dtype=LOW[precision])
    return contextlib.nullcontext()


def model_args(cfg: TrainJobConfig, vocab_size: int) -> ModelArgs:
    dims = cfg.model.dims()
    return ModelArgs(vocab_size=vocab_size, max_seq_len=cfg.data.seq_len, rope_theta=cfg.model.rope_theta,
                     norm_eps=cfg.model.norm_eps, **dims)


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy in fp32. Compiled with the blocks (parallel.compile), the fp32 copy
    of the B x T x V logits is fused away."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")


def forward(model, batch: dict, precision: str, device: torch.device) -> torch.Tensor:
    """Logits of one batch's inputs (every token but the last), under the run's precision."""
    tokens = batch["tokens"]
    with autocast(precision, device):
        return model(tokens[:, :-1], batch.get("positions"), batch.get("doc_ids"))


def loss_sum(model, batch: dict, precision: str, device: torch.device, loss_fn=token_loss_sum) -> torch.Tensor:
    """Sum (not mean) of the token losses of one micro-batch, in fp32."""
    return loss_fn(forward(model, batch, precision, device), batch["tokens"][:, 1:])


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


class _StopFlag:
    """SIGTERM (preemption, scancel) asks for a checkpoint at the end of the current step. A
    second SIGTERM (torchrun stopping the job because another rank failed, an impatient
    scheduler) ends the process at once: the checkpoint it would wait for may never come."""

    def __init__(self):
        self.set = False
        self._old = signal.signal(signal.SIGTERM, self._handle) if on_main_thread() else None

    def _handle(self, *_):
        if self.set:
            print(f"tokenmill: error: {rank_prefix()}stopped by a second SIGTERM before the checkpoint was saved",
                  file=sys.stderr, flush=True)
            os._exit(143)
        self.set = True

    def restore(self, failed: bool = False):
        """Back to the previous handler; after a failure, SIGTERM is ignored instead: torchrun
        sends it to every rank as soon as one fails, and the default action would kill this
        rank before it prints its own error line (the CLI restores the handler after that)."""
        if self._old is not None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN if failed else self._old)


def on_main_thread() -> bool:
    """Signal handlers can only be set from the main thread (an in-process caller may not be on it)."""
    import threading

    return threading.current_thread() is threading.main_thread()


def rank_prefix() -> str:
    """``rank N: `` under a multi-rank launch, so each rank's own error line says whose it is."""
    return f"rank {os.environ.get('RANK', '0')}: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""


def oom_message(cfg: TrainJobConfig, step: int) -> str:
    return (f"CUDA out of memory at step {step} (micro batch {cfg.train.micro_batch} x seq_len {cfg.data.seq_len}): "
            f"lower train.micro_batch (raise train.grad_accum to keep the batch) or data.seq_len, or set "
            f"parallel.activation_checkpointing=1 or parallel.cpu_offload=true")


# ---------------------------------------------------------------- the run


def run(cfg: TrainJobConfig, run_dir: str) -> int:
    if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ:
        # Before the allocator starts: segments that grow instead of new blocks of every size
        # keep fragmentation (and allocator retries) down when batch shapes or compile vary.
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    d = init_distributed(cfg.parallel.init_timeout_s)
    try:
        rc = train(cfg, run_dir, d)
        # Ranks leave together. A rank that tore its gloo group down straight after the export's
        # gather, while rank 0 was still writing, could abort at exit (SIGABRT, "terminate
        # called without an active exception"): 2 of ~8 suite runs on this machine.
        dist.barrier()
        return rc
    except RuntimeError as e:
        if not lost_peer(e):
            raise
        # A collective failed: a peer died (its own error line says why) or timed out.
        first = re.sub(r"^\[[^\]]*\]\s*", "", first_line(e, None)).split(". ")[0][:160]  # gloo's "[file.cc:553] "
        raise UserError(f"lost contact with the other ranks ({first}): another rank failed "
                        f"(see its error) or hung past parallel.train_timeout_s") from None
    finally:
        close_distributed()


def train(cfg: TrainJobConfig, run_dir: str, d: Dist) -> int:
    # -- refusals first: everything a user can get wrong, before any training work
    prepare_run_dir(run_dir, d)
    manifests = open_data(cfg, d)
    tok = D.check_compatible(manifests, cfg.data.paths)
    precision = resolve_precision(cfg.precision, d.device)
    args = model_args(cfg, tok["vocab_size"])
    check_cpu_memory(args, cfg, precision, d)
    ckpt_root = os.path.join(run_dir, "checkpoints")
    if d.main:
        ckpt.sweep(ckpt_root)
    dist.barrier()
    found = [ckpt.latest(ckpt_root)]
    dist.broadcast_object_list(found, src=0)
    tokenizer_warning = check_same_tokenizer(found[0], tok, cfg, run_dir)
    check_same_model(run_dir, args, d)

    # -- data: one token stream per output and split
    streams = [D.TokenStream(D.split_files(p, m, "train"), tok["eos_id"]) for p, m in zip(cfg.data.paths, manifests)]
    dataset = D.PackedWindows(streams, cfg.data.seq_len, cfg.seed, cfg.data.weights or None, cfg.data.doc_mask,
                              tok["vocab_size"])
    val_streams = [D.TokenStream(D.split_files(p, m, "val"), tok["eos_id"]) for p, m in zip(cfg.data.paths, manifests)]
    val, error = [], None
    try:
        val = D.val_batches(val_streams, cfg.data.seq_len, cfg.eval.samples, cfg.train.micro_batch, d.rank, d.world,
                            cfg.data.doc_mask, tok["vocab_size"])
    except UserError as e:  # each rank reads its own windows: any rank's error stops all
        error = str(e)
    raise_if_any(error, d)

    # -- model, optimizer, precision
    torch.manual_seed(cfg.seed)
    model = parallelize(lambda: Transformer(args), cfg, d, precision)
    optim = build_optimizer(model, cfg.optim, cfg.lr())
    scaler = torch.amp.GradScaler(d.device.type) if precision == "fp16" else None
    loss_fn = torch.compile(token_loss_sum) if cfg.parallel.compile else token_loss_sum
    tokenizer_json = tokenizer_path(cfg.data.paths[0], manifests[0])
    if d.main:  # the run keeps the tokenizer it trains with: `tokenmill generate` reads it
        shutil.copyfile(tokenizer_json, os.path.join(run_dir, "tokenizer.json"))
    byte_lengths = torch.from_numpy(token_byte_lengths(tokenizer_json)).to(d.device) if val else None

    # -- resume from the newest complete checkpoint (its integers say where the data stands)
    state = {"step": 0, "samples": 0, "seed": cfg.seed, "skipped_steps": 0, "bad_in_row": 0, "best_val": None,
             "tokenizer_sha256": tok["sha256"], "eos_id": tok["eos_id"]}
    if found[0]:  # the sha again after: a checkpoint older than the field gets it from now on
        state.update(ckpt.load(found[0][1], model, optim), tokenizer_sha256=tok["sha256"], eos_id=tok["eos_id"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])  # scale and growth tracker: the run goes on as if never stopped
        elif scaler is not None and state.get("scale"):  # a checkpoint from before the scaler's state was saved
            scaler = torch.amp.GradScaler(d.device.type, init_scale=state["scale"])
    if d.main:  # lines a killed run logged past its last checkpoint are dropped
        for name in ("metrics.jsonl", SPIKES):
            truncate_after(os.path.join(run_dir, name), state["step"])
    metrics = Metrics(run_dir, d.main, cfg.metrics.tensorboard, cfg.train.steps, cfg.train.log_every)
    if found[0]:
        metrics.note(f"resumed from {found[0][1]} (step {state['step']}, {state['samples']:,} samples)")
    if tokenizer_warning:
        metrics.note(f"warning: {tokenizer_warning}")

    # -- the loop
    G = cfg.train.micro_batch * cfg.train.grad_accum * d.world
    global_tokens = G * cfg.data.seq_len  # every window has seq_len targets, none masked
    fpt = flops_per_token(args, cfg.data.seq_len)
    peak = peak_flops(d.device, precision, cfg.metrics.peak_flops)
    warmup = cfg.warmup()
    n_all, n_body = count_params(args)
    if state["step"] < cfg.train.steps:
        metrics.note(f"{n_all / 1e6:.1f}M parameters ({n_body / 1e6:.1f}M without embeddings), {d.world} rank(s) on "
                     f"{d.device.type} ({'FSDP2' if wants_fsdp(d, cfg.parallel.shard_single_rank) else 'unsharded'}), "
                     f"{precision}, global batch {G} x {cfg.data.seq_len} tokens, peak lr {cfg.lr():g}, "
                     f"steps {state['step']} -> {cfg.train.steps}")
    # Micro-batch j of this rank (step j // grad_accum) is a pure function of (seed, samples
    # consumed at the start, j): the checkpoint's integer is the whole data state.
    stream = PackedDataset(cfg.data.paths, cfg.data.seq_len, cfg.seed, d.rank, d.world, cfg.train.micro_batch,
                           first_sample=state["samples"], windows=dataset)
    loader = data_loader(stream, cfg.data.num_workers, cfg.data.prefetch_factor, pin_memory=d.device.type == "cuda")
    batches = iter(loader)
    saver = ckpt.Saver(cfg.checkpoint.async_save, d.main, cfg.checkpoint.keep)
    pending = PendingSteps(global_tokens)
    spikes = SpikeLog(run_dir, d.main, cfg.train.spike_factor, cfg.train.spike_window, dataset.docs_of,
                      cfg.data.seq_len, G)
    logged: deque[dict] = deque(maxlen=2000)  # the summary's window: memory does not grow with the run
    stop = _StopFlag()
    last_save = time.monotonic()
    step = start_step = state["step"]
    failed = True
    set_train_timeout(cfg.parallel.train_timeout_s)
    if cfg.parallel.gc_every:  # collections at the same steps on every rank, not whenever one rank's heap says so
        gc.collect()
        gc.disable()
    try:
        while step < cfg.train.steps:
            lr = lr_at(step, cfg.lr(), cfg.train.steps, warmup, cfg.optim.warmup_start_frac, cfg.optim.final_frac)
            for group in optim.param_groups:
                group["lr"] = lr

            # micro-steps: each backward adds d(sum of its token losses)/global_tokens; FSDP
            # averages over ranks, hence the factor world: the result is the gradient of the
            # mean loss over every target token of the global batch.
            wait, total = 0.0, torch.zeros((), dtype=torch.float64, device=d.device)
            data_error = None
            for micro in range(cfg.train.grad_accum):
                tw = time.perf_counter()
                batch = next(batches)
                wait += time.perf_counter() - tw
                if "error" in batch:  # a filler keeps this rank in the others' collectives until the flags agree
                    data_error = data_error or batch["error"]
                    batch = dataset.filler(cfg.train.micro_batch)
                batch = to_device(batch, d.device)
                if cfg.train.skip_sync and cfg.train.grad_accum > 1 and hasattr(model, "set_requires_gradient_sync"):
                    model.set_requires_gradient_sync(micro == cfg.train.grad_accum - 1)
                ls = loss_sum(model, batch, precision, d.device, loss_fn)
                scaled = ls * (d.world / global_tokens)
                (scaler.scale(scaled) if scaler else scaled).backward()
                total += ls.detach()

            # Nothing below waits for the device: the loss and the grad norm stay tensors, a
            # non-finite step is skipped inside the fused optimizer, and the host reads the
            # values at log steps only (PendingSteps).
            if scaler is not None:
                scaler.unscale_(optim)
            # On the compute device: with CPU offload the gradients (and so the norm) are on the CPU.
            grad_norm = _full(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)).to(d.device)
            if d.world > 1:
                dist.all_reduce(total)
            finite = torch.isfinite(total) & torch.isfinite(grad_norm)
            # What the ranks must agree on, from the host alone: rank 0's clock, whether any rank
            # was asked to stop, whether any rank's data failed, and whether every rank has
            # finished writing a background checkpoint.
            want_time_save = d.main and cfg.checkpoint.every_minutes > 0 and \
                time.monotonic() - last_save >= 60 * cfg.checkpoint.every_minutes
            time_flag, stop_flag, data_flag, written = agree_on_host(
                [want_time_save, stop.set, data_error is not None, saver.done_here()], d.world)
            if data_flag:
                raise_if_any(data_error, d)
            if saver.pending() and written == d.world:
                saver.commit()
            if scaler is not None:
                agree_found_inf(scaler, optim, finite)
                scaler.step(optim)  # skips the update itself when the grads overflowed
                scaler.update()
            else:
                step_unless(optim, ~finite)
            optim.zero_grad(set_to_none=True)
            step += 1
            state["step"], state["samples"] = step, state["samples"] + G
            pending.add({"step": step, "lr": lr, "wait": wait, "tokens": state["samples"] * cfg.data.seq_len},
                        total, grad_norm)
            if cfg.parallel.gc_every and step % cfg.parallel.gc_every == 0:
                gc.collect(1)

            do_eval = bool(val) and ((cfg.eval.every and step % cfg.eval.every == 0) or step == cfg.train.steps)
            do_save = (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or time_flag or stop_flag
            if step % cfg.train.log_every and step != cfg.train.steps and not (do_eval or do_save):
                continue
            rows = pending.flush()
            memory = memory_row(d.device)
            if do_eval:
                rows[-1].update(evaluate(model, val, lambda m, b: forward(m, b, precision, d.device), d.device,
                                         byte_lengths))
            for row in rows:
                row.update(memory, mfu=row["tokens_per_s"] * fpt / (peak * d.world) if peak else None)
                state["bad_in_row"] = state["bad_in_row"] + 1 if row["skipped"] else 0
                state["skipped_steps"] += row["skipped"]
                metrics.log(row)
                logged.append(row)
                spike = spikes.check(row)
                if spike:
                    metrics.note(f"loss spike at step {spike['step']}: {spike['loss']:.4f} vs median "
                                 f"{spike['median']:.4f}, {len(spike['docs'])} document(s) in {SPIKES}")
                if state["bad_in_row"] >= cfg.train.max_bad_steps:
                    hint = ", or use precision=bf16" if precision == "fp16" else ""
                    raise SharedError(f"{state['bad_in_row']} steps in a row had a non-finite loss or gradient norm "
                                      f"(last at step {row['step']}): lower optim.lr or raise optim.warmup_steps{hint}")
            if do_eval and cfg.checkpoint.best and (state["best_val"] is None or rows[-1]["val_loss"] < state["best_val"]):
                state["best_val"] = rows[-1]["val_loss"]
                saver.save(os.path.join(ckpt_root, "best"), model, None, state)

            final = step == cfg.train.steps and cfg.checkpoint.final
            if do_save or final == "full":
                if scaler is not None:  # read only here: get_scale() waits for the device
                    state["scaler"] = scaler.state_dict()
                saver.save(os.path.join(ckpt_root, ckpt.step_name(step)), model, optim, state, prune_old=True)
                last_save = time.monotonic()
            elif final == "model":
                saver.save(os.path.join(ckpt_root, "final"), model, None, state)
            pending.restart_clock()
            if stop_flag:
                saver.wait()
                metrics.note(f"stopped by SIGTERM after step {step}, checkpoint saved: rerun the same command to resume")
                failed = False
                return 143
        saver.wait()
        failed = False
    except torch.OutOfMemoryError:
        raise UserError(oom_message(cfg, step + 1)) from None
    except (RuntimeError, OSError) as e:
        if lost_peer(e):
            raise
        # A shard truncated between a worker's size check and its copy kills the worker (SIGBUS);
        # the loop then sees a broken queue or DataLoader's RuntimeError: name the shard if so.
        dataset.check_files()
        raise
    finally:
        if failed:
            saver.drain()
        if cfg.parallel.gc_every:
            gc.enable()
        stop.restore(failed)
        metrics.close()
        del batches, loader  # stops the DataLoader workers

    for line in run_summary(list(logged), d.device, d.world) if step > start_step else []:
        metrics.note(f"summary: {line}")
    hf_dir = os.path.join(run_dir, "hf")
    if step == start_step and os.path.exists(hf_dir):
        metrics.note(f"{run_dir} is already trained to step {step}: raise train.steps to continue")
    elif cfg.export.enabled:
        from tokenmill.trainer.export import export_hf

        if export_hf(run_dir, model, args, tok, tokenizer_json, cfg.export.dtype, d.main, step):
            metrics.note(f"exported {hf_dir} (transformers: AutoModelForCausalLM.from_pretrained)")
    return 0

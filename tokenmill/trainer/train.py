"""The training loop, in torchtitan's shape. ``Trainer`` sets a run up (refusals first, then
data, model and optimizer, then the resume from the newest checkpoint);
``forward_backward_step`` is one micro-batch, ``train_step`` one optimizer step (micro-steps,
clip, the ranks' agreement, the optimizer), and ``train`` the loop, which reads top to bottom:
a step, then whether to log (and evaluate) and whether to checkpoint, each decided in its own
method, then the summary and the export.

Every decision that ends or changes the run (skip a non-finite step, save on the wall clock,
stop on SIGTERM, give up) is taken on values all-reduced across ranks, so all ranks always
take it together.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import time
from collections import deque

import torch
import torch.distributed as dist

from tokenmill.data import PackedDataset
from tokenmill.data import loader as data_loader
from tokenmill.errors import UserError, first_line
from tokenmill.format import local_tokenizer
from tokenmill.trainer import checkpoint as ckpt
from tokenmill.trainer import windows as D
from tokenmill.trainer.evaluation import evaluate, token_byte_lengths
from tokenmill.trainer.forward import (  # noqa: F401  (autocast, resolve_precision: imported from here too)
    autocast,
    forward,
    loss_sum,
    resolve_precision,
    to_device,
    token_loss_sum,
)
from tokenmill.trainer.metrics import (
    Metrics,
    PendingSteps,
    memory_row,
    peak_flops,
    run_summary,
    truncate_after,
)
from tokenmill.trainer.model import ModelArgs, Transformer, count_params, flops_per_token
from tokenmill.trainer.optimizer import (  # noqa: F401  (param_groups: imported from here too)
    agree_found_inf,
    build_optimizer,
    lr_at,
    param_groups,
    step_unless,
)
from tokenmill.trainer.order import Order
from tokenmill.trainer.parallel import (
    Dist,
    SharedError,
    agree_on_host,
    close_distributed,
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
    release_run_dir,
)
from tokenmill.trainer.spikes import FILE as SPIKES
from tokenmill.trainer.spikes import SpikeLog
from tokenmill.trainer.stop import StopFlag, on_main_thread, rank_prefix  # noqa: F401  (the CLI's)
from tokenmill.trainer.train_config import TrainJobConfig

# ---------------------------------------------------------------- pure pieces


def model_args(cfg: TrainJobConfig, vocab_size: int) -> ModelArgs:
    dims = cfg.model.dims()
    return ModelArgs(vocab_size=vocab_size, max_seq_len=cfg.data.seq_len, rope_theta=cfg.model.rope_theta,
                     norm_eps=cfg.model.norm_eps, **dims)


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


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
        # called without an active exception"; bench/MEASUREMENTS.md: ranks leave together).
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
        release_run_dir()
        close_distributed()



def train(cfg: TrainJobConfig, run_dir: str, d: Dist) -> int:
    return Trainer(cfg, run_dir, d).train()


class Trainer:
    """One run on this rank. Set up in ``__init__``; ``train`` runs it."""

    # ------------------------------------------------------------ set up

    def __init__(self, cfg: TrainJobConfig, run_dir: str, d: Dist):
        self.cfg, self.run_dir, self.d = cfg, run_dir, d
        self.ckpt_root = os.path.join(run_dir, "checkpoints")
        manifests, found, tokenizer_warning = self._refusals()
        self._build_data(manifests)
        self._build_model(manifests)
        self._resume(found, tokenizer_warning)
        self._build_loop()

    def _refusals(self) -> tuple[list, tuple | None, str | None]:
        """Everything a user can get wrong, before any training work; returns the outputs'
        manifests, the newest complete checkpoint (or None) and a tokenizer warning."""
        cfg, d = self.cfg, self.d
        prepare_run_dir(self.run_dir, d)
        manifests = open_data(cfg, d)
        self.tok = D.check_compatible(manifests, cfg.data.paths)
        self.precision = resolve_precision(cfg.precision, d.device)
        self.args = model_args(cfg, self.tok["vocab_size"])
        check_cpu_memory(self.args, cfg, self.precision, d)
        if d.main:
            ckpt.sweep(self.ckpt_root)
        dist.barrier()
        found = [ckpt.latest(self.ckpt_root)]
        dist.broadcast_object_list(found, src=0)
        tokenizer_warning = check_same_tokenizer(found[0], self.tok, cfg, self.run_dir)
        check_same_model(self.run_dir, self.args, d)
        return manifests, found[0], tokenizer_warning

    def _build_data(self, manifests: list) -> None:
        """One token stream per output and split: the packed training windows and this rank's
        validation batches."""
        cfg, d, tok = self.cfg, self.d, self.tok
        streams = [D.split_stream(p, m, "train") for p, m in zip(cfg.data.paths, manifests)]
        order = Order(cfg.data.shuffle_shards, cfg.data.lanes, cfg.train.micro_batch)
        val_streams = [D.split_stream(p, m, "val") for p, m in zip(cfg.data.paths, manifests)]
        self.val, error = [], None
        try:
            D.check_cache_fits(streams, order, cfg.seed, d.world, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
            self.dataset = D.PackedWindows(streams, cfg.data.seq_len, cfg.seed, cfg.data.weights or None,
                                           cfg.data.doc_mask, tok["vocab_size"], order)
            self.val = D.val_batches(val_streams, cfg.data.seq_len, cfg.eval.samples, cfg.train.micro_batch, d.rank,
                                     d.world, cfg.data.doc_mask, tok["vocab_size"])
        except UserError as e:  # each rank reads its own windows: any rank's error stops all
            error = str(e)
        raise_if_any(error, d)

    def _build_model(self, manifests: list) -> None:
        """Model, optimizer, precision (a GradScaler for fp16), the loss, the tokenizer."""
        cfg, d = self.cfg, self.d
        torch.manual_seed(cfg.seed)
        self.model = parallelize(lambda: Transformer(self.args), cfg, d, self.precision)
        self.optim = build_optimizer(self.model, cfg.optim, cfg.lr())
        self.scaler = torch.amp.GradScaler(d.device.type) if self.precision == "fp16" else None
        self.loss_fn = torch.compile(token_loss_sum) if cfg.parallel.compile else token_loss_sum
        self.tokenizer_json = local_tokenizer(cfg.data.paths[0], manifests[0])
        if d.main:  # the run keeps the tokenizer it trains with: `tokenmill generate` reads it
            shutil.copyfile(self.tokenizer_json, os.path.join(self.run_dir, "tokenizer.json"))
        self.byte_lengths = torch.from_numpy(token_byte_lengths(self.tokenizer_json)).to(d.device) if self.val else None

    def _resume(self, found: tuple | None, tokenizer_warning: str | None) -> None:
        """The newest complete checkpoint, if any: its integers say where the data stands."""
        cfg, d, tok = self.cfg, self.d, self.tok
        state = {"step": 0, "samples": 0, "seed": cfg.seed, "skipped_steps": 0, "bad_in_row": 0, "best_val": None,
                 "tokenizer_sha256": tok["sha256"], "eos_id": tok["eos_id"]}
        if found:  # the sha again after: a checkpoint older than the field gets it from now on
            state.update(ckpt.load(found[1], self.model, self.optim), tokenizer_sha256=tok["sha256"],
                         eos_id=tok["eos_id"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])  # scale and growth tracker: as if never stopped
            elif self.scaler is not None and state.get("scale"):  # from before the scaler's state was saved
                self.scaler = torch.amp.GradScaler(d.device.type, init_scale=state["scale"])
        if d.main:  # lines a killed run logged past its last checkpoint are dropped
            for name in ("metrics.jsonl", SPIKES):
                truncate_after(os.path.join(self.run_dir, name), state["step"])
        self.state = state
        self.metrics = Metrics(self.run_dir, d.main, cfg.metrics.tensorboard, cfg.train.steps, cfg.train.log_every)
        if found:
            self.metrics.note(f"resumed from {found[1]} (step {state['step']}, {state['samples']:,} samples)")
        if tokenizer_warning:
            self.metrics.note(f"warning: {tokenizer_warning}")

    def _build_loop(self) -> None:
        """The loop's constants, its data loader, checkpoint saver and logs."""
        cfg, d, args = self.cfg, self.d, self.args
        self.global_batch = G = cfg.train.micro_batch * cfg.train.grad_accum * d.world
        self.global_tokens = G * cfg.data.seq_len  # every window has seq_len targets, none masked
        self.fpt = flops_per_token(args, cfg.data.seq_len)
        self.peak = peak_flops(d.device, self.precision, cfg.metrics.peak_flops)
        self.warmup = cfg.warmup()
        n_all, n_body = count_params(args)
        if self.step < cfg.train.steps:
            self.metrics.note(
                f"{n_all / 1e6:.1f}M parameters ({n_body / 1e6:.1f}M without embeddings), {d.world} rank(s) on "
                f"{d.device.type} ({'FSDP2' if wants_fsdp(d, cfg.parallel.shard_single_rank) else 'unsharded'}), "
                f"{self.precision}, global batch {G} x {cfg.data.seq_len} tokens, peak lr {cfg.lr():g}, "
                f"steps {self.step} -> {cfg.train.steps}")
        # Micro-batch j of this rank (step j // grad_accum) is a pure function of (seed, samples
        # consumed at the start, j): the checkpoint's integer is the whole data state.
        stream = PackedDataset(cfg.data.paths, cfg.data.seq_len, cfg.seed, d.rank, d.world, cfg.train.micro_batch,
                               first_sample=self.state["samples"], windows=self.dataset)
        self.loader = data_loader(stream, cfg.data.num_workers, cfg.data.prefetch_factor,
                                  pin_memory=d.device.type == "cuda")
        self.batches = iter(self.loader)
        self.saver = ckpt.Saver(cfg.checkpoint.async_save, d.main, cfg.checkpoint.keep)
        self.pending = PendingSteps(self.global_tokens)
        self.spikes = SpikeLog(self.run_dir, d.main, cfg.train.spike_factor, cfg.train.spike_window,
                               self.dataset.docs_of, cfg.data.seq_len, G)
        self.logged: deque[dict] = deque(maxlen=2000)  # the summary's window: memory does not grow with the run
        self.start_step = self.step

    @property
    def step(self) -> int:
        """Optimizer steps taken, this run and the runs it resumes."""
        return self.state["step"]

    # ------------------------------------------------------------ the loop

    def train(self) -> int:
        cfg = self.cfg
        with self._running():
            while self.step < cfg.train.steps:
                time_flag, stop_flag = self.train_step()
                do_eval = self.eval_due()
                do_save = self.save_due(time_flag, stop_flag)
                if not (self.log_due() or do_eval or do_save):
                    continue
                rows = self.log_steps(do_eval)
                if do_eval:
                    self.keep_best(rows[-1])
                self.checkpoint(do_save)
                self.pending.restart_clock()
                if stop_flag:
                    return self.stopped()
            self.saver.wait()
        return self.finish()

    @contextlib.contextmanager
    def _running(self):
        """Around the loop: the SIGTERM flag, the train timeout, gc at fixed steps; an error
        becomes one line where it can (out of memory, a truncated shard), and the loader's
        workers stop, whatever happens."""
        cfg = self.cfg
        self.stop = StopFlag()
        self.last_save = time.monotonic()
        failed = True
        set_train_timeout(cfg.parallel.train_timeout_s)
        if cfg.parallel.gc_every:  # collections at the same steps on every rank, not whenever one rank's heap says so
            gc.collect()
            gc.disable()
        try:
            yield
            failed = False
        except torch.OutOfMemoryError:
            raise UserError(oom_message(cfg, self.step + 1)) from None
        except (RuntimeError, OSError) as e:
            if lost_peer(e):
                raise
            # A shard truncated between a worker's size check and its copy kills the worker
            # (SIGBUS); the loop then sees a broken queue or DataLoader's RuntimeError: name the
            # shard if so.
            self.dataset.check_files()
            raise
        finally:
            if failed:
                self.saver.drain()
            if cfg.parallel.gc_every:
                gc.enable()
            self.stop.restore(failed)
            self.metrics.close()
            del self.batches, self.loader  # stops the DataLoader workers

    # ------------------------------------------------------------ one step

    def forward_backward_step(self, batch: dict, last_micro: bool) -> torch.Tensor:
        """One micro-batch: its backward adds d(sum of its token losses)/global_tokens; FSDP
        averages over ranks, hence the factor world: over the micro-steps the result is the
        gradient of the mean loss over every target token of the global batch. Returns the
        (detached) sum of its token losses."""
        cfg, d = self.cfg, self.d
        batch = to_device(batch, d.device)
        if cfg.train.skip_sync and cfg.train.grad_accum > 1 and hasattr(self.model, "set_requires_gradient_sync"):
            self.model.set_requires_gradient_sync(last_micro)
        ls = loss_sum(self.model, batch, self.precision, d.device, self.loss_fn)
        scaled = ls * (d.world / self.global_tokens)
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        return ls.detach()

    def train_step(self) -> tuple[bool, bool]:
        """One optimizer step: the schedule's lr, the micro-steps, clip, the ranks' agreement,
        the optimizer (skipped on the device when the loss or norm is not finite). Nothing here
        waits for the device: the loss and the grad norm stay tensors until a log step reads
        them (PendingSteps). Returns the agreed (time to save, stop) flags."""
        cfg, d = self.cfg, self.d
        lr = lr_at(self.step, cfg.lr(), cfg.train.steps, self.warmup, cfg.optim.warmup_start_frac,
                   cfg.optim.final_frac)
        for group in self.optim.param_groups:
            group["lr"] = lr
        wait, total = 0.0, torch.zeros((), dtype=torch.float64, device=d.device)
        data_error = None
        for micro in range(cfg.train.grad_accum):
            batch, waited, error = self.next_batch()
            wait += waited
            if error is not None:
                data_error = data_error or error
            total += self.forward_backward_step(batch, micro == cfg.train.grad_accum - 1)
        if self.scaler is not None:
            self.scaler.unscale_(self.optim)
        # On the compute device: with CPU offload the gradients (and so the norm) are on the CPU.
        grad_norm = _full(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.train.grad_clip)).to(d.device)
        if d.world > 1:
            dist.all_reduce(total)
        finite = torch.isfinite(total) & torch.isfinite(grad_norm)
        time_flag, stop_flag = self._agree(data_error)
        self._optimizer_step(finite)
        self.state["step"], self.state["samples"] = self.step + 1, self.state["samples"] + self.global_batch
        self.pending.add({"step": self.step, "lr": lr, "wait": wait, "tokens": self.state["samples"] * cfg.data.seq_len},
                         total, grad_norm)
        if cfg.parallel.gc_every and self.step % cfg.parallel.gc_every == 0:
            gc.collect(1)
        return time_flag, stop_flag

    def next_batch(self) -> tuple[dict, float, str | None]:
        """The next micro-batch, the seconds spent waiting for it, and this rank's data error
        if its reading failed: a filler then keeps this rank in the others' collectives until
        the flags agree."""
        tw = time.perf_counter()
        batch = next(self.batches)
        waited = time.perf_counter() - tw
        if "error" in batch:
            return self.dataset.filler(self.cfg.train.micro_batch), waited, batch["error"]
        return batch, waited, None

    def _agree(self, data_error: str | None) -> tuple[bool, bool]:
        """What the ranks must agree on, from the host alone: rank 0's clock, whether any rank
        was asked to stop, whether any rank's data failed (then all stop, with its line), and
        whether every rank has finished writing a background checkpoint (then it is committed)."""
        cfg, d = self.cfg, self.d
        want_time_save = d.main and cfg.checkpoint.every_minutes > 0 and \
            time.monotonic() - self.last_save >= 60 * cfg.checkpoint.every_minutes
        time_flag, stop_flag, data_flag, written = agree_on_host(
            [want_time_save, self.stop.set, data_error is not None, self.saver.done_here()], d.world)
        if data_flag:
            raise_if_any(data_error, d)
        if self.saver.pending() and written == d.world:
            self.saver.commit()
        return time_flag, stop_flag

    def _optimizer_step(self, finite: torch.Tensor) -> None:
        if self.scaler is not None:
            agree_found_inf(self.scaler, self.optim, finite)
            self.scaler.step(self.optim)  # skips the update itself when the grads overflowed
            self.scaler.update()
        else:
            step_unless(self.optim, ~finite)
        self.optim.zero_grad(set_to_none=True)

    # ------------------------------------------------------------ after a step: decisions

    def eval_due(self) -> bool:
        every = self.cfg.eval.every
        return bool(self.val) and ((every and self.step % every == 0) or self.step == self.cfg.train.steps)

    def save_due(self, time_flag: bool, stop_flag: bool):
        every = self.cfg.checkpoint.every
        return (every and self.step % every == 0) or time_flag or stop_flag

    def log_due(self) -> bool:
        return not (self.step % self.cfg.train.log_every and self.step != self.cfg.train.steps)

    # ------------------------------------------------------------ logging and eval

    def log_steps(self, do_eval: bool) -> list[dict]:
        """The steps since the last log step, read back from the device in one transfer
        (PendingSteps), the last with its validation figures when ``do_eval``; each logged."""
        d = self.d
        rows = self.pending.flush()
        memory = memory_row(d.device)
        if do_eval:
            rows[-1].update(evaluate(self.model, self.val, lambda m, b: forward(m, b, self.precision, d.device),
                                     d.device, self.byte_lengths))
        for row in rows:
            row.update(memory, mfu=row["tokens_per_s"] * self.fpt / (self.peak * d.world) if self.peak else None)
            self._log_row(row)
        return rows

    def _log_row(self, row: dict) -> None:
        """One step's row: counted (skipped steps, bad ones in a row), logged, checked for a loss
        spike; too many non-finite steps in a row end the run."""
        state, cfg = self.state, self.cfg
        state["bad_in_row"] = state["bad_in_row"] + 1 if row["skipped"] else 0
        state["skipped_steps"] += row["skipped"]
        self.metrics.log(row)
        self.logged.append(row)
        spike = self.spikes.check(row)
        if spike:
            self.metrics.note(f"loss spike at step {spike['step']}: {spike['loss']:.4f} vs median "
                              f"{spike['median']:.4f}, {len(spike['docs'])} document(s) in {SPIKES}")
        if state["bad_in_row"] >= cfg.train.max_bad_steps:
            hint = ", or use precision=bf16" if self.precision == "fp16" else ""
            raise SharedError(f"{state['bad_in_row']} steps in a row had a non-finite loss or gradient norm "
                              f"(last at step {row['step']}): lower optim.lr or raise optim.warmup_steps{hint}")

    # ------------------------------------------------------------ checkpoints

    def keep_best(self, row: dict) -> None:
        """checkpoint.best: the model with the lowest validation loss so far, in best/."""
        if self.cfg.checkpoint.best and (self.state["best_val"] is None or row["val_loss"] < self.state["best_val"]):
            self.state["best_val"] = row["val_loss"]
            self.saver.save(os.path.join(self.ckpt_root, "best"), self.model, None, self.state)

    def checkpoint(self, do_save) -> None:
        """A full checkpoint when due (or at the end with checkpoint.final=full), else the model
        alone in final/ at the end with checkpoint.final=model."""
        step = self.step
        final = step == self.cfg.train.steps and self.cfg.checkpoint.final
        if do_save or final == "full":
            if self.scaler is not None:  # read only here: get_scale() waits for the device
                self.state["scaler"] = self.scaler.state_dict()
            self.saver.save(os.path.join(self.ckpt_root, ckpt.step_name(step)), self.model, self.optim, self.state,
                            prune_old=True)
            self.last_save = time.monotonic()
        elif final == "model":
            self.saver.save(os.path.join(self.ckpt_root, "final"), self.model, None, self.state)

    # ------------------------------------------------------------ the end

    def stopped(self) -> int:
        """SIGTERM: the checkpoint of this step is written; the exit status says so."""
        self.saver.wait()
        self.metrics.note(f"stopped by SIGTERM after step {self.step}, checkpoint saved: "
                          "rerun the same command to resume")
        return 143

    def finish(self) -> int:
        """The end-of-run summary, then the export (unless there was nothing to train)."""
        d, step = self.d, self.step
        for line in run_summary(list(self.logged), d.device, d.world) if step > self.start_step else []:
            self.metrics.note(f"summary: {line}")
        hf_dir = os.path.join(self.run_dir, "hf")
        if step == self.start_step and os.path.exists(hf_dir):
            self.metrics.note(f"{self.run_dir} is already trained to step {step}: raise train.steps to continue")
        elif self.cfg.export.enabled:
            from tokenmill.trainer.hf_export import export_hf

            if export_hf(self.run_dir, self.model, self.args, self.tok, self.tokenizer_json, self.cfg.export.dtype,
                         d.main, step):
                self.metrics.note(f"exported {hf_dir} (transformers: AutoModelForCausalLM.from_pretrained)")
        return 0

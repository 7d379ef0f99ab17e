"""The trainer's one validated configuration: YAML file, then ``--set key=value`` overrides.

Same style as the pipeline config (tokenmill/config.py): pydantic models with
``extra="forbid"``, so an unknown key or a bad value is one readable line (a UserError),
raised before any process group, model or loader exists.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, ConfigDict, Field, model_validator

from tokenmill.config import STRICT, Strict, load_validated
from tokenmill.errors import UserError


# tokenmill.config's rules (no inf or nan: an infinite lr or rope_theta trained garbage or
# crashed the progress line; nothing past 64 bits).
class _Section(Strict):
    pass


# Llama-style shapes. 1b follows Llama-3.2-1B (16 x 2048, 32 heads, 8 KV heads, FFN 8192).
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"n_layers": 2, "d_model": 128, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 384},
    "125m": {"n_layers": 12, "d_model": 768, "n_heads": 12, "n_kv_heads": 12, "ffn_hidden": 2048},
    "350m": {"n_layers": 24, "d_model": 1024, "n_heads": 16, "n_kv_heads": 16, "ffn_hidden": 2816},
    "1b": {"n_layers": 16, "d_model": 2048, "n_heads": 32, "n_kv_heads": 8, "ffn_hidden": 8192},
}

# Peak learning rate per preset when optim.lr is not set: GPT-3's table (Brown et al. 2020,
# table 2.1: 125M 6e-4, 350M 3e-4, 1.3B 2e-4). tiny (~4M with a 32k vocab) is below the table;
# 3e-3 was measured on the bundled sample (bench/train_cpu.py): loss 8.4 -> see the README.
PRESET_LR: dict[str, float] = {"tiny": 3e-3, "125m": 6e-4, "350m": 3e-4, "1b": 2e-4}
DEFAULT_LR = 3e-4  # a shape given dimension by dimension


class ModelConfig(_Section):
    # A preset gives every dimension; any dimension set explicitly overrides the preset's.
    preset: Literal["tiny", "125m", "350m", "1b"] | None = "tiny"
    n_layers: int | None = Field(default=None, ge=1, le=1024)
    d_model: int | None = Field(default=None, ge=8)
    n_heads: int | None = Field(default=None, ge=1)
    n_kv_heads: int | None = Field(default=None, ge=1)  # < n_heads: grouped-query attention
    ffn_hidden: int | None = Field(default=None, ge=1)  # SwiGLU hidden size; None: 8/3 d rounded up to 256
    rope_theta: float = Field(default=10_000.0, gt=0)
    norm_eps: float = Field(default=1e-5, gt=0)

    def dims(self) -> dict[str, int]:
        """The resolved shape: preset values overridden by explicit ones; one clear error when incomplete."""
        base = dict(PRESETS[self.preset]) if self.preset else {}
        for k in ("n_layers", "d_model", "n_heads", "n_kv_heads", "ffn_hidden"):
            v = getattr(self, k)
            if v is not None:
                base[k] = v
        missing = [k for k in ("n_layers", "d_model", "n_heads") if k not in base]
        if missing:
            raise UserError(f"bad config: model.{missing[0]} is required when model.preset is not set")
        if self.n_heads is not None and self.n_kv_heads is None:
            base["n_kv_heads"] = base["n_heads"]  # explicit heads without KV heads: plain multi-head
        base.setdefault("n_kv_heads", base["n_heads"])
        if "ffn_hidden" not in base or (self.d_model is not None and self.ffn_hidden is None):
            base["ffn_hidden"] = 256 * -(-int(8 * base["d_model"] / 3) // 256)
        d, h, kv = base["d_model"], base["n_heads"], base["n_kv_heads"]
        if d % h or (d // h) % 2:
            raise UserError(f"bad config: model.d_model ({d}) must be divisible by model.n_heads ({h}) into an even head size")
        if h % kv:
            raise UserError(f"bad config: model.n_heads ({h}) must be a multiple of model.n_kv_heads ({kv})")
        return base


class DataConfig(_Section):
    # Prepared outputs (`tokenmill prepare --output ...`); `--data` on the command line replaces this.
    paths: list[str] = []
    # Mixture weights, one per path (normalised); empty: equal weights.
    weights: list[float] = []
    seq_len: int = Field(default=1024, ge=2, le=1 << 20)
    # Per-document attention (block-diagonal causal mask) and RoPE positions reset at each
    # document start. Off: documents attend across EOS, as in GPT-2/Llama pretraining.
    doc_mask: bool = False
    num_workers: int = Field(default=2, ge=0, le=64)
    prefetch_factor: int = Field(default=4, ge=1, le=64)  # micro-batches each worker holds ready
    # sha256 of every shard against the manifest before training (false: sizes only).
    verify_checksums: bool = True

    @model_validator(mode="after")
    def _weights(self):
        if any(w < 0 for w in self.weights) or (self.weights and sum(self.weights) <= 0):
            raise ValueError("data.weights must be non-negative with a positive sum")
        return self


class TrainConfig(_Section):
    steps: int = Field(default=1000, ge=1)
    micro_batch: int = Field(default=8, ge=1)  # sequences per rank per micro-step
    grad_accum: int = Field(default=1, ge=1)
    # Skip the gradient reduce-scatter on non-final micro-steps: less communication, but
    # every rank then holds unsharded fp32 gradients until the last micro-step.
    skip_sync: bool = False
    grad_clip: float = Field(default=1.0, gt=0)
    # Non-finite loss or grad norm: the step is skipped; this many in a row stops the run.
    max_bad_steps: int = Field(default=20, ge=1)
    log_every: int = Field(default=10, ge=1)  # console progress line (metrics.jsonl gets every step)
    # A step whose loss exceeds spike_factor x the median of the previous spike_window steps is
    # logged to RUN/spikes.jsonl with its documents (`tokenmill spikes`); 0: off.
    spike_factor: float = Field(default=1.5, ge=0)
    spike_window: int = Field(default=50, ge=2)


class OptimConfig(_Section):
    lr: float | None = Field(default=None, gt=0)  # None: the preset's (PRESET_LR)
    # None: warmup_frac of train.steps.
    warmup_steps: int | None = Field(default=None, ge=0)
    warmup_frac: float = Field(default=0.05, ge=0, le=1)
    # Warmup rises linearly from lr*warmup_start_frac to lr; cosine then decays to lr*final_frac.
    warmup_start_frac: float = Field(default=0.1, ge=0, le=1)
    final_frac: float = Field(default=0.01, ge=0, le=1)
    weight_decay: float = Field(default=0.1, ge=0)  # never on norms and biases
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)


class ParallelConfig(_Section):
    # Activation checkpointing on every N-th block (1: every block, 2: every other, 0: off).
    activation_checkpointing: int = Field(default=0, ge=0)
    cpu_offload: bool = False  # FSDP CPUOffloadPolicy: sharded params, grads and optimizer on CPU
    compile: bool = False  # torch.compile each block
    reshard_after_forward: bool = True  # False: more memory, no all-gather in backward
    # A single CPU process runs unsharded (nothing to shard over); true: through FSDP anyway.
    shard_single_rank: bool = False
    # Process-group timeouts. Start-up covers each rank's share of the shard checksums; a
    # training collective that waits longer than train_timeout_s (a rank died or hangs) ends
    # the run with one line instead of hanging.
    init_timeout_s: float = Field(default=1800.0, gt=0)
    train_timeout_s: float = Field(default=600.0, gt=0)
    # Python's garbage collector runs every N steps on every rank at once (0: Python decides):
    # a collection at a random moment on one rank stalls all the others at the next collective.
    gc_every: int = Field(default=50, ge=0)


class CheckpointConfig(_Section):
    model_config = ConfigDict(**STRICT, populate_by_name=True)

    every: int = Field(default=1000, ge=0)  # steps; 0: off
    every_minutes: float = Field(default=60.0, ge=0)  # wall clock; 0: off
    keep: int = Field(default=3, ge=1)  # newest step-N checkpoints kept (best/ is extra)
    best: bool = True  # keep best/ on validation loss
    # dcp.async_save: the state is staged to host memory (the step waits for that copy only)
    # and written in a background thread while training goes on. Costs one host copy of the
    # rank's shard of the weights and optimizer state.
    async_save: bool = Field(default=False, validation_alias=AliasChoices("async", "async_save"))
    # The save at the last step: full (weights + optimizer: a rerun with more train.steps goes
    # on from it), model (weights only, in final/: for 1b with AdamW a third of the size), none.
    final: Literal["full", "model", "none"] = "full"


class EvalConfig(_Section):
    every: int = Field(default=500, ge=0)  # steps; 0: only at the end
    samples: int = Field(default=256, ge=1)  # validation windows (the first ones of the val split)


class MetricsConfig(_Section):
    tensorboard: bool = True  # RUN/tb/ when tensorboard is installed
    # Peak FLOP/s of one device for MFU; None: looked up from the GPU name (no MFU on CPU).
    peak_flops: float | None = Field(default=None, gt=0)


class ExportConfig(_Section):
    enabled: bool = True  # RUN/hf/ at the end of training
    dtype: Literal["float32", "bfloat16"] = "float32"


class TrainJobConfig(Strict):

    seed: int = Field(default=0, ge=0, lt=2**63)
    # auto: bf16 on a GPU that has it, else fp32.
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    optim: OptimConfig = OptimConfig()
    parallel: ParallelConfig = ParallelConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval: EvalConfig = EvalConfig()
    metrics: MetricsConfig = MetricsConfig()
    export: ExportConfig = ExportConfig()

    def lr(self) -> float:
        if self.optim.lr is not None:
            return self.optim.lr
        return PRESET_LR[self.model.preset] if self.model.preset else DEFAULT_LR

    def warmup(self) -> int:
        w = self.optim.warmup_steps if self.optim.warmup_steps is not None else round(self.optim.warmup_frac * self.train.steps)
        return min(w, self.train.steps)


def load_train_config(path: str | None = None, overrides: list[str] | None = None,
                      data: list[str] | None = None) -> TrainJobConfig:
    cfg = load_validated(TrainJobConfig, path, overrides)
    if data:
        cfg.data.paths = list(data)
    if not cfg.data.paths:
        raise UserError("no training data: pass --data OUT (a `tokenmill prepare` output), repeatable")
    if cfg.data.weights and len(cfg.data.weights) != len(cfg.data.paths):
        raise UserError(f"bad config: data.weights has {len(cfg.data.weights)} values for {len(cfg.data.paths)} --data paths")
    cfg.model.dims()  # incomplete or inconsistent shapes fail here, before any process group exists
    return cfg

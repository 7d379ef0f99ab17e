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
# table 2.1: 125M 6e-4, 350M 3e-4, 1.3B 2e-4). tiny (~4M with a 32k vocab) is below the table:
# its 3e-3 was chosen on the bundled sample (bench/MEASUREMENTS.md: tiny preset's learning rate).
PRESET_LR: dict[str, float] = {"tiny": 3e-3, "125m": 6e-4, "350m": 3e-4, "1b": 2e-4}
DEFAULT_LR = 3e-4  # a shape given dimension by dimension


class ModelConfig(_Section):
    preset: Literal["tiny", "125m", "350m", "1b"] | None = Field(default="tiny", description=(
        "A preset gives every dimension; any dimension set explicitly overrides the preset's."))
    n_layers: int | None = Field(default=None, ge=1, le=1024, description="Transformer blocks; null: the preset's.")
    d_model: int | None = Field(default=None, ge=8, description="Model width; null: the preset's.")
    n_heads: int | None = Field(default=None, ge=1, description="Attention heads; null: the preset's.")
    n_kv_heads: int | None = Field(default=None, ge=1, description=(
        "Key/value heads (< n_heads: grouped-query attention); null: the preset's, else n_heads."))
    ffn_hidden: int | None = Field(default=None, ge=1, description=(
        "SwiGLU hidden size; null: the preset's, else 8/3 d_model rounded up to 256."))
    rope_theta: float = Field(default=10_000.0, gt=0, description="RoPE base.")
    norm_eps: float = Field(default=1e-5, gt=0, description="RMSNorm epsilon.")

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
    paths: list[str] = Field(default=[], description=(
        "Prepared outputs (`tokenmill prepare --output ...`); `--data` on the command line replaces this."))
    weights: list[float] = Field(default=[], description=(
        "Mixture weights, one per path (normalised); empty: equal weights."))
    seq_len: int = Field(default=1024, ge=2, le=1 << 20, description="Tokens per training sequence.")
    doc_mask: bool = Field(default=False, description=(
        "Per-document attention (block-diagonal causal mask) and RoPE positions reset at each document start. "
        "false: documents attend across EOS, as in GPT-2/Llama pretraining."))
    num_workers: int = Field(default=2, ge=0, le=64, description="DataLoader worker processes per rank.")
    prefetch_factor: int = Field(default=4, ge=1, le=64, description="Micro-batches each worker holds ready.")
    verify_checksums: bool = Field(default=True, description=(
        "sha256 of every shard against the manifest before training (false: sizes only). Shards on an object "
        "store are checked as they are fetched, whatever this says."))
    shuffle_shards: int = Field(default=0, ge=0, le=1 << 20, description=(
        "0: each epoch is one shuffle of every window of the split. N: windows are cut per shard and "
        "shuffled within groups of N shards, the groups in a shuffled order (trainer/order.py): a rank then "
        "needs only its current and next group's shards at hand, which is what training from an object store "
        "through a bounded cache (TOKENMILL_CACHE_GB) needs."))
    lanes: int = Field(default=1, ge=1, le=1 << 16, description=(
        "Deal the shards to this many lanes; micro-batch m reads lane m % lanes. With lanes a multiple of the "
        "number of ranks, every rank reads (and on a store fetches) only its own shards. The order depends on "
        "lanes, not on the number of ranks."))

    @model_validator(mode="after")
    def _weights(self):
        if any(w < 0 for w in self.weights) or (self.weights and sum(self.weights) <= 0):
            raise ValueError("data.weights must be non-negative with a positive sum")
        return self


class TrainConfig(_Section):
    steps: int = Field(default=1000, ge=1, description="Optimizer steps.")
    micro_batch: int = Field(default=8, ge=1, description="Sequences per rank per micro-step.")
    grad_accum: int = Field(default=1, ge=1, description="Micro-steps per optimizer step.")
    skip_sync: bool = Field(default=False, description=(
        "Skip the gradient reduce-scatter on non-final micro-steps: less communication, but every rank then "
        "holds unsharded fp32 gradients until the last micro-step."))
    grad_clip: float = Field(default=1.0, gt=0, description="Gradient norm clipping.")
    max_bad_steps: int = Field(default=20, ge=1, description=(
        "Non-finite loss or grad norm: the step is skipped; this many in a row stops the run."))
    log_every: int = Field(default=10, ge=1, description=(
        "Steps between console progress lines (metrics.jsonl gets every step)."))
    spike_factor: float = Field(default=1.5, ge=0, description=(
        "A step whose loss exceeds spike_factor x the median of the previous spike_window steps is logged to "
        "RUN/spikes.jsonl with its documents (`tokenmill spikes`); 0: off."))
    spike_window: int = Field(default=50, ge=2, description="See spike_factor.")


class OptimConfig(_Section):
    lr: float | None = Field(default=None, gt=0, description=(
        "Peak learning rate (AdamW); null: the preset's ("
        + ", ".join(f"{k} {v:g}" for k, v in PRESET_LR.items()) + f"; {DEFAULT_LR:g} without a preset)."))
    warmup_steps: int | None = Field(default=None, ge=0, description="null: warmup_frac of train.steps.")
    warmup_frac: float = Field(default=0.05, ge=0, le=1, description="See warmup_steps.")
    warmup_start_frac: float = Field(default=0.1, ge=0, le=1, description=(
        "Warmup rises linearly from lr x warmup_start_frac to lr; cosine then decays to lr x final_frac."))
    final_frac: float = Field(default=0.01, ge=0, le=1, description="See warmup_start_frac.")
    weight_decay: float = Field(default=0.1, ge=0, description="Never on norms and biases.")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(default=0.95, ge=0, lt=1, description="AdamW beta2.")
    eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")


class ParallelConfig(_Section):
    activation_checkpointing: int = Field(default=0, ge=0, description=(
        "Activation checkpointing on every N-th block (1: every block, 2: every other, 0: off)."))
    cpu_offload: bool = Field(default=False, description=(
        "FSDP CPUOffloadPolicy: sharded params, grads and optimizer on CPU."))
    compile: bool = Field(default=False, description="torch.compile each block.")
    reshard_after_forward: bool = Field(default=True, description="false: more memory, no all-gather in backward.")
    shard_single_rank: bool = Field(default=False, description=(
        "A single CPU process runs unsharded (nothing to shard over); true: through FSDP anyway."))
    init_timeout_s: float = Field(default=1800.0, gt=0, description=(
        "Process-group timeout at start-up (it covers each rank's share of the shard checksums)."))
    train_timeout_s: float = Field(default=600.0, gt=0, description=(
        "A training collective that waits longer (a rank died or hangs) ends the run with one line."))
    gc_every: int = Field(default=50, ge=0, description=(
        "Python's garbage collector runs every N steps on every rank at once (0: Python decides): a collection "
        "at a random moment on one rank stalls all the others at the next collective."))


class CheckpointConfig(_Section):
    model_config = ConfigDict(**STRICT, populate_by_name=True)

    every: int = Field(default=1000, ge=0, description="A checkpoint every this many steps; 0: off.")
    every_minutes: float = Field(default=60.0, ge=0, description="... and every this many minutes; 0: off.")
    keep: int = Field(default=3, ge=1, description="Newest step-N checkpoints kept (best/ is extra).")
    best: bool = Field(default=True, description="Keep best/ on validation loss.")
    async_save: bool = Field(default=False, validation_alias=AliasChoices("async", "async_save"), description=(
        "dcp.async_save: the state is staged to host memory (the step waits for that copy only) and written in "
        "a background thread while training goes on. Costs one host copy of the rank's shard of the weights "
        "and optimizer state."))
    final: Literal["full", "model", "none"] = Field(default="full", description=(
        "The save at the last step: full (weights + optimizer: a rerun with more train.steps goes on from it), "
        "model (weights only, in final/: for 1b with AdamW a third of the size), none."))


class EvalConfig(_Section):
    every: int = Field(default=500, ge=0, description="Validation every this many steps; 0: only at the end.")
    samples: int = Field(default=256, ge=1, description="Validation windows (the first ones of the val split).")


class MetricsConfig(_Section):
    tensorboard: bool = Field(default=True, description="RUN/tb/ when tensorboard is installed.")
    peak_flops: float | None = Field(default=None, gt=0, description=(
        "Peak FLOP/s of one device for MFU; null: looked up from the GPU name (no MFU on CPU)."))


class ExportConfig(_Section):
    enabled: bool = Field(default=True, description="A Hugging Face model in RUN/hf/ at the end of training.")
    dtype: Literal["float32", "bfloat16"] = Field(default="float32", description="Its weights' dtype.")


class TrainJobConfig(Strict):
    seed: int = Field(default=0, ge=0, lt=2**63, description="Seed of the initial weights and of the data order.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(default="auto", description=(
        "auto: bf16 on a GPU that has it, else fp32."))
    model: ModelConfig = Field(default=ModelConfig(), description="The Llama-style model.")
    data: DataConfig = Field(default=DataConfig(), description="What it reads (`tokenmill prepare` outputs).")
    train: TrainConfig = Field(default=TrainConfig(), description="The training loop.")
    optim: OptimConfig = Field(default=OptimConfig(), description="AdamW and the learning-rate schedule.")
    parallel: ParallelConfig = Field(default=ParallelConfig(), description="FSDP2 and process groups.")
    checkpoint: CheckpointConfig = Field(default=CheckpointConfig(), description="Checkpoints in RUN/.")
    eval: EvalConfig = Field(default=EvalConfig(), description="Validation loss.")
    metrics: MetricsConfig = Field(default=MetricsConfig(), description="RUN/metrics.jsonl and TensorBoard.")
    export: ExportConfig = Field(default=ExportConfig(), description="The Hugging Face export.")

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

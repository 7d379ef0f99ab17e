"""The forward pass under the run's precision, and its loss: what a micro-step and the
validation run on a batch."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from tokenmill.trainer.parallel import LOW, fsdp_casts


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

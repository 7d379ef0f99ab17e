"""AdamW and its schedule: the learning rate at a step, the parameter groups (no decay on
vectors), and a step skipped on the device when the loss or gradient norm is not finite, with
or without fp16's GradScaler."""

from __future__ import annotations

import math

import torch

from tokenmill.trainer.train_config import OptimConfig


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

"""Process group, device mesh, and the parallelism applied to a plain model, in a fixed order:

    build on meta -> activation checkpointing -> torch.compile -> fully_shard -> materialise

Each step is one small function; model.py knows nothing of any of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from tokenmill.errors import UserError


class SharedError(UserError):
    """An error every rank raised together (raise_if_any): rank 0's line says it for all."""


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Timed out", "timed out", "NCCL", "Gloo",
              "gloo", "ProcessGroup")


def lost_peer(e: BaseException) -> bool:
    """Whether ``e`` is a failed collective (a peer died, or a timeout) rather than this rank's
    own fault. NCCL raises DistError; gloo raises a plain RuntimeError, told apart by its text."""
    return isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and any(k in str(e) for k in _PEER_LOST))


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    mesh: object  # torch.distributed.device_mesh.DeviceMesh

    @property
    def main(self) -> bool:
        return self.rank == 0


def _env_ranks() -> tuple[int, int, int] | None:
    """(rank, world, local rank) from torchrun, else from SLURM (srun without torchrun)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            raise UserError("under srun without torchrun, set MASTER_ADDR and MASTER_PORT "
                            "(or launch with `srun torchrun ... --no-python tokenmill train ...`)")
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("WORLD_SIZE", str(world))
        return rank, world, int(os.environ.get("SLURM_LOCALID", 0))
    return None


def init_distributed(timeout_s: float = 1800.0) -> Dist:
    """One process group for every launch: torchrun/SLURM env, or a single process of its own.

    A lone process still gets a (world-size 1) group, so there is one code path: FSDP,
    checkpoints and collectives behave the same on a laptop and on 64 GPUs. ``timeout_s``
    bounds every collective until set_train_timeout() lowers it after start-up."""
    from torch.distributed.device_mesh import init_device_mesh

    ranks = _env_ranks()
    rank, world, local_rank = ranks or (0, 1, 0)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"  # gloo too: CPU offload and CPU-side collectives
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        kw = {"timeout": timedelta(seconds=timeout_s)}
        if device.type == "cuda":
            kw["device_id"] = device  # NCCL: the rank's GPU up front
        if ranks:
            dist.init_process_group(backend, **kw)
        else:  # an in-process store: no port to pick, nothing to collide with other jobs
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kw)
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    return Dist(rank=rank, world=world, local_rank=local_rank, device=device, mesh=mesh)


def set_train_timeout(timeout_s: float) -> None:
    """After start-up (checksums, resume) the collectives of a step take seconds: a shorter
    timeout turns a dead or hung rank into an error instead of a silent hang. torchtitan
    does the same through this (private, stable since 2.2) call."""
    from torch.distributed.distributed_c10d import _get_default_group, _set_pg_timeout

    _set_pg_timeout(timedelta(seconds=timeout_s), _get_default_group())


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def build_on_meta(make) -> nn.Module:
    """Construct without allocating: a 1B model costs no memory until it is sharded."""
    with torch.device("meta"):
        return make()


def apply_activation_checkpointing(model: nn.Module, every: int) -> None:
    """Recompute every ``every``-th block in backward instead of keeping its activations."""
    if not every:
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.layers):
        if i % every == 0:
            model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: nn.Module) -> None:
    """Compile block by block: the blocks are all alike, so one graph is compiled and reused.
    Each compiled block replaces the block (before fully_shard, as torchtitan does), so FSDP's
    hooks sit on the wrapper, outside the graph. The wrapper adds ``_orig_mod.`` to parameter
    names; DCP's state-dict API and canonical_name() strip it, so checkpoints and exports are
    the same with or without compile."""
    for i, block in enumerate(model.layers):
        model.layers[i] = torch.compile(block, fullgraph=True)


LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def fsdp_casts(precision: str, device: torch.device) -> bool:
    """On GPU, FSDP's policy is the mixed precision (no autocast): params are all-gathered in
    bf16/fp16, grads reduced and kept in fp32. On CPU the loop uses autocast (gloo's support
    for low-precision collectives varies, and a lone CPU rank has no FSDP at all)."""
    return precision in LOW and device.type == "cuda"


def mixed_precision(precision: str, device: torch.device):
    """cast_forward_inputs=False: the block inputs are already in the low dtype (the embedding
    is), and the RoPE tables stay fp32 instead of being cast at every block."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if fsdp_casts(precision, device):
        return MixedPrecisionPolicy(param_dtype=LOW[precision], reduce_dtype=torch.float32,
                                    cast_forward_inputs=False)
    return MixedPrecisionPolicy()


def apply_fsdp(model: nn.Module, mesh, mp_policy, cpu_offload: bool, reshard_after_forward: bool) -> None:
    """FSDP2 groups, as torchtitan: the embedding alone, each block (one all-gather /
    reduce-scatter per block, overlapped with compute), and [norm, lm_head] together. The root
    then holds no weights: with a 32k vocab the embedding and head are ~40% of 125m, and in
    the root group they would be gathered at the start, held all step and reduced last with
    nothing left to overlap. [norm, lm_head] is not resharded after forward: backward needs
    it first, straight away."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    # Pinned host memory only where there is a device to copy to (pinning needs one).
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
    kw = {"mesh": mesh, "mp_policy": mp_policy, "offload_policy": offload}
    fully_shard(model.embed_tokens, reshard_after_forward=reshard_after_forward, **kw)
    for block in model.layers:
        fully_shard(block, reshard_after_forward=reshard_after_forward, **kw)
    fully_shard([model.norm, model.lm_head], reshard_after_forward=False, **kw)
    fully_shard(model, **kw)


def canonical_name(name: str) -> str:
    """A parameter's name as the plain model has it (without wrapper prefixes)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


@torch.no_grad()
def materialise(model: nn.Module, device: torch.device, seed: int, cpu_offload: bool) -> None:
    """Allocate the (sharded) parameters for real and fill them deterministically.

    Each parameter's full value comes from model.init_tensor (seeded by its name), and each
    rank keeps only its shard of it, so the weights do not depend on the world size. Values
    are drawn on the compute device even when the shards live on the CPU (offload): the CPU
    generator gives other numbers for the same seed."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    from tokenmill.trainer.model import init_tensor

    model.to_empty(device=torch.device("cpu") if cpu_offload else device)
    for name, p in model.named_parameters():
        full = init_tensor(canonical_name(name), p.shape, model.args, seed, device)
        if isinstance(p, DTensor):
            # src_data_rank=None: every rank computed the same full tensor; just keep the local shard.
            local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
            p.to_local().copy_(local)  # to the shard's own device (the CPU under offload)
        else:
            p.copy_(full)
    model.init_buffers(device)


def wants_fsdp(d: Dist, shard_single_rank: bool) -> bool:
    """FSDP whenever there is something to shard over, and always on GPU (its mixed-precision
    policy is how bf16 runs there). A lone CPU process is left unsharded by default: there
    fully_shard only adds copies (bench/MEASUREMENTS.md: no FSDP on one CPU); the weights, checkpoints
    (DCP reads them back into any world size) and every number are the same either way."""
    return d.world > 1 or d.device.type != "cpu" or shard_single_rank


def parallelize(make, cfg, d: Dist, precision: str) -> nn.Module:
    offload = cfg.parallel.cpu_offload and d.device.type != "cpu"  # on CPU everything already is
    model = build_on_meta(make)
    apply_activation_checkpointing(model, cfg.parallel.activation_checkpointing)
    if cfg.parallel.compile:
        apply_compile(model)
    if wants_fsdp(d, cfg.parallel.shard_single_rank):
        # One rank: resharding after forward frees nothing worth the copy to gather it again.
        apply_fsdp(model, d.mesh, mixed_precision(precision, d.device), offload,
                   cfg.parallel.reshard_after_forward and d.world > 1)
    materialise(model, d.device, cfg.seed, offload)
    return model


def raise_if_any(error: str | None, d: Dist) -> None:
    """Collective: when any rank has an error, every rank raises the first one, so the ranks stop
    together and rank 0 (the one that prints) says what went wrong, on whichever rank."""
    errors = [error]
    if d.world > 1:
        errors = [None] * d.world
        dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first:
        raise SharedError(first)


def agree_on_host(flags: list[bool], world: int) -> list[int]:
    """Per flag, how many ranks raised it: summed on the CPU (gloo), so the device queue is
    never waited for (``.numpy()`` exists for CPU tensors only: no device sync can hide here)."""
    t = torch.tensor([float(f) for f in flags], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t)
    return [int(v) for v in t.numpy()]

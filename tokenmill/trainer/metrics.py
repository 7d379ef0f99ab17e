"""RUN/metrics.jsonl (one object per step), TensorBoard events when tensorboard is installed,
and the console progress line. Only rank 0 writes."""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import sys
import time

import torch

# Dense peak FLOP/s of one device: (bf16/fp16 tensor cores, plain fp32), from vendor datasheets.
# Matched by substring of the device name, most specific first: NVL and PCIe parts run at lower
# clocks and power than the SXM part of the same name (an H100 NVL is 835 TFLOPS, not 989).
PEAK_FLOPS: list[tuple[str, float, float]] = [
    ("GB200", 2.5e15, 80e12),
    ("B200", 2.25e15, 80e12),
    ("GH200", 989e12, 67e12),
    ("H200 NVL", 835e12, 60e12),
    ("H200", 989e12, 67e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100", 989e12, 67e12),
    ("H800 PCIe", 756e12, 51e12),
    ("H800", 989e12, 67e12),
    ("H20", 148e12, 44e12),
    ("A100", 312e12, 19.5e12),
    ("A800", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L40", 181e12, 90.5e12),
    ("L4", 121e12, 30.3e12),
    ("A10G", 70e12, 31.2e12),
    ("A10", 125e12, 31.2e12),
    ("RTX 4090", 165e12, 82.6e12),
    ("RTX 3090", 71e12, 35.6e12),
    ("V100", 125e12, 15.7e12),
    ("T4", 65e12, 8.1e12),
    ("MI300X", 1307e12, 163e12),
    ("MI250X", 383e12, 47.9e12),
]


def peak_flops_for(name: str, precision: str) -> float | None:
    """Peak FLOP/s of the device called ``name`` (as torch.cuda.get_device_name gives it)."""
    for key, low, fp32 in PEAK_FLOPS:
        if key in name:
            return fp32 if precision == "fp32" else low
    return None


def peak_flops(device: torch.device, precision: str, override: float | None = None) -> float | None:
    """Peak FLOP/s of one device for MFU; None when unknown (CPU, an unlisted GPU)."""
    if override:
        return override
    if device.type != "cuda":
        return None
    return peak_flops_for(torch.cuda.get_device_name(device), precision)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def memory_row(device: torch.device) -> dict:
    """The caching allocator's figures (no device sync): peak active and reserved memory, in
    GiB and % of the device, cudaMalloc retries (the allocator freed its cache to satisfy a
    request: a sign of fragmentation, slow) and OOMs. Only peak_mem_mb on CPU."""
    row = {"peak_mem_mb": peak_memory_mb(device)}
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        total = torch.cuda.get_device_properties(device).total_memory
        for key, name in (("active_bytes.all.peak", "max_active"), ("reserved_bytes.all.peak", "max_reserved")):
            row[f"{name}_gib"] = stats.get(key, 0) / 2**30
            row[f"{name}_pct"] = 100 * stats.get(key, 0) / total
        row["alloc_retries"] = stats.get("num_alloc_retries", 0)
        row["ooms"] = stats.get("num_ooms", 0)
    return row


class PendingSteps:
    """Per-step values that live on the device (summed loss, grad norm) wait here until a log
    step reads them all in one transfer: reading them every step would make the host wait for
    the device each step, and the GPU would idle while the host queues the next one."""

    def __init__(self, global_tokens: int):
        self.global_tokens = global_tokens
        self.rows: list[dict] = []
        self.values: list[torch.Tensor] = []
        self.since = time.perf_counter()

    def add(self, row: dict, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self.rows.append(row)
        self.values.append(torch.stack([loss_sum.double(), grad_norm.double()]))

    def restart_clock(self) -> None:
        """The next rows' throughput counts from now (not the eval or save just done)."""
        self.since = time.perf_counter()

    def flush(self) -> list[dict]:
        """The pending rows, completed: loss, grad_norm, skipped, and throughput averaged over
        the steps since the last flush (the host runs ahead of the device in between)."""
        if not self.rows:
            return []
        values = torch.stack(self.values).tolist()  # the one host-device sync of the interval
        now = time.perf_counter()
        dt = (now - self.since) / len(self.rows)
        rows, self.rows, self.values, self.since = self.rows, [], [], now
        for row, (loss_sum, grad_norm) in zip(rows, values):
            loss = loss_sum / self.global_tokens
            row.update(loss=loss, grad_norm=grad_norm, skipped=not (math.isfinite(loss) and math.isfinite(grad_norm)),
                       tokens_per_s=self.global_tokens / dt, data_wait_pct=min(100.0, 100 * row.pop("wait") / dt))
        return rows


def run_summary(rows: list[dict], device: torch.device, world: int) -> list[str]:
    """The end-of-run check against the usual targets (GPU busy > 85%, communication < 12%,
    memory used > 90%), from what one rank can measure; what it cannot is said so."""
    timed = [r for r in rows[len(rows) // 10:] if r.get("tokens_per_s")]  # past the first tenth: warm-up, compile
    if not timed:
        return []
    mean = lambda key: sum(r[key] for r in timed) / len(timed)  # noqa: E731
    lines = [f"throughput {_si(mean('tokens_per_s'))} tokens/s over steps {timed[0]['step']}-{timed[-1]['step']}"]
    if timed[-1].get("mfu") is not None:
        lines.append(f"MFU {100 * mean('mfu'):.1f}% (model FLOPs / peak of {world} device(s))")
    else:
        lines.append("MFU: no peak FLOP/s known for this device (set metrics.peak_flops)")
    wait = mean("data_wait_pct")
    lines.append(f"data wait {wait:.1f}% of step time" + (" (> 5%: raise data.num_workers)" if wait > 5 else ""))
    last = rows[-1]
    if "max_reserved_pct" in last:
        pct = last["max_reserved_pct"]
        hint = " (< 90%: room for a larger train.micro_batch)" if pct < 90 else ""
        lines.append(f"memory: peak reserved {last['max_reserved_gib']:.1f} GiB = {pct:.0f}% of the device{hint}; "
                     f"{last['alloc_retries']} allocator retries, {last['ooms']} OOMs")
    else:
        lines.append(f"memory: peak RSS {last['peak_mem_mb'] / 1024:.2f} GiB (no device memory on {device.type})")
    evals = [r for r in rows if "val_loss" in r]
    if evals:
        bpb = f", {evals[-1]['val_bpb']:.4f} bits per byte" if "val_bpb" in evals[-1] else ""
        lines.append(f"validation at step {evals[-1]['step']}: loss {evals[-1]['val_loss']:.4f}{bpb}")
    lines.append("not measured from one rank: GPU busy % and the communication share of a step "
                 "(profile a few steps with torch.profiler to see them)")
    return lines


def available_memory() -> int | None:
    """Bytes this machine can still give: MemAvailable, capped by a container's cgroup limit
    (cgroup v2, then v1); None where neither can be read."""
    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            avail = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        with contextlib.suppress(ValueError, OSError, AttributeError):
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):  # missing, or "max" (no limit)
            with open(path, encoding="ascii") as fh:
                limit = int(fh.read())
            avail = limit if avail is None else min(avail, limit)
    return avail


def truncate_after(path: str, step: int) -> None:
    """On resume, drop the lines a killed run logged past the checkpoint it resumes from, so
    metrics.jsonl reads as one uninterrupted run."""
    if not os.path.exists(path):
        return
    keep = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line if line.endswith("\n") else line + "\n")
            except json.JSONDecodeError:  # a line cut by the kill
                pass
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(keep)
    os.replace(tmp, path)


class Metrics:
    def __init__(self, run: str, enabled: bool, tensorboard: bool, total_steps: int, log_every: int):
        self.enabled, self.total, self.log_every = enabled, total_steps, log_every
        self._fh = open(os.path.join(run, "metrics.jsonl"), "a", encoding="utf-8") if enabled else None
        self._tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(os.path.join(run, "tb"))
            except ImportError:  # tensorboard not installed: skip quietly
                self._tb = None

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        # NaN/inf are not JSON: a skipped step logs null (and "skipped": true).
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    name = {"val_loss": "val/loss", "val_bpb": "val/bpb"}.get(k, f"train/{k}")
                    self._tb.add_scalar(name, v, row["step"])
        step = row["step"]
        if step % self.log_every == 0 or step == self.total or "val_loss" in row:
            print(progress_line(row, self.total), file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        if self.enabled:
            from tokenmill.terminal import safe

            # it names paths and checkpoints, and what differs between two tokenizers
            print(f"tokenmill train: {safe(text)}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._fh:
            self._fh.close()
        if self._tb is not None:
            self._tb.close()


def _si(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def progress_line(row: dict, total: int) -> str:
    def num(v, fmt):
        return "nan" if v is None else format(v, fmt)

    parts = [f"step {row['step']}/{total}", f"loss {num(row['loss'], '.4f')}", f"lr {row['lr']:.2e}",
             f"gnorm {num(row['grad_norm'], '.3f')}", f"tok/s {_si(row['tokens_per_s'])}"]
    if row.get("mfu") is not None:
        parts.append(f"mfu {100 * row['mfu']:.1f}%")
    parts.append(f"data-wait {row['data_wait_pct']:.1f}%")
    parts.append(f"mem {row['peak_mem_mb'] / 1024:.2f}GiB")
    if "val_loss" in row:
        parts.append(f"val {row['val_loss']:.4f}" + (f" ({row['val_bpb']:.4f} bpb)" if "val_bpb" in row else ""))
    if row.get("skipped"):
        parts.append("SKIPPED (non-finite)")
    return "  ".join(parts)

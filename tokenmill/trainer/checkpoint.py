"""Sharded checkpoints with torch.distributed.checkpoint (DCP), safe against a kill mid-save.

    RUN/checkpoints/step-00001000/   DCP files (each rank its shards) + trainer.json + COMPLETE
    RUN/checkpoints/best/            same layout, model only, lowest validation loss so far

A save goes to ``.tmp-<name>/``; after every rank has written, rank 0 writes trainer.json (a
few integers: step, samples consumed, ...; and the tokenizer's sha256) and the COMPLETE marker,
fsyncs, and renames the folder into place. A kill at any moment leaves either the old
checkpoint or the new one, never a half-written folder under a real name; leftovers are swept
at the next start. DCP reshards on load, so a run may resume on a different number of ranks.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import torch.distributed as dist

from tokenmill.errors import UserError

MARKER = "COMPLETE"
STATE = "trainer.json"
_STEP_RE = re.compile(r"^step-(\d{8,})$")


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MARKER))


def complete_steps(root: str) -> list[tuple[int, str]]:
    """Every complete step checkpoint under ``root``, oldest first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_RE.match(name)
        if m and is_complete(os.path.join(root, name)):
            found.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(found)


def latest(root: str) -> tuple[int, str] | None:
    steps = complete_steps(root)
    return steps[-1] if steps else None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def sweep(root: str) -> None:
    """Rank 0 at start: drop half-written saves; finish an interrupted replace of best/."""
    if not os.path.isdir(root):
        return
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(".tmp-"):
            shutil.rmtree(path, ignore_errors=True)
        elif name.endswith(".old"):
            live = path[: -len(".old")]
            if not is_complete(live) and is_complete(path):
                shutil.rmtree(live, ignore_errors=True)
                os.rename(path, live)
            else:
                shutil.rmtree(path, ignore_errors=True)


def save(path: str, model, optim, state: dict, is_main: bool) -> None:
    """Collective: every rank calls it. ``optim=None`` saves the model only (best/)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    root, name = os.path.split(path)
    tmp = os.path.join(root, f".tmp-{name}")
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier()
    sd = {"model": get_model_state_dict(model)}
    if optim is not None:
        sd["optim"] = get_optimizer_state_dict(model, optim)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(tmp, sync_files=True))
    if is_main:
        _write_synced(os.path.join(tmp, STATE), json.dumps(state, indent=2))
        _write_synced(os.path.join(tmp, MARKER), f"{state.get('step')}\n")
        _fsync_dir(tmp)
        old = f"{path}.old"
        if os.path.exists(path):  # a re-save under the same name (best/, or the same step again)
            os.rename(path, old)
        os.rename(tmp, path)
        _fsync_dir(root)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load(path: str, model, optim) -> dict:
    """Collective: fill the (sharded) model and optimizer from ``path``; returns trainer.json."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)}
    try:
        dcp.load(sd, checkpoint_id=path)
    except Exception as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot resume from {path}: it does not match this model and optimizer "
                        f"(changed model.* settings? use a new --run): {first}") from None
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, optim, sd["optim"])
    return read_state(path)


def read_state(path: str) -> dict:
    """trainer.json of a checkpoint: step, samples consumed, tokenizer_sha256, ..."""
    with open(os.path.join(path, STATE), encoding="utf-8") as fh:
        return json.load(fh)


def prune(root: str, keep: int) -> None:
    """Rank 0: delete all but the newest ``keep`` complete step checkpoints."""
    for _, path in complete_steps(root)[:-keep]:
        shutil.rmtree(path, ignore_errors=True)

"""Sharded checkpoints with torch.distributed.checkpoint (DCP), safe against a kill mid-save.

    RUN/checkpoints/step-00001000/   DCP files (each rank its shards) + trainer.json + COMPLETE
    RUN/checkpoints/best/            same layout, model only, lowest validation loss so far

A save goes to ``.tmp-<name>/``; after every rank has written, rank 0 writes trainer.json (a
few integers: step, samples consumed, ...; and the tokenizer's sha256) and the COMPLETE marker,
fsyncs, and renames the folder into place. A kill at any moment leaves either the old
checkpoint or the new one, never a half-written folder under a real name; leftovers are swept
at the next start. DCP reshards on load, so a run may resume on a different number of ranks.

A run folder may come from someone else, so loading one runs no code from it: DCP reads its
``.metadata`` with ``pickle.load`` and its non-tensor items with ``torch.load(weights_only=False)``;
``load_checkpoint`` reads the first through an unpickler that knows only DCP's metadata classes
and the second with ``weights_only=True``. Anything else in those files is refused in one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import shutil

import torch.distributed as dist

from tokenmill.errors import UserError, first_line

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


def _state_dict(model, optim) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    sd = {"model": get_model_state_dict(model)}
    if optim is not None:
        sd["optim"] = get_optimizer_state_dict(model, optim)
    return sd


def _begin(path: str, is_main: bool) -> str:
    """Collective: a fresh .tmp-<name>/ that every rank then writes into."""
    root, name = os.path.split(path)
    tmp = os.path.join(root, f".tmp-{name}")
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier()
    return tmp


def _commit(path: str, state: dict) -> None:
    """Rank 0, once every rank's files are written: trainer.json, COMPLETE, rename into place."""
    root, name = os.path.split(path)
    tmp = os.path.join(root, f".tmp-{name}")
    _write_synced(os.path.join(tmp, STATE), json.dumps(state, indent=2))
    _write_synced(os.path.join(tmp, MARKER), f"{state.get('step')}\n")
    _fsync_dir(tmp)
    old = f"{path}.old"
    if os.path.exists(path):  # a re-save under the same name (best/, or the same step again)
        os.rename(path, old)
    os.rename(tmp, path)
    _fsync_dir(root)
    shutil.rmtree(old, ignore_errors=True)


def save(path: str, model, optim, state: dict, is_main: bool) -> None:
    """Collective: every rank calls it. ``optim=None`` saves the model only (best/, final/)."""
    import torch.distributed.checkpoint as dcp

    tmp = _begin(path, is_main)
    dcp.save(_state_dict(model, optim), storage_writer=dcp.FileSystemWriter(tmp, sync_files=True))
    if is_main:
        _commit(path, state)
    dist.barrier()


class Saver:
    """Saves one checkpoint at a time, synchronously or with dcp.async_save.

    Async: the state is staged to host memory (the step waits for that copy only), then a
    background thread writes it, its collectives on a gloo group of their own so they never
    interleave with training's. The checkpoint counts (COMPLETE, renamed into place) only
    once every rank's write has finished: the loop asks ``done_here()`` each step, all-reduces
    the answers with its other flags, and calls ``commit()`` when all ranks are done, or
    ``wait()`` before the next save and at the end."""

    def __init__(self, async_save: bool, is_main: bool, keep: int):
        self.async_save, self.is_main, self.keep = async_save, is_main, keep
        self._group = dist.new_group(backend="gloo") if async_save else None
        self._pending = None  # (future, path, state, prune_old)

    def save(self, path: str, model, optim, state: dict, prune_old: bool = False) -> None:
        """Collective. ``prune_old``: after this one counts, keep only the newest ``keep`` step-N."""
        import torch.distributed.checkpoint as dcp

        self.wait()
        if not self.async_save:
            save(path, model, optim, state, self.is_main)
            self._prune(path, prune_old)
            return
        tmp = _begin(path, self.is_main)
        future = dcp.async_save(_state_dict(model, optim), storage_writer=dcp.FileSystemWriter(tmp, sync_files=True),
                                process_group=self._group)
        self._pending = (future, path, dict(state), prune_old)

    def done_here(self) -> bool:
        """Whether this rank has nothing left to write (no device sync, no collective)."""
        return self._pending is None or self._pending[0].done()

    def pending(self) -> bool:
        return self._pending is not None

    def commit(self) -> None:
        """Every rank's write has finished (the caller agreed on it): make the checkpoint count."""
        future, path, state, prune_old = self._pending
        self._pending = None
        try:
            future.result()
        except Exception as e:  # the disk filled up, the folder went away: one line, from this rank
            raise UserError(f"checkpoint {path}: the background save failed: {first_line(e)}") from None
        if self.is_main:
            _commit(path, state)
        self._prune(path, prune_old)

    def wait(self) -> None:
        """Collective: block until the pending save, if any, is written everywhere, and commit it."""
        if self._pending is None:
            return
        self._pending[0].exception()  # blocks; commit() raises it as one line
        dist.barrier()
        self.commit()
        dist.barrier()

    def drain(self, timeout_s: float = 120.0) -> None:
        """After a failure (no collective may be possible): let this rank's background write end
        before the process groups go, without committing it (the rerun resumes from the last
        checkpoint that counted)."""
        if self._pending is None:
            return
        with contextlib.suppress(Exception):
            self._pending[0].result(timeout=timeout_s)
        self._pending = None

    def _prune(self, path: str, prune_old: bool) -> None:
        if prune_old and self.is_main:
            prune(os.path.dirname(path), self.keep)


# What DCP's own .metadata pickles name, and nothing that can run code: its dataclasses, the
# tensor shapes, dtypes and layouts they hold, and the checkpoint's path.
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata",
                                              "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
                                              "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        import torch

        if name in _METADATA_GLOBALS.get(module, ()) or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a DCP checkpoint's metadata never holds")


def _read_metadata(meta_path: str):
    """A DCP .metadata file read without running code from it; UserError if it is anything else."""
    import torch.distributed.checkpoint as dcp

    with open(meta_path, "rb") as fh:
        try:
            metadata = _MetadataUnpickler(fh).load()
        except Exception as e:
            raise UserError(f"{meta_path}: not a checkpoint's metadata, refused unread ({first_line(e)})") from None
    if not isinstance(metadata, dcp.metadata.Metadata):
        raise UserError(f"{meta_path}: not a checkpoint's metadata (it holds a {type(metadata).__name__})")
    return metadata


def load_checkpoint(sd: dict, path: str, no_dist: bool = False) -> None:
    """``dcp.load(sd, checkpoint_id=path)`` that runs no code from the files it reads (see the
    module docstring); a file that would is refused before DCP starts, naming it."""
    import torch
    import torch.distributed.checkpoint as dcp

    checked = _read_metadata(os.path.join(path, ".metadata"))

    class Reader(dcp.FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            rank = kwargs.get("rank")
            metadata = checked if rank is None else _read_metadata(str(self._get_metadata_path(rank)))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = dcp.metadata.StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class Planner(dcp.DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            try:
                loaded = torch.load(value, weights_only=True)
            except Exception as e:
                raise UserError(f"{path}: item {read_item.dest_index.fqn} is not plain data, refused unread "
                                f"({first_line(e)})") from None
            super().load_bytes(read_item, io.BytesIO(_dumps(loaded)))

    dcp.load(sd, storage_reader=Reader(path), planner=Planner(), no_dist=no_dist)


def _dumps(value) -> bytes:
    """``value`` as DefaultLoadPlanner.load_bytes reads it (its torch.load of plain data)."""
    import torch

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def load(path: str, model, optim) -> dict:
    """Collective: fill the (sharded) model and optimizer from ``path``; returns trainer.json."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)}
    try:
        load_checkpoint(sd, path)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"cannot resume from {path}: it does not match this model and optimizer "
                        f"(changed model.* settings? use a new --run-dir): {first_line(e)}") from None
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

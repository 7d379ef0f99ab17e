"""``tokenmill export OUT --format megatron|nanogpt|mds --output DIR``: the shards in the formats other
trainers read, holding exactly the token stream of the Arrow shards (documents in shard order,
each ending with its EOS), document boundaries included. Also at prepare time: ``shards.formats``
writes them under OUT/export/<format>/.

- megatron: ``<split>_text_document.bin/.idx`` (megatron-core's IndexedDataset, one sequence per
  document, uint16 ids under 65,500 tokens of vocab, else int32, as its preprocess_data picks);
- nanogpt: ``train.bin``/``val.bin`` (uint16, the documents joined by their EOS) and
  ``meta.pkl`` (vocab_size, eos_id), read by nanoGPT's train.py with np.memmap;
- mds: ``train/`` and ``val/`` written by mosaicml-streaming's MDSWriter, one sample per document
  (``tokens`` as an ndarray, the dtype as for megatron, and ``id``), read by its StreamingDataset
  and by llm-foundry's text dataset.

``tokenmill export`` (``export_to``) first verifies every shard against the manifest's checksums,
as ``inspect`` and ``train`` do. It writes into a folder of its own under DIR and then moves its
files in: DIR must be new, empty, or an earlier export (its ``.tokenmill-export.json`` lists the
files that export wrote, the only ones replaced); it is never OUT itself or a folder a run into
OUT replaces, and no link inside DIR is followed.

Everything streams record batch by record batch (the shards are memory-mapped, or read through
Beam's FileSystems when remote): memory does not grow with the output. The .idx file is written
in three passes over the shards' offsets alone (lengths, pointers, document indices), so no
per-document list is held either.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import shutil
import struct
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tokenmill.beamfs import FileSystems
from tokenmill.errors import UserError
from tokenmill.folders import LOCK_NAME, take_lock
from tokenmill.format import check_vocab, load_manifest, open_shard, tokenizer_path, verify_output
from tokenmill.pipelines.output import check_separate, new_stage

WRITTEN = ".tokenmill-export.json"  # in an export folder: the files that export wrote
MEGATRON_HEADER = b"MMIDIDX\x00\x00"
MEGATRON_DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


def _record_batches(out: str, manifest: dict, split: str) -> Iterator[pa.RecordBatch]:
    """Every record batch of a split, in shard order."""
    for shard in manifest["splits"].get(split, {}).get("shards", []):
        path = FileSystems.join(out, shard["file"])
        with open_shard(path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def _batches(out: str, manifest: dict, split: str) -> Iterator[pa.ListArray]:
    """The ``tokens`` column of every record batch of a split, in shard order."""
    for batch in _record_batches(out, manifest, split):
        yield batch.column("tokens")


def _values(tokens: pa.ListArray) -> np.ndarray:
    return tokens.flatten().to_numpy(zero_copy_only=False)


def _lengths(tokens: pa.ListArray) -> np.ndarray:
    offsets = tokens.offsets.to_numpy(zero_copy_only=False)
    return np.diff(offsets).astype(np.int64)


def megatron_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def write_megatron(out: str, manifest: dict, split: str, prefix: str) -> int:
    """``prefix.bin`` and ``prefix.idx``; returns the bytes written."""
    dtype = megatron_dtype(manifest["tokenizer"]["vocab_size"])
    n_docs = sum(s["docs"] for s in manifest["splits"].get(split, {}).get("shards", []))
    written = 0
    with FileSystems.create(prefix + ".bin") as fh:
        for tokens in _batches(out, manifest, split):
            data = _values(tokens).astype(dtype, copy=False).tobytes()
            fh.write(data)
            written += len(data)
    with FileSystems.create(prefix + ".idx") as fh:
        fh.write(MEGATRON_HEADER + struct.pack("<Q", 1) + struct.pack("<B", MEGATRON_DTYPE_CODES[dtype]))
        fh.write(struct.pack("<Q", n_docs) + struct.pack("<Q", n_docs + 1))
        for tokens in _batches(out, manifest, split):  # sequence lengths (int32)
            fh.write(_lengths(tokens).astype(np.int32).tobytes())
        pointer = 0
        for tokens in _batches(out, manifest, split):  # byte offset of each sequence (int64)
            sizes = _lengths(tokens) * dtype.itemsize
            ends = np.cumsum(sizes) + pointer
            fh.write((ends - sizes).astype(np.int64).tobytes())
            pointer = int(ends[-1]) if len(ends) else pointer
        for start in range(0, n_docs + 1, 1 << 20):  # one document per sequence: 0, 1, ..., n
            fh.write(np.arange(start, min(start + (1 << 20), n_docs + 1), dtype=np.int64).tobytes())
    return written


def write_nanogpt(out: str, manifest: dict, folder: str) -> int:
    tok = manifest["tokenizer"]
    _nanogpt_fits("--format", lambda: tok["vocab_size"])
    written = 0
    for split in ("train", "val"):
        with FileSystems.create(FileSystems.join(folder, f"{split}.bin")) as fh:
            for tokens in _batches(out, manifest, split):
                data = _values(tokens).astype(np.uint16, copy=False).tobytes()
                fh.write(data)
                written += len(data)
    meta = {"vocab_size": tok["vocab_size"], "eos_id": tok["eos_id"], "tokenizer": "tokenizer.json",
            "tokenizer_sha256": tok["sha256"]}
    with FileSystems.create(FileSystems.join(folder, "meta.pkl")) as fh:
        fh.write(pickle.dumps(meta))
    return written


def import_streaming() -> types.ModuleType:
    """mosaicml-streaming, or one line saying how to get it. Its package __init__ imports its
    image datasets, and so torchvision, which MDS token data never uses: where torchvision is
    missing or does not match the installed torch, the import is retried without that subpackage."""
    try:
        return importlib.import_module("streaming")
    except ModuleNotFoundError as e:
        if e.name != "torchvision":
            raise UserError("--format mds needs mosaicml-streaming: pip install mosaicml-streaming") from None
    except RuntimeError:  # a torchvision built for another torch fails registering its operators
        pass
    for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
        del sys.modules[name]
    sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
    return importlib.import_module("streaming")


def write_mds(out: str, manifest: dict, folder: str) -> int:
    """One MDS dataset per split under ``folder``/<split>, samples in shard order."""
    streaming = import_streaming()
    dtype = megatron_dtype(manifest["tokenizer"]["vocab_size"])
    columns = {"id": "str", "tokens": f"ndarray:{dtype.name}"}
    written = 0
    for split in ("train", "val"):
        if not manifest["splits"].get(split, {}).get("shards"):
            continue
        target = FileSystems.join(folder, split)  # new: export_to and prepare write into a fresh folder
        with streaming.MDSWriter(out=target, columns=columns, compression=None) as w:
            for batch in _record_batches(out, manifest, split):
                ids = batch.column("id").to_pylist()
                tokens = batch.column("tokens")
                values = _values(tokens).astype(dtype, copy=False)
                offsets = tokens.offsets.to_numpy(zero_copy_only=False) - tokens.offsets[0].as_py()
                for i, doc_id in enumerate(ids):
                    w.write({"id": doc_id, "tokens": values[offsets[i]:offsets[i + 1]]})
                written += values.nbytes
    return written


def _megatron_splits(out: str, manifest: dict, folder: str) -> int:
    return sum(write_megatron(out, manifest, split, FileSystems.join(folder, f"{split}_text_document"))
               for split in ("train", "val") if manifest["splits"].get(split, {}).get("shards"))


def _nanogpt_fits(where: str, vocab: Callable[[], int]) -> None:
    if (n := vocab()) > 65536:
        raise UserError(f"{where}: nanogpt reads uint16 ids and the tokenizer has {n:,} tokens: "
                        f"use megatron, or a tokenizer of at most 65,536")


def _mds_loads(where: str, vocab: Callable[[], int]) -> None:
    import_streaming()


@dataclass(frozen=True)
class ExportFormat:
    """An export format: ``write(out, manifest, folder)`` returns the token bytes written;
    ``check(where, vocab)`` refuses, in one line and before any work, what it cannot write
    (``vocab``: the tokenizer's size, computed only if asked); prepare's shards.formats and
    ``tokenmill export`` both call it."""

    name: str
    write: Callable[[str, dict, str], int]
    check: Callable[[str, Callable[[], int]], None] | None = None


# Every export format, declared once: the CLI, shards.formats and both checks read it.
EXPORTS: dict[str, ExportFormat] = {e.name: e for e in (
    ExportFormat("megatron", _megatron_splits),
    ExportFormat("nanogpt", write_nanogpt, _nanogpt_fits),
    ExportFormat("mds", write_mds, _mds_loads),
)}
FORMATS = tuple(EXPORTS)


def export_format(name: str) -> ExportFormat:
    if name not in EXPORTS:
        raise UserError(f"--format {name}: not one of {', '.join(FORMATS)}")
    return EXPORTS[name]


def export(out: str, fmt: str, folder: str) -> int:
    """One format of OUT into ``folder`` (the tokenizer copied beside it); returns token bytes written."""
    writer = export_format(fmt).write
    manifest = load_manifest(out)
    if not FileSystems.exists(folder):
        FileSystems.mkdirs(folder)
    with FileSystems.open(tokenizer_path(out, manifest)) as src:  # read and written: OUT and folder may be
        tok = src.read()                                              # on different stores
    with FileSystems.create(FileSystems.join(folder, "tokenizer.json")) as dst:
        dst.write(tok)
    return writer(out, manifest, folder)


def _written_before(target: str) -> list[str]:
    """The files an earlier export into ``target`` wrote (relative paths from its WRITTEN list,
    without any that would lead outside it); [] for a new or empty folder. A folder holding
    anything else is refused: its files are not the export's to replace."""
    if not os.path.lexists(target):
        return []
    if os.path.islink(target) or not os.path.isdir(target):
        raise UserError(f"export: --output {target} is not a folder")
    if not [n for n in os.listdir(target) if n != LOCK_NAME]:
        return []
    listed = os.path.join(target, WRITTEN)
    try:
        with open(listed, encoding="utf-8", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
            names = json.load(fh)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"export: --output {target} holds other files and is not an earlier export "
                        f"(no readable {WRITTEN}); choose a new or empty folder") from None
    return [n for n in names if isinstance(n, str) and _inside(target, n)]


def _inside(target: str, rel: str) -> bool:
    """``rel`` names a path under ``target`` reached through real folders only (no ``..``, no
    absolute path, no link on the way)."""
    parts = rel.split("/")
    if os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        return False
    return not any(os.path.islink(os.path.join(target, *parts[:i])) for i in range(1, len(parts)))


def export_to(out: str, fmt: str, target: str) -> int:
    """``tokenmill export``: ``fmt`` of OUT into the folder ``target`` (see the module
    docstring); returns token bytes written."""
    spec = export_format(fmt)
    manifest = load_manifest(out)
    check_vocab(out, manifest)
    if spec.check is not None:
        spec.check("--format", lambda: manifest["tokenizer"]["vocab_size"])
    problems = verify_output(out, manifest)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise UserError(f"export: {problems[0]}{more}; nothing exported (`tokenmill inspect {out}` lists them)")
    check_separate(out, target, "export")
    if "://" in target:  # an object store: no links, and nothing is replaced but what is written
        return export(out, fmt, target)
    before = _written_before(target)
    try:
        os.makedirs(target, exist_ok=True)
    except OSError as e:
        raise UserError(f"export: --output {target}: cannot create the folder ({e.strerror})") from None
    lock = take_lock(target, "export", "export: --output", "--output")  # a second export into it: one line
    stage = new_stage(target)  # as prepare's: a fresh folder of its own under the target
    try:
        written = export(out, fmt, stage)
        names = sorted(os.path.relpath(os.path.join(d, f), stage) for d, _, fs in os.walk(stage) for f in fs)
        theirs = [n for n in names if n not in before and os.path.lexists(os.path.join(target, n))]
        if theirs or not all(_inside(target, n) for n in names):
            raise UserError(f"export: --output {target} already holds {(theirs or names)[0]}, which no earlier export "
                            "wrote there; choose a new or empty folder")
        for rel in before:  # the earlier export's files (a link is removed, never followed)
            if os.path.lexists(os.path.join(target, rel)) and not os.path.isdir(os.path.join(target, rel)):
                os.unlink(os.path.join(target, rel))
        for rel in names:
            os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
            os.replace(os.path.join(stage, rel), os.path.join(target, rel))
        for folder in sorted({os.path.dirname(r) for r in before if "/" in r}, key=len, reverse=True):
            if not os.path.islink(os.path.join(target, folder)):
                try:
                    os.rmdir(os.path.join(target, folder))  # emptied and not written again
                except OSError:
                    pass
        with open(os.path.join(stage, WRITTEN), "w", encoding="utf-8") as fh:
            json.dump({"format": fmt, "files": names}, fh, indent=1)
        os.replace(os.path.join(stage, WRITTEN), os.path.join(target, WRITTEN))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        os.close(lock)
    return written

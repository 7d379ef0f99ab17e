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

Everything streams record batch by record batch (the shards are memory-mapped, or read through
Beam's FileSystems when remote): memory does not grow with the output. The .idx file is written
in three passes over the shards' offsets alone (lengths, pointers, document indices), so no
per-document list is held either.
"""

from __future__ import annotations

import importlib
import pickle
import struct
import sys
import types
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from tokenmill.errors import UserError
from tokenmill.format import load_manifest, tokenizer_path

FORMATS = ("megatron", "nanogpt", "mds")
MEGATRON_HEADER = b"MMIDIDX\x00\x00"
MEGATRON_DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


def _record_batches(out: str, manifest: dict, split: str) -> Iterator[pa.RecordBatch]:
    """Every record batch of a split, in shard order."""
    for shard in manifest["splits"].get(split, {}).get("shards", []):
        path = FileSystems.join(out, shard["file"])
        opener = FileSystems.open if "://" in path else pa.memory_map
        with opener(path) as source:
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
    if tok["vocab_size"] > 65536:
        raise UserError(f"--format nanogpt: nanoGPT reads uint16 ids, and {out}'s tokenizer has "
                        f"{tok['vocab_size']:,} tokens: use --format megatron, or a tokenizer of at most 65,536")
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
        target = FileSystems.join(folder, split)
        if FileSystems.exists(target):  # written again, as the other formats are (MDSWriter refuses a folder)
            FileSystems.delete([target])
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


def export(out: str, fmt: str, folder: str) -> int:
    """One format of OUT into ``folder`` (the tokenizer copied beside it); returns token bytes written."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: not one of {', '.join(FORMATS)}")
    manifest = load_manifest(out)
    if not FileSystems.exists(folder):
        FileSystems.mkdirs(folder)
    FileSystems.copy([tokenizer_path(out, manifest)], [FileSystems.join(folder, "tokenizer.json")])
    if fmt == "nanogpt":
        return write_nanogpt(out, manifest, folder)
    if fmt == "mds":
        return write_mds(out, manifest, folder)
    return sum(write_megatron(out, manifest, split, FileSystems.join(folder, f"{split}_text_document"))
               for split in ("train", "val") if manifest["splits"].get(split, {}).get("shards"))

"""The output format, free of Beam: shard files, the manifest, and their verification.

A shard is an Arrow IPC *file* (not stream) with no compression, so ``pa.memory_map`` gives
the trainer zero-copy access. Columns ``id: string`` and ``tokens: list<uint16|uint32>``,
record batches bounded by ``batch_tokens``. Placement is a pure function of the document id
(split by one hash; the shard is the document's bucket, by another) and rows inside a shard
are sorted by id, so the same input and config give byte-identical shards on every runner.

The trainer, ``inspect`` and the pipeline's writer (transforms/shards.py) all use this module.
Local paths are read with the standard library; a gs:// or s3:// output goes through Beam's
FileSystems, imported only then, so the trainer never loads the pipeline layer.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.errors import UserError

# ---------------------------------------------------------------- paths, local or remote


def _remote(path: str) -> bool:
    return "://" in path


def _beam_fs():
    from tokenmill.beamfs import FileSystems

    return FileSystems


def join(out: str, *parts: str) -> str:
    return _beam_fs().join(out, *parts) if _remote(out) else os.path.join(out, *parts)


def open_read(path: str):
    return _beam_fs().open(path) if _remote(path) else open(path, "rb")


def exists(path: str) -> bool:
    return _beam_fs().exists(path) if _remote(path) else os.path.exists(path)


def open_shard(path: str):
    """A shard to read with ``pa.ipc.open_file``: memory-mapped when local, streamed (range
    reads) from an object store."""
    return open_read(path) if _remote(path) else pa.memory_map(path)


def file_size(path: str) -> int:
    if _remote(path):
        return _beam_fs().match([path])[0].metadata_list[0].size_in_bytes
    return os.path.getsize(path)


# ---------------------------------------------------------------- shards and the manifest


FORMAT_VERSION = 1
SPLITS = ("train", "val")


def _unit_hash(text: str, salt: str) -> float:
    h = hashlib.blake2b(f"{salt}\0{text}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def split_of(doc_id: str, val_fraction: float, salt: str = "split") -> str:
    return "val" if _unit_hash(doc_id, salt) < val_fraction else "train"


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.arrow"


def shard_schema(dtype: np.dtype, tok: dict[str, Any]) -> pa.Schema:
    return pa.schema(
        [pa.field("id", pa.string()), pa.field("tokens", pa.list_(pa.from_numpy_dtype(dtype)))],
        metadata={
            "tokenmill.format_version": str(FORMAT_VERSION),
            "tokenmill.tokenizer_sha256": tok["sha256"],
            "tokenmill.eos_id": str(tok["eos_id"]),
        },
    )


class ShardWriter:
    """Rows (already in their final order) streamed into one Arrow IPC file, uncompressed, in
    record batches of at most ``batch_tokens`` tokens (or one row): memory is one batch.

    A batch's tokens are copied into one preallocated array as rows come, so each row's own
    array is freed at once rather than thousands of them waiting in the heap for the batch."""

    def __init__(self, sink, schema: pa.Schema, batch_tokens: int):
        self._writer = pa.ipc.new_file(sink, schema, options=pa.ipc.IpcWriteOptions(compression=None))
        self._schema, self._batch_tokens = schema, batch_tokens
        self._value_type = schema.field("tokens").type.value_type
        self._buf = np.empty(0, dtype=pa.array([], type=self._value_type).to_numpy().dtype)  # no pandas
        self._ids: list[str] = []
        self._ends: list[int] = []
        self._pending = 0
        self.docs = self.tokens = 0

    def add(self, doc_id: str, tokens: np.ndarray) -> None:
        n = len(tokens)
        if self._ids and self._pending + n > self._batch_tokens:
            self._flush()
        if self._pending + n > len(self._buf):  # the first batch, or a row longer than a batch
            grown = np.empty(max(self._batch_tokens, self._pending + n), dtype=self._buf.dtype)
            grown[:self._pending] = self._buf[:self._pending]
            self._buf = grown
        self._buf[self._pending:self._pending + n] = tokens
        self._pending += n
        self._ids.append(doc_id)
        self._ends.append(self._pending)
        self.docs += 1
        self.tokens += n

    def _flush(self) -> None:
        offsets = pa.array(np.array([0, *self._ends], dtype=np.int32))
        values = pa.array(self._buf[:self._pending], type=self._value_type)
        tokens = pa.ListArray.from_arrays(offsets, values)
        self._writer.write_batch(pa.record_batch([pa.array(self._ids, pa.string()), tokens], schema=self._schema))
        self._ids, self._ends, self._pending = [], [], 0
        if len(self._buf) > self._batch_tokens:  # grown for one long row: back to a batch's size
            self._buf = np.empty(self._batch_tokens, dtype=self._buf.dtype)

    def close(self) -> None:
        if self._ids:
            self._flush()
        self._writer.close()


def shard_bytes(rows: list[tuple[str, np.ndarray]], schema: pa.Schema, batch_tokens: int) -> bytes:
    """The Arrow IPC file for ``rows`` (already in their final order), in memory."""
    sink = pa.BufferOutputStream()
    writer = ShardWriter(sink, schema, batch_tokens)
    for doc_id, tokens in rows:
        writer.add(doc_id, tokens)
    writer.close()
    return sink.getvalue().to_pybytes()


def build_manifest(shards: list[dict], tok: dict[str, Any], dtype: str, config: dict, version: str,
                   extractor: dict | None = None) -> dict:
    splits = {}
    for split in SPLITS:
        mine = sorted((s for s in shards if s["split"] == split), key=lambda s: s["file"])
        splits[split] = {
            "docs": sum(s["docs"] for s in mine),
            "tokens": sum(s["tokens"] for s in mine),
            "shards": [{k: s[k] for k in ("file", "docs", "tokens", "bytes", "sha256")} for s in mine],
        }
    return {
        "format_version": FORMAT_VERSION,
        "tokenmill_version": version,
        "tokenizer": {"file": "tokenizer.json", **tok},
        "token_dtype": dtype,
        "columns": {"id": "string", "tokens": f"list<{dtype}>"},
        "splits": splits,
        # Whether a duplicate cluster's survivor is in the shards once or rehydrated (repeated).
        "duplicates": {"keep": (dd := config.get("dedup") or {}).get("keep", "one"),
                       "repeats": dd.get("repeats") if dd.get("keep") == "rehydrate" else None},
        "config": config,
        **({"extractor": extractor} if extractor else {}),  # the build that extracted the text
    }


# ---------------------------------------------------------------- verification (inspect, trainer)


def sha256_file(path: str, chunk: int = 1 << 22) -> str:
    with open_read(path) as fh:
        return sha256_stream(fh, chunk)


def sha256_stream(fh, chunk: int = 1 << 22) -> str:
    """The sha256 of what is left to read in the open binary file ``fh``."""
    h = hashlib.sha256()
    while block := fh.read(chunk):
        h.update(block)
    return h.hexdigest()


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _shard_file_problem(name) -> str | None:
    if not isinstance(name, str) or not name:
        return "is not a file name"
    parts = name.replace("\\", "/").split("/")
    if "://" in name or name.startswith("/") or ".." in parts:
        return "is not a path inside OUT"
    return None


def manifest_problem(manifest) -> str | None:
    """What makes ``manifest`` no tokenmill manifest (its shape, not its files), or None. Checked
    before any field is used, so a hand-edited or foreign manifest is one line, not a traceback."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    tok = manifest.get("tokenizer")
    if not isinstance(tok, dict):
        return "no tokenizer object"
    for key in ("vocab_size", "eos_id"):
        if not _whole(tok.get(key)):
            return f"tokenizer.{key} is {tok.get(key)!r}, not a whole number"
    if not isinstance(tok.get("sha256"), str):
        return "tokenizer.sha256 is not a string"
    if "file" in tok and (why := _shard_file_problem(tok["file"])):
        return f"tokenizer.file {tok['file']!r} {why}"
    for key in ("format_version", "token_dtype"):
        if key not in manifest:
            return f"no {key}"
    splits = manifest.get("splits")
    if not isinstance(splits, dict) or not {"train", "val"} <= splits.keys():
        return "no splits object with train and val"
    for split, info in splits.items():
        if not isinstance(info, dict) or not isinstance(info.get("shards"), list):
            return f"splits.{split} has no list of shards"
        for key in ("docs", "tokens"):
            if not _whole(info.get(key)):
                return f"splits.{split}.{key} is {info.get(key)!r}, not a whole number"
        for i, sh in enumerate(info["shards"]):
            where = f"splits.{split}.shards[{i}]"
            if not isinstance(sh, dict):
                return f"{where} is not an object"
            if why := _shard_file_problem(sh.get("file")):
                return f"{where}.file {sh.get('file')!r} {why}"
            for key in ("docs", "tokens", "bytes"):
                if not _whole(sh.get(key)):
                    return f"{where}.{key} is {sh.get(key)!r}, not a whole number"
            if not isinstance(sh.get("sha256"), str):
                return f"{where}.sha256 is not a string"
    return None


def check_manifest(out: str, manifest) -> dict:
    if problem := manifest_problem(manifest):
        raise UserError(f"{join(out, 'manifest.json')}: {problem}; this is no manifest "
                        "`tokenmill prepare` wrote (re-run it)")
    return manifest


def tokenizer_path(out: str, manifest: dict) -> str:
    """The tokenizer.json of a prepared output, as its manifest names it."""
    return join(out, manifest.get("tokenizer", {}).get("file", "tokenizer.json"))


def local_tokenizer(out: str, manifest: dict) -> str:
    """The tokenizer.json of a prepared output as a local file: on an object store, its copy in
    the local cache, checked against the manifest's sha256."""
    from tokenmill import store, store_cache

    path = tokenizer_path(out, manifest)
    return store_cache.cached(path, manifest["tokenizer"]["sha256"], 0) if store.is_store(path) else path


def load_manifest(out: str) -> dict:
    path = join(out, "manifest.json")
    try:
        with open_read(path) as fh:
            manifest = json.loads(fh.read().decode("utf-8"))
    except Exception:
            raise UserError(f"{path}: missing or not valid JSON (did `tokenmill prepare` finish?)") from None
    return check_manifest(out, manifest)


def check_vocab(out: str, manifest: dict) -> None:
    """The manifest's vocab_size is the tokenizer's: the model gets that many embedding rows, so
    a smaller figure ends in an IndexError and a larger one in a model the tokenizer cannot use.
    Skipped where verify_output already has a word to say (tokenizer missing or not the one
    hashed in the manifest) and for a file that is no tokenizers JSON (test stand-ins)."""
    from tokenmill.errors import UserError

    tok = manifest.get("tokenizer", {})
    path = tokenizer_path(out, manifest)
    try:
        with open_read(path) as fh:
            raw = fh.read()
        if hashlib.sha256(raw).hexdigest() != tok.get("sha256"):
            return
        from tokenmill.native import tokenizer_from_text

        vocab = tokenizer_from_text(raw.decode("utf-8")).get_vocab_size(with_added_tokens=True)
    except Exception:  # noqa: BLE001 - unreadable, or no tokenizers JSON: verify_output says so
        return
    if vocab != tok.get("vocab_size"):
        raise UserError(f"{join(out, 'manifest.json')} says vocab_size {tok.get('vocab_size')} but "
                        f"{path} has {vocab} tokens: the manifest was edited or belongs to another tokenizer; "
                        f"re-run `tokenmill prepare`")


def verify_output(out: str, manifest: dict, part: tuple[int, int] = (0, 1), checksums: bool = True,
                  shards: bool = True) -> list[str]:
    """Every problem with the shards and tokenizer of ``out`` against its manifest, one line
    each. ``part`` (i, n): only the i-th of every n shards, in manifest order (the trainer's
    ranks share the hashing); the tokenizer with part 0. ``checksums=False``: shard sizes only,
    for outputs too big to hash at every start. ``shards=False``: the tokenizer only."""
    problems = []
    tok = manifest.get("tokenizer", {})
    tok_path = tokenizer_path(out, manifest)
    i, n = part
    if i == 0 and checksums:
        if not exists(tok_path):
            problems.append(f"{tok_path}: missing")
        elif sha256_file(tok_path) != tok.get("sha256"):
            problems.append(f"{tok_path}: sha256 does not match the manifest")
    listed = [s for info in manifest.get("splits", {}).values() for s in info.get("shards", [])] if shards else []
    for s in listed[i::n]:
        path = join(out, s["file"])
        if not exists(path):
            problems.append(f"{path}: missing")
            continue
        size = file_size(path)
        if size != s["bytes"]:
            problems.append(f"{path}: {size} bytes, manifest says {s['bytes']} bytes")
            continue
        if not checksums:
            continue
        digest = sha256_file(path)
        if digest != s["sha256"]:
            problems.append(f"{path}: sha256 {digest[:12]}... does not match the manifest ({s['sha256'][:12]}...)")
            continue
        try:
            docs, tokens = count_shard(path)
        except Exception as e:  # a file with the right hash cannot be corrupt, but be safe
            problems.append(f"{path}: not a readable Arrow IPC file ({e})")
            continue
        if (docs, tokens) != (s["docs"], s["tokens"]):
            problems.append(f"{path}: {docs} docs / {tokens} tokens, manifest says {s['docs']} / {s['tokens']}")
    return problems


def count_shard(path: str) -> tuple[int, int]:
    # Local shards are memory-mapped; remote ones (gs://, s3://) are read through FileSystems.
    with open_shard(path) as source:
        reader = pa.ipc.open_file(source)
        docs = tokens = 0
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            # Offsets within bounds, buffers as long as they claim: a crafted shard (its checksum
            # in a crafted manifest) would otherwise have the trainer read outside the file.
            batch.validate(full=True)
            docs += batch.num_rows
            tokens += len(batch.column("tokens").values)
    return docs, tokens


# ---------------------------------------------------------------- an output on an object store


def published(out: str, *parts: str) -> str:
    """The path of a published file of OUT (``published(out, "report", "report.json")``): under
    OUT itself, or, on an object store, under the root its manifest commits
    (pipelines/commit.py)."""
    from tokenmill import store

    if store.is_store(out) and (manifest := store.committed(out)[1]) is not None:
        root = manifest.get("root")
        if isinstance(root, str) and _shard_file_problem(root) is None:
            return join(out, root, *parts)
    return join(out, *parts)


def local_view(out: str, files: bool = False) -> str:
    """OUT as a local folder with a local OUT's layout, for what needs local files (compare,
    spikes and tokenizer training read its docs; the trainer fetches its shards itself, as it
    reads them: trainer/token_stream.py): OUT itself when
    local; for an object store, the files its manifest lists (the shards and tokenizer; with
    ``files``, every other published file too, the docs and report among them), each fetched once
    into the local cache and checked against the manifest's sha256 before use (store_cache.cached),
    linked under ``<cache>/views/<the manifest's sha256>/`` at their paths under the committed
    root, beside the manifest with its paths made relative to that root again."""
    if not _remote(out):
        return out
    from tokenmill import store, store_cache

    raw, _ = store.committed(out)
    if raw is None:
        raise UserError(f"{join(out, 'manifest.json')}: missing (did `tokenmill prepare` finish?)")
    try:
        manifest = check_manifest(out, json.loads(raw.decode("utf-8")))
    except ValueError:
        raise UserError(f"{join(out, 'manifest.json')}: not valid JSON") from None
    root = manifest.pop("root", "")
    root = root + "/" if isinstance(root, str) and root and _shard_file_problem(root) is None else ""

    def local(rel: str) -> str:  # a path under OUT -> the same file's path in a local OUT
        return rel[len(root):] if root and rel.startswith(root) else rel

    wanted = {s["file"]: (s["sha256"], s["bytes"]) for info in manifest["splits"].values() for s in info["shards"]}
    tok = manifest["tokenizer"]
    if isinstance(tok.get("sha256"), str):
        wanted[tok.get("file", "tokenizer.json")] = (tok["sha256"], 0)
    listed = {rel: f for rel, f in manifest.pop("files", {}).items() if isinstance(f, dict)}
    if files:
        wanted.update({rel: (f["sha256"], f["bytes"]) for rel, f in listed.items() if _shard_file_problem(rel) is None})
    view = os.path.join(store_cache.cache_dir(), "views", hashlib.sha256(raw).hexdigest())
    keep = [sha for sha, _ in wanted.values()]

    def link(item):
        rel, (sha, size) = item
        blob = store_cache.cached(join(out, rel), sha, size, keep)
        dest = os.path.join(view, local(rel))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.realpath(dest) != blob:
            tmp = f"{dest}.{os.getpid()}"
            os.symlink(blob, tmp)
            os.replace(tmp, dest)

    store.parallel(link, sorted(wanted.items()))
    for info in manifest["splits"].values():
        for s in info["shards"]:
            s["file"] = local(s["file"])
    tok["file"] = local(tok.get("file", "tokenizer.json"))
    manifest["files"] = {local(rel): f for rel, f in listed.items()}
    tmp = os.path.join(view, f"manifest.json.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2)
    os.replace(tmp, os.path.join(view, "manifest.json"))
    return view

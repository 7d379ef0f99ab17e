"""Small files a user gives a stage (URL lists, evaluation sets), read whole on each worker's
setup: local or remote paths, gzip/zstd/bz2 by extension, and one clear line when missing."""

from __future__ import annotations

import json
from collections.abc import Iterator

from tokenmill.beamfs import CompressionTypes, FileSystems
from tokenmill.errors import UserError


def check_exists(path: str, what: str) -> None:
    if not FileSystems.exists(path):
        raise UserError(f"{what} {path}: no such file")


def lines(path: str, what: str) -> Iterator[tuple[int, str]]:
    """(line number, line without its end) of a text file."""
    check_exists(path, what)
    with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as fh:
        for n, raw in enumerate(fh, 1):
            yield n, raw.decode("utf-8", "replace").rstrip("\r\n")


def texts(path: str, fields: list[str], what: str) -> Iterator[str]:
    """The text items of a file: the non-empty string values of ``fields`` in each record of a
    JSONL or Parquet file, else each non-empty line of a text file."""
    name = path.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        check_exists(path, what)
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            table = pq.read_table(fh)
        for field in fields:
            if field in table.column_names:
                yield from (v for v in table.column(field).to_pylist() if isinstance(v, str) and v.strip())
        return
    is_json = any(name.removesuffix(ext).endswith((".jsonl", ".json")) for ext in ("", ".gz", ".zst", ".bz2"))
    for n, line in lines(path, what):
        if not line.strip():
            continue
        if not is_json:
            yield line
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{what} {path}:{n}: not a JSON record ({e.msg})") from None
        if isinstance(record, dict):
            yield from (record[f] for f in fields if isinstance(record.get(f), str) and record[f].strip())

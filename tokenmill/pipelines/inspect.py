"""``tokenmill inspect OUT``: verify every checksum and count against the manifest, show the
splits and shards, and decode the first documents so a person sees what the trainer will read."""

from __future__ import annotations

import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from rich.console import Console
from rich.table import Table

from tokenmill.transforms.shards import load_manifest, verify_output
from tokenmill.transforms.tokenize import tokenizer_from_json


def first_docs(path: str, n: int) -> list[tuple[str, list[int]]]:
    with pa.memory_map(path) as source:
        reader = pa.ipc.open_file(source)
        out = []
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            for doc_id, tokens in zip(batch.column("id").to_pylist(), batch.column("tokens")):
                out.append((doc_id, tokens.values.to_numpy().tolist()))
                if len(out) == n:
                    return out
        return out


def inspect_output(out: str, n_docs: int = 3, console: Console | None = None) -> int:
    console = console or Console()
    manifest = load_manifest(out)
    problems = verify_output(out, manifest)
    tok = manifest["tokenizer"]
    console.print(f"[bold]{out}[/]: tokenmill {manifest.get('tokenmill_version')}, format {manifest['format_version']}, "
                  f"tokens {manifest['token_dtype']}, tokenizer {tok.get('model')} vocab {tok['vocab_size']:,} "
                  f"eos {tok['eos_id']} sha256 {tok['sha256'][:12]}")
    t = Table(show_edge=False)
    for col in ("split", "shard", "docs", "tokens", "MB"):
        t.add_column(col, justify="left" if col in ("split", "shard") else "right")
    for split, info in manifest["splits"].items():
        for s in info["shards"]:
            t.add_row(split, s["file"], f"{s['docs']:,}", f"{s['tokens']:,}", f"{s['bytes'] / 1e6:.2f}")
        t.add_row(f"[bold]{split}[/]", f"{len(info['shards'])} shard(s)", f"[bold]{info['docs']:,}",
                  f"[bold]{info['tokens']:,}", "", end_section=True)
    console.print(t)
    if problems:
        for p in problems:
            console.print(f"[red]FAIL[/] {p}")
        console.print(f"[red]{len(problems)} problem(s)[/]: do not train on this output")
        return 1
    console.print("[green]all checksums and counts match the manifest[/]")
    shards = manifest["splits"]["train"]["shards"] or manifest["splits"]["val"]["shards"]
    if shards and n_docs:
        with FileSystems.open(FileSystems.join(out, tok.get("file", "tokenizer.json"))) as fh:
            tokenizer = tokenizer_from_json(fh.read().decode("utf-8"))
        for doc_id, ids in first_docs(FileSystems.join(out, shards[0]["file"]), n_docs):
            text = tokenizer.decode(ids, skip_special_tokens=False)
            console.print(f"[bold]{doc_id}[/] ({len(ids)} tokens): {text[:300]!r}")
    return 0

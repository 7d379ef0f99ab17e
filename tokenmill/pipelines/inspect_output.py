"""``tokenmill inspect OUT``: verify every checksum and count against the manifest, the
manifest's vocab_size against the tokenizer and every token id against it, show the splits and
shards, and decode the first documents so a person sees what the trainer will read."""

from __future__ import annotations

import pyarrow as pa
from rich.console import Console
from rich.table import Table

from tokenmill.beamfs import FileSystems
from tokenmill.errors import UserError
from tokenmill.format import check_vocab, load_manifest, open_shard, tokenizer_path, verify_output
from tokenmill.terminal import console as safe_console
from tokenmill.terminal import markup as m
from tokenmill.transforms.tokenization import tokenizer_from_json


def first_docs(path: str, n: int) -> list[tuple[str, list[int]]]:
    with open_shard(path) as source:
        reader = pa.ipc.open_file(source)
        out = []
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            for doc_id, tokens in zip(batch.column("id").to_pylist(), batch.column("tokens")):
                out.append((doc_id, tokens.values.to_numpy().tolist()))
                if len(out) == n:
                    return out
        return out


def max_token_id(path: str) -> int | None:
    """The largest token id in a shard; None when it holds no tokens."""
    import pyarrow.compute as pc

    with open_shard(path) as source:
        reader = pa.ipc.open_file(source)
        tops = [pc.max(reader.get_batch(i).column("tokens").values).as_py() for i in range(reader.num_record_batches)]
    return max((t for t in tops if t is not None), default=None)


def id_problems(out: str, manifest: dict) -> list[str]:
    """Shards holding ids the model would have no embedding for (the trainer's own check,
    applied to every token instead of the windows one run reads)."""
    vocab, problems = manifest["tokenizer"]["vocab_size"], []
    for info in manifest["splits"].values():
        for s in info["shards"]:
            path = FileSystems.join(out, s["file"])
            top = max_token_id(path)
            if top is not None and top >= vocab:
                problems.append(f"{path}: token id {top} is >= the manifest's vocab_size {vocab}")
    return problems


def unlisted_shards(out: str, manifest: dict) -> list[str]:
    """Files in OUT/shards/ that the manifest does not name (the trainer ignores them)."""
    listed = {FileSystems.join(out, s["file"]) for info in manifest["splits"].values() for s in info["shards"]}
    try:
        found = [m.path for m in FileSystems.match([FileSystems.join(out, "shards", "*")])[0].metadata_list]
    except Exception:  # no shards folder
        return []
    return sorted(p for p in found if p not in listed)


def inspect_output(out: str, n_docs: int = 3, console: Console | None = None) -> int:
    # Everything shown below but the counts comes from OUT (its manifest, file names, documents):
    # it is printed through terminal.markup.
    console = console or safe_console()
    if n_docs < 0:
        raise UserError(f"--docs {n_docs}: expected 0 or more documents to decode")
    manifest = load_manifest(out)
    check_vocab(out, manifest)  # the manifest itself is wrong: one line, nothing else to show
    # Ids only in shards that match their checksums: a corrupt file is not parsed.
    problems = verify_output(out, manifest) or id_problems(out, manifest)
    tok = manifest["tokenizer"]
    console.print(f"[bold]{m(out)}[/]: tokenmill {m(manifest.get('tokenmill_version'))}, "
                  f"format {m(manifest['format_version'])}, tokens {m(manifest['token_dtype'])}, "
                  f"tokenizer {m(tok.get('model'))} vocab {tok['vocab_size']:,} eos {m(tok['eos_id'])} "
                  f"sha256 {m(tok['sha256'][:12])}")
    t = Table(show_edge=False)
    for col in ("split", "shard", "docs", "tokens", "MB"):
        t.add_column(col, justify="left" if col in ("split", "shard") else "right")
    for split, info in manifest["splits"].items():
        for s in info["shards"]:
            t.add_row(m(split), m(s["file"]), f"{s['docs']:,}", f"{s['tokens']:,}", f"{s['bytes'] / 1e6:.2f}")
        t.add_row(f"[bold]{m(split)}[/]", f"{len(info['shards'])} shard(s)", f"[bold]{info['docs']:,}",
                  f"[bold]{info['tokens']:,}", "", end_section=True)
    console.print(t)
    if problems:
        for p in problems:
            console.print(f"[red]FAIL[/] {m(p)}")
        console.print(f"[red]{len(problems)} problem(s)[/]: do not train on this output")
        return 1
    console.print("[green]all checksums and counts match the manifest[/]")
    for path in unlisted_shards(out, manifest):
        console.print(f"[yellow]note[/] {m(path)}: not in the manifest (not read by `tokenmill train`)")
    shards = manifest["splits"]["train"]["shards"] or manifest["splits"]["val"]["shards"]
    if shards and n_docs:
        with FileSystems.open(tokenizer_path(out, manifest)) as fh:
            tokenizer = tokenizer_from_json(fh.read().decode("utf-8"))
        for doc_id, ids in first_docs(FileSystems.join(out, shards[0]["file"]), n_docs):
            text = tokenizer.decode(ids, skip_special_tokens=False)
            console.print(f"[bold]{m(doc_id)}[/] ({len(ids)} tokens): {m(repr(text[:300]))}")
    return 0

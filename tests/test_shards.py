"""Tokenization into shards: round trip, zero copy, determinism, verification, dtype, bad input."""

import hashlib
import json
import shutil

import numpy as np
import pyarrow as pa
import pytest
from conftest import by_id, run_prepare
from tokenizers import Tokenizer

from tokenmill.errors import UserError
from tokenmill.format import count_shard, shard_bytes, shard_schema
from tokenmill.pipelines.inspect_output import inspect_output
from tokenmill.transforms.tokenization import (
    read_tokenizer_json,
    token_dtype,
    tokenizer_info,
    train_tokenizer,
)

SMALL = ["tokenize.vocab_size=1000", "shards.target_bytes=20000", "shards.val_fraction=0.1"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "out"
    rc, rows, report = run_prepare(out, [], sets=SMALL)
    assert rc == 0
    return out, rows, json.loads((out / "manifest.json").read_text())


def shard_docs(out, manifest):
    for split, info in manifest["splits"].items():
        for s in info["shards"]:
            with pa.memory_map(str(out / s["file"])) as src:
                table = pa.ipc.open_file(src).read_all()
            for doc_id, tokens in zip(table.column("id").to_pylist(), table.column("tokens").to_pylist()):
                yield split, s["file"], doc_id, tokens


def test_every_kept_doc_in_exactly_one_shard_and_round_trips(prepared):
    out, rows, manifest = prepared
    kept = {r["id"]: r for r in rows if r["dropped_by"] is None}
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    eos = manifest["tokenizer"]["eos_id"]
    seen = {}
    for split, _, doc_id, tokens in shard_docs(out, manifest):
        assert doc_id not in seen
        seen[doc_id] = split
        assert tokens[-1] == eos and eos not in tokens[:-1]
        assert tok.decode(tokens[:-1], skip_special_tokens=False) == kept[doc_id]["text"]
        assert kept[doc_id]["n_tokens"] == len(tokens)
    assert set(seen) == set(kept)
    assert len(manifest["splits"]["train"]["shards"]) > 1 and manifest["splits"]["val"]["docs"] > 0
    for split, info in manifest["splits"].items():
        assert info["docs"] == sum(1 for s in seen.values() if s == split)
        assert info["tokens"] == sum(s["tokens"] for s in info["shards"])


def test_shards_are_uncompressed_ipc_files_read_zero_copy(prepared):
    out, _, manifest = prepared
    paths = [str(out / s["file"]) for info in manifest["splits"].values() for s in info["shards"]]
    dtype = token_dtype(manifest["tokenizer"]["vocab_size"])
    before = pa.total_allocated_bytes()
    total = 0
    for path in paths:
        with pa.memory_map(path) as src:
            mapped = src.read_buffer()  # the whole file: a view of the mapping, no copy
            src.seek(0)
            reader = pa.ipc.open_file(src)
            assert reader.schema.metadata[b"tokenmill.tokenizer_sha256"].decode() == manifest["tokenizer"]["sha256"]
            for i in range(reader.num_record_batches):
                tokens = reader.get_batch(i).column("tokens").values.to_numpy(zero_copy_only=True)
                # The tokens are the file's bytes where the file is mapped: nothing was copied.
                assert mapped.address <= tokens.ctypes.data
                assert tokens.ctypes.data + tokens.nbytes <= mapped.address + mapped.size
                assert tokens.dtype == dtype and len(tokens) and int(tokens.max()) < manifest["tokenizer"]["vocab_size"]
                total += len(tokens)
    assert pa.total_allocated_bytes() == before
    assert total == sum(info["tokens"] for info in manifest["splits"].values())


def test_same_input_same_bytes(prepared, tmp_path):
    out, _, manifest = prepared
    rc, _, _ = run_prepare(tmp_path / "again", [], sets=SMALL)
    again = json.loads((tmp_path / "again" / "manifest.json").read_text())
    assert rc == 0 and again["splits"] == manifest["splits"]
    assert again["tokenizer"]["sha256"] == manifest["tokenizer"]["sha256"]
    for info in again["splits"].values():
        for s in info["shards"]:
            assert (tmp_path / "again" / s["file"]).read_bytes() == (out / s["file"]).read_bytes()


def test_inspect_passes_then_catches_a_flipped_byte(prepared, tmp_path, capsys):
    out, _, manifest = prepared
    assert inspect_output(str(out)) == 0
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    victim = copy / manifest["splits"]["train"]["shards"][1]["file"]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    capsys.readouterr()
    assert inspect_output(str(copy)) == 1
    assert victim.name in capsys.readouterr().out


def test_dtype_choice_and_uint32_shards(tmp_path):
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    with pytest.raises(UserError, match="does not fit"):
        token_dtype(2**32 + 1)
    tok = {"sha256": "0" * 64, "eos_id": 70000}
    rows = [("a", np.array([1, 70000], dtype=np.uint32)), ("b", np.array([69999, 3, 70000], dtype=np.uint32))]
    path = tmp_path / "s.arrow"
    path.write_bytes(shard_bytes(rows, shard_schema(np.dtype(np.uint32), tok), batch_tokens=2))
    assert count_shard(str(path)) == (2, 5)
    with pa.memory_map(str(path)) as src:
        reader = pa.ipc.open_file(src)
        assert reader.schema.field("tokens").type == pa.list_(pa.uint32()) and reader.num_record_batches == 2


def test_user_tokenizer_and_bad_tokenizer_paths(tmp_path, capsys):
    tok = train_tokenizer(["hello world, a tiny corpus for a tiny tokenizer"] * 10, vocab_size=300)
    tok.save(str(tmp_path / "tok.json"))
    assert tokenizer_info(read_tokenizer_json(str(tmp_path / "tok.json")))["eos_id"] == 0
    (tmp_path / "junk.json").write_text('{"not": "a tokenizer"}')
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "no_eos.json"))
    for bad, needle in [(tmp_path / "missing.json", "cannot read"), (tmp_path / "junk.json", "not a Hugging Face"),
                        (tmp_path / "no_eos.json", "no EOS token")]:
        rc, rows, _ = run_prepare(tmp_path / "o", [], sets=[f"tokenize.tokenizer={bad}"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and rows == [] and needle in err and "\n" not in err


def test_given_tokenizer_is_used_and_copied(tmp_path):
    tok = train_tokenizer(["some training text for a given tokenizer"] * 20, vocab_size=400)
    tok.save(str(tmp_path / "given.json"))
    rc, _, _ = run_prepare(tmp_path / "o", [], sets=[f"tokenize.tokenizer={tmp_path / 'given.json'}"])
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert rc == 0 and (tmp_path / "o" / "tokenizer.json").read_bytes() == (tmp_path / "given.json").read_bytes()
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256((tmp_path / "given.json").read_bytes()).hexdigest()


def test_rerun_with_the_tokenizer_an_earlier_run_left_in_out(prepared, tmp_path):
    # Clearing OUT before a run must not delete the tokenizer that run is told to read.
    out = tmp_path / "o"
    shutil.copytree(prepared[0], out)
    before = (out / "tokenizer.json").read_bytes()
    rc, rows, _ = run_prepare(out, [], sets=SMALL + [f"tokenize.tokenizer={out / 'tokenizer.json'}"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert rc == 0 and (out / "tokenizer.json").read_bytes() == before
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(before).hexdigest()
    assert len(rows) == len(prepared[1])  # every docs file of the first run was replaced, none doubled


def test_empty_corpus_gives_a_valid_empty_manifest(tmp_path, caplog):
    rc, rows, report = run_prepare(tmp_path / "o", [], sets=["language.keep=[yo]", "tokenize.vocab_size=300"])
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert rc == 0 and report["documents"]["kept"] == 0
    assert manifest["splits"]["train"] == {"docs": 0, "tokens": 0, "shards": []}
    assert "no documents survived" in caplog.text
    assert inspect_output(str(tmp_path / "o")) == 0


def test_shards_and_docs_open_in_polars(prepared):
    pl = pytest.importorskip("polars")
    out, rows, manifest = prepared
    first = out / manifest["splits"]["train"]["shards"][0]["file"]
    df = pl.read_ipc(first)
    assert df.columns == ["id", "tokens"] and df.height == manifest["splits"]["train"]["shards"][0]["docs"]
    docs = pl.read_parquet(out / "docs" / "*.parquet")
    assert docs.height == len(rows) and set(by_id(rows)) == set(docs["id"].to_list())


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_tokenizer_train_cli(tmp_path, kind):
    from tokenmill.cli import main, sample_dir

    out = tmp_path / f"{kind}.json"
    assert main(["tokenizer", "train", "--input", f"{sample_dir()}/docs.jsonl", "--output", str(out),
                 "--kind", kind, "--vocab-size", "500"]) == 0
    tok = Tokenizer.from_file(str(out))
    # WordPiece keeps every character it saw on top of vocab_size (many in a multilingual sample).
    assert 250 < tok.get_vocab_size() and (kind == "wordpiece" or tok.get_vocab_size() <= 500)
    assert tok.token_to_id("<|endoftext|>") == 0
    assert tok.encode("The library opens at nine.").ids

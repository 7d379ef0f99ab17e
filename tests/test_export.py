"""Shards other trainers read, checked by their real readers: megatron-core's IndexedDataset on
the .bin/.idx, nanoGPT's np.memmap on train.bin/val.bin (+ meta.pkl), and HF datasets on the
docs Parquet. Each gives back exactly the Arrow shards' token stream, document boundaries
included; `shards.formats` at prepare time and `tokenmill export` write the same bytes."""

import json
import pickle

import numpy as np
import pyarrow as pa
import pytest

from tokenmill.cli import main
from tokenmill.errors import UserError


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "out"
    assert main(["prepare", "--output", str(out), "--set", "tokenize.vocab_size=700",
                 "--set", "shards.formats=[megatron, nanogpt]"]) == 0
    return out


def shard_docs(out, split) -> list[list[int]]:
    manifest = json.loads((out / "manifest.json").read_text())
    docs = []
    for s in manifest["splits"][split]["shards"]:
        docs += pa.ipc.open_file(pa.memory_map(str(out / s["file"]))).read_all().column("tokens").to_pylist()
    return docs


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("split", ["train", "val"])
def test_megatron_indexed_dataset_reads_every_document(out, split):
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    docs = shard_docs(out, split)
    ds = indexed.IndexedDataset(str(out / "export" / "megatron" / f"{split}_text_document"))
    assert len(ds) == len(docs) > 0 and ds.index.dtype == np.uint16
    assert all(ds[i].tolist() == doc for i, doc in enumerate(docs))
    assert ds.document_indices.tolist() == list(range(len(docs) + 1))
    eos = json.loads((out / "manifest.json").read_text())["tokenizer"]["eos_id"]
    assert all(doc[-1] == eos for doc in docs)  # each sequence ends with its EOS, as --append-eod writes


def test_nanogpt_bins_are_the_stream_read_as_train_py_does(out):
    folder = out / "export" / "nanogpt"
    meta = pickle.loads((folder / "meta.pkl").read_bytes())
    manifest = json.loads((out / "manifest.json").read_text())
    assert meta["vocab_size"] == manifest["tokenizer"]["vocab_size"] and meta["eos_id"] == manifest["tokenizer"]["eos_id"]
    for split in ("train", "val"):
        data = np.memmap(folder / f"{split}.bin", dtype=np.uint16, mode="r")  # nanoGPT's get_batch
        assert data.tolist() == [t for doc in shard_docs(out, split) for t in doc]
    data = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r")
    block = 16
    ix = np.random.default_rng(0).integers(len(data) - block, size=4)
    x = np.stack([data[i:i + block].astype(np.int64) for i in ix])
    y = np.stack([data[i + 1:i + 1 + block].astype(np.int64) for i in ix])
    assert x.shape == y.shape == (4, block) and (x[:, 1:] == y[:, :-1]).all()


def test_export_command_writes_the_same_bytes(out, tmp_path, capsys):
    for fmt, files in (("megatron", ["train_text_document.bin", "train_text_document.idx", "val_text_document.idx"]),
                       ("nanogpt", ["train.bin", "val.bin", "meta.pkl", "tokenizer.json"])):
        assert main(["export", str(out), "--format", fmt, "--output", str(tmp_path / fmt)]) == 0
        assert "MB/s" in capsys.readouterr().out
        for f in files:
            assert (tmp_path / fmt / f).read_bytes() == (out / "export" / fmt / f).read_bytes(), f


def test_hf_datasets_load_the_docs(out):
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_files=str(out / "docs" / "kept-*.parquet"), split="train")
    report = json.loads((out / "report" / "report.json").read_text())
    assert ds.num_rows == report["documents"]["kept"] and {"id", "text", "url"} <= set(ds.column_names)


def test_uint16_limits_are_one_line(out, tmp_path, capsys):
    from tokenmill.pipelines.export import write_nanogpt

    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["vocab_size"] = 70_000
    with pytest.raises(UserError, match="uint16"):
        write_nanogpt(str(out), manifest, str(tmp_path / "n"))
    assert main(["prepare", "--output", str(tmp_path / "o"), "--set", "tokenize.vocab_size=70000",
                 "--set", "shards.formats=[nanogpt]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nanogpt reads uint16" in err[0]

"""Shards other trainers read, checked by their real readers: megatron-core's IndexedDataset on
the .bin/.idx, nanoGPT's np.memmap on train.bin/val.bin (+ meta.pkl), mosaicml-streaming's
StreamingDataset on the MDS folders, and HF datasets on the docs Parquet. Each gives back exactly the Arrow shards' token stream, document boundaries
included; `shards.formats` at prepare time and `tokenmill export` write the same bytes."""

import importlib.util
import json
import pickle

import numpy as np
import pyarrow as pa
import pytest

from tokenmill.cli import main
from tokenmill.errors import UserError

# mosaicml-streaming is installed by the Makefile without its dependencies (they pull torchvision
# and a CUDA torch); a checkout without it skips the MDS checks.
MDS = importlib.util.find_spec("streaming") is not None
FORMATS = ["megatron", "nanogpt"] + (["mds"] if MDS else [])


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "out"
    assert main(["prepare", "--output", str(out), "--set", "tokenize.vocab_size=700",
                 "--set", f"shards.formats=[{', '.join(FORMATS)}]"]) == 0
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


def shard_ids(out, split) -> list[str]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [i for s in manifest["splits"][split]["shards"]
            for i in pa.ipc.open_file(pa.memory_map(str(out / s["file"]))).read_all().column("id").to_pylist()]


@pytest.mark.parametrize("split", ["train", "val"])
def test_mds_streaming_dataset_reads_every_document(out, split):
    from tokenmill.pipelines.export_formats import import_streaming

    if not MDS:
        pytest.skip("mosaicml-streaming is not installed")
    streaming = import_streaming()
    ds = streaming.StreamingDataset(local=str(out / "export" / "mds"), split=split, shuffle=False, batch_size=1)
    docs, ids = shard_docs(out, split), shard_ids(out, split)
    assert ds.num_samples == len(docs) > 0
    samples = [ds[i] for i in range(ds.num_samples)]
    assert [s["tokens"].tolist() for s in samples] == docs and [s["id"] for s in samples] == ids
    assert samples[0]["tokens"].dtype == np.uint16


def test_export_command_writes_the_same_bytes(out, tmp_path, capsys):
    for fmt, files in (("megatron", ["train_text_document.bin", "train_text_document.idx", "val_text_document.idx"]),
                       ("nanogpt", ["train.bin", "val.bin", "meta.pkl", "tokenizer.json"]),
                     ("mds", ["train/index.json", "train/shard.00000.mds", "val/shard.00000.mds"])):
        if fmt not in FORMATS:
            continue
        for _ in range(2):  # a second export into the same folder overwrites it
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
    from tokenmill.pipelines.export_formats import write_nanogpt

    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["vocab_size"] = 70_000
    with pytest.raises(UserError, match="uint16"):
        write_nanogpt(str(out), manifest, str(tmp_path / "n"))
    assert main(["prepare", "--output", str(tmp_path / "o"), "--set", "tokenize.vocab_size=70000",
                 "--set", "shards.formats=[nanogpt]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nanogpt reads uint16" in err[0]


def test_mds_without_mosaicml_streaming_is_one_line(out, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "streaming", None)  # what Python does for a package that is absent
    assert main(["export", str(out), "--format", "mds", "--output", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install mosaicml-streaming" in err[0]


def test_two_exports_into_one_folder(out, tmp_path, capsys):
    """While another export holds the target (its lock, taken in a child process that then
    waits), `export` into it is refused in one line naming that process; nothing is written.
    Once it is gone, the export goes through (the lock file is no foreign file)."""
    import subprocess
    import sys

    target = tmp_path / "nano"
    target.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from tokenmill.folders import take_lock; "
                               f"take_lock({str(target)!r}, 'export', 'export: --output', '--output'); "
                               "print('held', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["export", str(out), "--format", "nanogpt", "--output", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"is in use by another tokenmill export (pid {holder.pid})" in err, err
        assert sorted(p.name for p in target.iterdir()) == [".tokenmill.lock"]
    finally:
        holder.kill()
        holder.wait()
    assert main(["export", str(out), "--format", "nanogpt", "--output", str(target)]) == 0
    assert (target / "train.bin").stat().st_size > 0

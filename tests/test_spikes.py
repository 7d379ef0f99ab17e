"""Loss spikes traced to their documents: the ids logged for a spike are exactly the documents
its global batch was cut from (recomputed here from the shards' rows), and `tokenmill spikes`
prints them with their URL and text from OUT/docs."""

import json

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")

from tokenmill.cli import main  # noqa: E402
from tokenmill.trainer import windows as D  # noqa: E402

SEQ = 32


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("spikes")
    out, run = root / "out", root / "run"
    assert main(["prepare", "--output", str(out), "--set", "tokenize.vocab_size=600"]) == 0
    # factor just above 1: every step above the recent median counts as a spike
    assert main(["train", "--data", str(out), "--run-dir", str(run), "--set", "model.preset=null",
                 "--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.n_heads=2",
                 "--set", f"data.seq_len={SEQ}", "--set", "train.micro_batch=2", "--set", "train.grad_accum=2",
                 "--set", "train.steps=30", "--set", "train.spike_factor=1.001", "--set", "train.spike_window=4",
                 "--set", "data.num_workers=0", "--set", "export.enabled=false", "--set", "seed=3"]) == 0
    return out, run


def docs_by_hand(out, manifest, g_range, seed) -> list[str]:
    """Each shard row's token range in the stream, then the rows a window overlaps."""
    rows = []
    for f in D.split_files(str(out), manifest, "train"):
        table = pa.ipc.open_file(pa.memory_map(f)).read_all()
        rows += list(zip(table.column("id").to_pylist(), (len(t) for t in table.column("tokens").to_pylist())))
    ends = np.cumsum([n for _, n in rows])
    starts = ends - np.array([n for _, n in rows])
    stream = D.TokenStream(D.split_files(str(out), manifest, "train"), manifest["tokenizer"]["eos_id"])
    windows = D.PackedWindows([stream], SEQ, seed)
    want: list[str] = []
    for g in g_range:
        _, _, lo = windows.locate(g)
        hi = lo + SEQ + 1
        want += [rows[i][0] for i in range(len(rows)) if starts[i] < hi and ends[i] > lo and rows[i][0] not in want]
    return want


def test_spike_lists_the_documents_of_its_batch(trained):
    out, run = trained
    spikes = [json.loads(line) for line in (run / "spikes.jsonl").read_text().splitlines()]
    assert spikes, "no step exceeded its recent median?"
    manifest = json.loads((out / "manifest.json").read_text())
    losses = {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    for s in spikes:
        assert s["loss"] == losses[s["step"]] and s["loss"] > 1.001 * s["median"]
        assert s["samples"] == [s["step"] * 4 - 4, s["step"] * 4]  # global batch 2 x accum 2
        assert s["docs"] == docs_by_hand(out, manifest, range(*s["samples"]), seed=3)


def test_spikes_command_prints_urls_and_text(trained, capsys):
    out, run = trained
    assert main(["spikes", str(run), "--data", str(out), "--chars", "40"]) == 0
    printed = capsys.readouterr().out
    first = json.loads((run / "spikes.jsonl").read_text().splitlines()[0])
    assert f"step {first['step']}:" in printed and first["docs"][0] in printed
    assert "https://" in printed  # the sample's JSONL documents carry URLs


def test_no_spikes_file_when_off_and_a_missing_run_is_one_line(tmp_path, capsys):
    from tokenmill.trainer.spikes import SpikeLog

    for factor, logged in ((0, False), (1.5, True)):
        log = SpikeLog(str(tmp_path), True, factor, 10, lambda g: [f"doc{g}"], seq_len=4, global_batch=2)
        rows = [{"step": i + 1, "loss": 2.0, "tokens": 8 * (i + 1)} for i in range(10)] + \
               [{"step": 11, "loss": 9.0, "tokens": 88}]
        assert [log.check(r) is not None for r in rows] == [False] * 10 + [logged]
        assert (tmp_path / "spikes.jsonl").exists() == logged
    assert json.loads((tmp_path / "spikes.jsonl").read_text())["docs"] == ["doc20", "doc21"]

    assert main(["spikes", str(tmp_path / "nope"), "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such run folder" in err[0]

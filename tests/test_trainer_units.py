"""Trainer pieces that need no training run: LR schedule, config errors, sample order, the
loader (worker-count independence, rank slices, mixtures, per-document positions), and the
refusal of a corrupted shard. Shards are written with the pipeline's own writer."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainer_helpers import EOS, make_output  # noqa: E402

from tokenmill.cli import main  # noqa: E402
from tokenmill.data import PackedDataset, loader  # noqa: E402
from tokenmill.errors import UserError  # noqa: E402
from tokenmill.trainer import windows as D  # noqa: E402
from tokenmill.trainer.train import lr_at  # noqa: E402
from tokenmill.trainer.train_config import load_train_config  # noqa: E402


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer_units")
    return make_output(root / "a", 300, seed=1), make_output(root / "b", 200, seed=2)


def streams_of(out):
    m = D.open_output(out)
    return [D.TokenStream(D.split_files(out, m, "train"), EOS)], m


# ---------------------------------------------------------------- schedule and config


def test_lr_schedule_warmup_peak_end():
    peak, total, warm = 1e-3, 1000, 100
    assert lr_at(0, peak, total, warm) == pytest.approx(peak / 10)
    assert lr_at(50, peak, total, warm) == pytest.approx(peak / 10 + 0.5 * (peak - peak / 10))
    assert lr_at(warm, peak, total, warm) == pytest.approx(peak)
    assert lr_at(550, peak, total, warm) == pytest.approx((peak + peak / 100) / 2)  # cosine midpoint
    assert lr_at(total, peak, total, warm) == pytest.approx(peak / 100)
    lrs = [lr_at(s, peak, total, warm) for s in range(warm, total + 1)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert lr_at(0, peak, total, 0) == pytest.approx(peak)  # no warmup
    assert lr_at(total, peak, total, warm, 0.0, 0.0) == pytest.approx(0.0)  # configurable fractions


def test_config_presets_and_overrides():
    cfg = load_train_config(overrides=["model.preset=125m", "train.steps=7", "optim.lr=1e-3", "precision=bf16"],
                            data=["x"])
    assert cfg.model.dims() == {"n_layers": 12, "d_model": 768, "n_heads": 12, "n_kv_heads": 12, "ffn_hidden": 2048}
    assert (cfg.train.steps, cfg.optim.lr, cfg.precision) == (7, 1e-3, "bf16")
    dims = load_train_config(overrides=["model.preset=null", "model.n_layers=2", "model.d_model=64",
                                        "model.n_heads=4"], data=["x"]).model.dims()
    assert dims == {"n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 256}


@pytest.mark.parametrize("override, needle", [
    ("model.bogus=1", "model.bogus: unknown key"),
    ("nosuch.key=1", "nosuch: unknown key"),
    ("precision=fp8", "precision"),
    ("model.preset=7b", "model.preset"),
    ("train.steps=0", "train.steps"),
    ("checkpoint.every_minutes=-1", "checkpoint.every_minutes"),
    ("model.d_model=100", "divisible"),
])
def test_bad_config_is_one_line_exit_2(tmp_path, capsys, override, needle):
    rc = main(["train", "--data", str(tmp_path), "--run", str(tmp_path / "run"), "--set", override])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_no_data_is_a_user_error():
    with pytest.raises(UserError, match="--data"):
        load_train_config()


# ---------------------------------------------------------------- verification


def test_corrupted_shard_refused_in_one_line(outputs, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(outputs[0], bad)
    shard = bad / "shards" / "train-00001-of-00002.arrow"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    rc = main(["train", "--data", str(bad), "--run", str(tmp_path / "run"), "--set", "model.d_model=32",
               "--set", "data.seq_len=16"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "train-00001-of-00002.arrow" in err and "sha256" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "checkpoints").exists()


# ---------------------------------------------------------------- the token stream and sample order


def test_stream_is_the_concatenation_of_documents(outputs):
    import pyarrow as pa

    out = outputs[0]
    (stream,), m = streams_of(out)
    expected = []
    for path in D.split_files(out, m, "train"):
        with pa.memory_map(path) as src:
            for doc in pa.ipc.open_file(src).read_all().column("tokens").to_pylist():
                expected.extend(doc)
    assert len(stream) == len(expected) == m["splits"]["train"]["tokens"]
    buf = np.empty(len(expected), dtype=np.int64)
    stream.read(0, buf)
    assert buf.tolist() == expected
    piece = np.empty(777, dtype=np.int64)  # a read across record batches and shard files
    stream.read(1234, piece)
    assert piece.tolist() == expected[1234:1234 + 777]


def test_sample_order_is_a_pure_function_and_a_permutation_per_epoch(outputs):
    streams, _ = streams_of(outputs[0])
    ds = D.PackedWindows(streams, seq_len=32, seed=5)
    W = ds.windows[0]
    first = [ds.locate(g) for g in range(3 * W)]
    again = D.PackedWindows(streams, seq_len=32, seed=5)
    assert [again.locate(g) for g in reversed(range(3 * W))][::-1] == first  # no hidden iteration state
    for epoch in range(3):
        wins = [start for _, e, start in first[epoch * W:(epoch + 1) * W]]
        assert sorted(wins) == [w * 32 for w in range(W)] and {e for _, e, _ in first[epoch * W:(epoch + 1) * W]} == {epoch}
    assert [w for *_, w in first[:W]] != [w for *_, w in first[W:2 * W]]  # reshuffled each epoch
    other = D.PackedWindows(streams, seq_len=32, seed=6)
    assert [other.locate(g) for g in range(W)] != first[:W]
    tokens = ds.__getitems__([7])["tokens"][0].numpy()
    _, _, start = ds.locate(7)
    ref = np.empty(33, dtype=np.int64)
    streams[0].read(start, ref)
    assert tokens.tolist() == ref.tolist()


def _batches(ds, workers, n, first=0, mb=3, rank=0, world=1):
    """The trainer's loader: this rank's micro-batches in order."""
    stream = PackedDataset(None, 32, seed=ds.seed, rank=rank, world=world, batch_size=mb, first_sample=first,
                           windows=ds)
    it = iter(loader(stream, workers, 2, pin_memory=False))
    return [next(it)["tokens"] for _ in range(n)]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_loader_order_does_not_depend_on_workers(outputs):
    streams, _ = streams_of(outputs[0])
    ds = D.PackedWindows(streams, seq_len=32, seed=3)
    b0, b2, b3 = (_batches(ds, w, 12, first=40) for w in (0, 2, 3))
    assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(b0, b2, b3))
    # The same global samples, whatever the number of ranks: two ranks together see exactly
    # the windows one rank sees in two micro-batches (same global batch of 6).
    one = torch.cat(b0[:2])
    r0 = _batches(ds, 0, 1, first=40, rank=0, world=2)[0]
    r1 = _batches(ds, 2, 1, first=40, rank=1, world=2)[0]
    assert torch.equal(torch.cat([r0, r1]), one)


def test_resume_position_is_an_integer(outputs):
    streams, _ = streams_of(outputs[0])
    ds = D.PackedWindows(streams, seq_len=32, seed=3)
    full = _batches(ds, 0, 10, mb=2)
    resumed = _batches(ds, 0, 4, first=2 * 6, mb=2)  # 6 steps of 2 samples consumed
    assert all(torch.equal(a, b) for a, b in zip(full[6:], resumed))


def test_mixture_weights_are_honoured(outputs):
    sa, _ = streams_of(outputs[0])
    sb, _ = streams_of(outputs[1])
    ds = D.PackedWindows(sa + sb, seq_len=16, seed=0, weights=[3, 1])
    sources = [ds.locate(g)[0] for g in range(2 * D.MIX_BLOCK)]
    assert sources.count(0) == int(1.5 * D.MIX_BLOCK) and sources.count(1) == D.MIX_BLOCK // 2
    assert sources[:D.MIX_BLOCK] == sources[D.MIX_BLOCK:]  # the same seeded pattern in every block
    assert 0.6 < sources[:400].count(0) / 400 < 0.9  # interleaved, not in runs
    # every source still walks through all its windows once per epoch
    wins_b = [w for k, e, w in (ds.locate(g) for g in range(4 * D.MIX_BLOCK)) if k == 1 and e == 0]
    assert sorted(wins_b) == [w * 16 for w in range(ds.windows[1])]


def test_different_tokenizers_cannot_be_mixed(outputs, tmp_path):
    import json

    m0 = json.load(open(os.path.join(outputs[0], "manifest.json")))
    m1 = json.load(open(os.path.join(outputs[1], "manifest.json")))
    m1["tokenizer"]["sha256"] = "0" * 64
    with pytest.raises(UserError, match="different tokenizer"):
        D.check_compatible([m0, m1], list(outputs))


def test_document_positions_restart_after_eos():
    x = np.array([[5, 6, EOS, 7, 8, EOS, EOS, 9]])
    pos, docs = D.document_positions(x, EOS)
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2, 0, 0]]
    assert docs.tolist() == [[0, 0, 0, 1, 1, 1, 2, 3]]


def test_doc_mask_blocks_attention_across_documents():
    from tokenmill.trainer.model import ModelArgs, Transformer

    torch.manual_seed(0)
    a = ModelArgs(vocab_size=50, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=16)
    m = Transformer(a).eval()
    x = torch.tensor([[3, 4, 5, EOS, 6, 7, 8, 9]])
    pos, docs = (torch.from_numpy(t) for t in D.document_positions(x.numpy(), EOS))
    with torch.no_grad():
        joined = m(x, pos, docs)
        second = m(x[:, 4:])  # the second document alone
    assert torch.allclose(joined[:, 4:], second, atol=1e-5)


def test_val_batches_same_windows_for_any_world_size(outputs):
    (stream,), m = streams_of(outputs[0])
    out = outputs[0]
    val = [D.TokenStream(D.split_files(out, m, "val"), EOS)]

    def rows(world):
        got = []
        for r in range(world):
            for batch, w in D.val_batches(val, 16, 10, 3, r, world):
                got += [tuple(t.tolist()) for t, keep in zip(batch["tokens"], w) if keep]
        return sorted(got)

    assert len(rows(1)) == 10 and rows(1) == rows(2) == rows(3)
    counts = {len(D.val_batches(val, 16, 10, 3, r, 3)) for r in range(3)}
    assert len(counts) == 1  # every rank runs the same number of forwards


def test_weights_do_not_depend_on_sharding_or_wrappers():
    """The same initial weights unsharded, through FSDP2 and with activation checkpointing:
    init is a function of (seed, parameter name), never of the world size or the wrappers."""
    from tokenmill.trainer.model import ModelArgs, Transformer
    from tokenmill.trainer.parallel import close_distributed, init_distributed, parallelize
    from tokenmill.trainer.train_config import load_train_config

    a = ModelArgs(vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=16)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    d = init_distributed()
    try:
        outs = []
        for sets in ([], ["parallel.shard_single_rank=true"],
                     ["parallel.shard_single_rank=true", "parallel.activation_checkpointing=1"]):
            cfg = load_train_config(overrides=sets, data=["x"])
            m = parallelize(lambda: Transformer(a), cfg, d, "fp32")
            with torch.no_grad():
                outs.append(m(x))
        assert all(torch.equal(outs[0], o) for o in outs[1:])
    finally:
        close_distributed()


def test_non_finite_steps_are_skipped_then_stop_with_one_line(outputs, tmp_path, capsys):
    import json

    run = tmp_path / "run"
    rc = main(["train", "--data", outputs[0], "--run", str(run), "--set", "model.preset=null",
               "--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.n_heads=2",
               "--set", "data.seq_len=16", "--set", "train.micro_batch=2", "--set", "train.steps=50",
               "--set", "optim.lr=1e9", "--set", "optim.warmup_steps=0", "--set", "train.max_bad_steps=3",
               "--set", "data.num_workers=0", "--set", "metrics.tensorboard=false"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert rc == 2 and last.startswith("tokenmill: error: 3 steps in a row had a non-finite loss"), err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["skipped"] is False and all(r["skipped"] and r["loss"] is None for r in rows[-3:])


def test_wall_clock_checkpoints_keep_the_newest(outputs, tmp_path):
    import json

    run = tmp_path / "run"
    rc = main(["train", "--data", outputs[0], "--run", str(run), "--set", "model.preset=null",
               "--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.n_heads=2",
               "--set", "data.seq_len=16", "--set", "train.micro_batch=2", "--set", "train.steps=5",
               "--set", "checkpoint.every=0", "--set", "checkpoint.every_minutes=1e-6", "--set", "checkpoint.keep=2",
               "--set", "eval.every=0", "--set", "data.num_workers=0", "--set", "export.enabled=false"])
    assert rc == 0
    names = sorted(os.listdir(run / "checkpoints"))
    assert names == ["best", "step-00000004", "step-00000005"]  # a save after every step, 2 kept
    assert json.loads((run / "checkpoints" / "step-00000004" / "trainer.json").read_text())["samples"] == 8


def test_resuming_another_model_shape_is_refused(outputs, tmp_path, capsys):
    base = ["train", "--data", outputs[0], "--run", str(tmp_path / "run"), "--set", "model.preset=null",
            "--set", "model.n_layers=1", "--set", "model.n_heads=2", "--set", "data.seq_len=16",
            "--set", "train.steps=1", "--set", "data.num_workers=0", "--set", "export.enabled=false"]
    assert main(base + ["--set", "model.d_model=32"]) == 0
    capsys.readouterr()
    assert main(base + ["--set", "model.d_model=64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another model shape" in err[0] and "d_model 32 -> 64" in err[0]


@pytest.mark.parametrize("name, precision, expected", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
    ("NVIDIA H100 NVL", "bf16", 835e12),
    ("NVIDIA H100 PCIe", "bf16", 756e12),
    ("NVIDIA H200", "bf16", 989e12),
    ("NVIDIA H200 NVL", "bf16", 835e12),
    ("NVIDIA GH200 480GB", "bf16", 989e12),
    ("NVIDIA H20", "bf16", 148e12),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
    ("NVIDIA L40S", "fp16", 362e12),
    ("NVIDIA L40", "bf16", 181e12),
    ("Some Future GPU", "bf16", None),
])
def test_peak_flops_by_device_name(name, precision, expected):
    from tokenmill.trainer.metrics import peak_flops_for

    assert peak_flops_for(name, precision) == expected


def test_gqa_attention_matches_repeated_kv_heads():
    """SDPA's enable_gqa shares each K/V head across its query group without copying K and V:
    the same output as repeating the heads, with the causal path and with a document mask."""
    import torch.nn.functional as F

    from tokenmill.trainer.model import Attention, ModelArgs

    torch.manual_seed(0)
    a = ModelArgs(vocab_size=50, n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=8)
    attn, x = Attention(a), torch.randn(2, 8, 32)
    cos, sin = torch.ones(8, a.head_dim), torch.zeros(8, a.head_dim)  # no rotation: compare attention alone
    doc = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1]])
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    mask = ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]
    q = attn.q_proj(x).view(2, 8, 4, 8).transpose(1, 2)
    k = attn.k_proj(x).view(2, 8, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
    v = attn.v_proj(x).view(2, 8, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
    for m, kw in ((None, {"is_causal": True}), (mask, {"attn_mask": mask})):
        want = attn.o_proj(F.scaled_dot_product_attention(q, k, v, **kw).transpose(1, 2).reshape(2, 8, 32))
        torch.testing.assert_close(attn(x, cos, sin, m), want)


def test_eval_row_loss_equals_the_transposed_form():
    import torch.nn.functional as F

    from tokenmill.trainer.evaluation import token_nll

    logits, targets = torch.randn(3, 7, 11), torch.randint(0, 11, (3, 7))
    want = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").sum(1)
    torch.testing.assert_close(token_nll(logits, targets).sum(1), want)

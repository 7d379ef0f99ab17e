"""The loop's GPU-facing behaviour, checked on CPU: no host-device sync between log steps,
non-finite steps skipped on the device, the FSDP2 groups, the mixed-precision choice,
initial weights under CPU offload, sharded checksum verification, async and final saves,
per-preset learning rates, and the memory figures and end-of-run summary."""

import gc
import json
import math

import pytest

torch = pytest.importorskip("torch")

from trainer_helpers import make_output  # noqa: E402

from tokenmill.cli import main  # noqa: E402
from tokenmill.trainer.train_config import load_train_config  # noqa: E402

SMALL = ["--set", "model.preset=null", "--set", "model.n_layers=1", "--set", "model.d_model=32",
         "--set", "model.n_heads=2", "--set", "data.seq_len=16", "--set", "train.micro_batch=2",
         "--set", "data.num_workers=0", "--set", "metrics.tensorboard=false", "--set", "export.enabled=false"]


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    return make_output(tmp_path_factory.mktemp("loop") / "out", 300, seed=3)


def train(output, run, *sets: str) -> int:
    return main(["train", "--data", output, "--run-dir", str(run), *SMALL, *(a for s in sets for a in ("--set", s))])


def rows_of(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- host syncs


SYNCING = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu")


def count_syncs(monkeypatch) -> dict:
    """Counts the Tensor calls that make the host wait for a GPU (on CPU they are merely calls)."""
    calls = {"n": 0}
    for name in SYNCING:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **k):
            calls["n"] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.slow
def test_no_host_sync_between_log_steps(output, tmp_path, monkeypatch, precision):
    """Steps between log steps read nothing back from the device: 6 and 18 steps logged once
    cost the same syncs; each extra log step costs exactly one (PendingSteps.flush)."""
    calls = count_syncs(monkeypatch)
    counts = {}
    for steps, log_every in ((6, 100), (18, 100), (18, 6)):
        calls["n"] = 0
        assert train(output, tmp_path / f"r{steps}-{log_every}", f"train.steps={steps}", f"precision={precision}",
                     f"train.log_every={log_every}", "checkpoint.every=0", "eval.every=0") == 0
        counts[steps, log_every] = calls["n"]
    assert counts[18, 100] == counts[6, 100], counts
    assert counts[18, 6] == counts[18, 100] + 2, counts  # flushes at steps 6 and 12; 18 is the last step anyway


def test_step_unless_skips_on_the_device():
    from tokenmill.trainer.train import step_unless

    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    p.grad = torch.ones(4)
    step_unless(opt, torch.tensor(True))
    assert torch.equal(p.detach(), torch.ones(4)) and opt.state[p]["step"].item() == 0
    assert not hasattr(opt, "found_inf")
    step_unless(opt, torch.tensor(False))
    assert (p.detach() < 1).all() and opt.state[p]["step"].item() == 1


def test_pending_steps_read_back_in_one_transfer(monkeypatch):
    from tokenmill.trainer.metrics import PendingSteps

    calls = count_syncs(monkeypatch)
    pending = PendingSteps(global_tokens=10)
    for step, (loss, gnorm) in enumerate([(20.0, 1.0), (float("nan"), 2.0), (30.0, float("inf"))], 1):
        pending.add({"step": step, "wait": 0.0}, torch.tensor(loss, dtype=torch.float64), torch.tensor(gnorm))
    assert calls["n"] == 0
    rows = pending.flush()
    assert calls["n"] == 1
    assert [r["skipped"] for r in rows] == [False, True, True]
    assert rows[0]["loss"] == 2.0 and rows[0]["grad_norm"] == 1.0 and math.isnan(rows[1]["loss"])
    assert all(r["tokens_per_s"] > 0 and "wait" not in r for r in rows) and pending.flush() == []


# ---------------------------------------------------------------- parallelism and precision


def test_fsdp_groups_embedding_blocks_and_head():
    """Embedding, each block and [norm, lm_head] are FSDP groups of their own; the head group
    stays gathered after forward (backward needs it first), the blocks are resharded."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from tokenmill.trainer.model import ModelArgs, Transformer
    from tokenmill.trainer.parallel import apply_fsdp, close_distributed, init_distributed, mixed_precision

    a = ModelArgs(vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=16)
    d = init_distributed()
    try:
        torch.manual_seed(0)
        m = Transformer(a)
        apply_fsdp(m, d.mesh, mixed_precision("fp32", d.device), cpu_offload=False, reshard_after_forward=True)
        assert all(isinstance(x, FSDPModule) for x in (m.embed_tokens, m.norm, m.lm_head, *m.layers, m))
        assert m._get_fsdp_state()._fsdp_param_group is None  # the root holds no weights
        m(torch.randint(0, 64, (2, 16)))
        assert not isinstance(m.lm_head.weight, DTensor) and not isinstance(m.norm.weight, DTensor)
        assert isinstance(m.layers[0].mlp.up_proj.weight, DTensor)
        assert isinstance(m.embed_tokens.weight, DTensor)
    finally:
        close_distributed()


def test_mixed_precision_is_fsdps_on_gpu_and_autocast_on_cpu():
    from tokenmill.trainer.parallel import mixed_precision
    from tokenmill.trainer.train import autocast

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for precision, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        p = mixed_precision(precision, cuda)
        assert (p.param_dtype, p.reduce_dtype, p.cast_forward_inputs) == (dtype, torch.float32, False)
        assert not isinstance(autocast(precision, cuda), torch.autocast)  # no autocast cache of full weights
        assert isinstance(autocast(precision, cpu), torch.autocast)
        assert mixed_precision(precision, cpu).param_dtype is None
    assert mixed_precision("fp32", cuda).param_dtype is None


def test_auto_precision_skips_emulated_bf16(monkeypatch):
    from tokenmill.trainer.train import resolve_precision

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert resolve_precision("auto", cuda) == "fp32"  # a V100/T4: bf16 only emulated
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_precision("auto", cuda) == "bf16"
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"


def test_initial_weights_with_and_without_offload():
    """One seed, the same weights whether the shards live on the device or (offload) on the
    CPU: values are drawn on the compute device. (On a CPU-only machine both are the CPU; the
    GPU check runs the offload case for real.)"""
    from tokenmill.trainer.model import ModelArgs, Transformer
    from tokenmill.trainer.parallel import (
        apply_fsdp,
        close_distributed,
        init_distributed,
        materialise,
        mixed_precision,
    )

    a = ModelArgs(vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=16)
    d = init_distributed()
    try:
        weights = []
        for offload in (False, True):
            with torch.device("meta"):
                m = Transformer(a)
            apply_fsdp(m, d.mesh, mixed_precision("fp32", d.device), cpu_offload=offload, reshard_after_forward=True)
            materialise(m, d.device, seed=7, cpu_offload=offload)
            weights.append({k: v.full_tensor().clone() for k, v in m.state_dict().items()})
        assert weights[0].keys() == weights[1].keys()
        assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    finally:
        close_distributed()


# ---------------------------------------------------------------- data, checkpoints, config


def test_checksums_are_split_across_ranks(output, tmp_path):
    """Each rank hashes its own slice: together every shard once; a corrupt shard is found by
    the one rank that owns it."""
    import shutil

    from tokenmill.format import load_manifest, verify_output

    out = str(tmp_path / "out")
    shutil.copytree(output, out)
    manifest = load_manifest(out)
    shards = [s["file"] for info in manifest["splits"].values() for s in info["shards"]]
    assert len(shards) == 3
    with open(f"{out}/{shards[1]}", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff\xfe")
    found = [verify_output(out, manifest, (r, 2)) for r in range(2)]
    assert found[0] == [] and len(found[1]) == 1 and shards[1] in found[1][0]
    assert verify_output(out, manifest) == found[1]


def test_async_saves_equal_sync_saves(output, tmp_path):
    """checkpoint.async=true writes the same checkpoints (weights, optimizer, trainer.json),
    and a resumed run goes on from them exactly."""
    for mode in ("sync", "async"):
        assert train(output, tmp_path / mode, "train.steps=6", "checkpoint.every=2", "checkpoint.keep=2",
                     f"checkpoint.async={mode == 'async'}", "precision=fp32") == 0
    ck = {m: sorted(p.name for p in (tmp_path / m / "checkpoints").iterdir()) for m in ("sync", "async")}
    assert ck["sync"] == ck["async"] == ["best", "step-00000004", "step-00000006"]
    for name in ("step-00000004", "step-00000006"):
        a, b = (tmp_path / m / "checkpoints" / name for m in ("sync", "async"))
        assert json.loads((a / "trainer.json").read_text()) == json.loads((b / "trainer.json").read_text())
        assert _keys(a) == _keys(b) and any("optim" in k for k in _keys(a))
    assert [r["loss"] for r in rows_of(tmp_path / "sync")] == [r["loss"] for r in rows_of(tmp_path / "async")]
    assert train(output, tmp_path / "async", "train.steps=8", "checkpoint.every=2", "checkpoint.async=true",
                 "precision=fp32") == 0
    assert train(output, tmp_path / "sync", "train.steps=8", "checkpoint.every=2", "precision=fp32") == 0
    assert [r["loss"] for r in rows_of(tmp_path / "sync")] == [r["loss"] for r in rows_of(tmp_path / "async")]


@pytest.mark.parametrize("sets, expected", [
    (["checkpoint.every=0"], ["step-00000003"]),
    (["checkpoint.every=0", "checkpoint.final=none"], []),
    (["checkpoint.every=100", "checkpoint.final=model"], ["final"]),
    (["checkpoint.every=1", "checkpoint.final=none", "checkpoint.keep=1"], ["step-00000003"]),
])
def test_final_save_is_optional(output, tmp_path, sets, expected):
    run = tmp_path / "run"
    assert train(output, run, "train.steps=3", "checkpoint.best=false", *sets) == 0
    root = run / "checkpoints"
    assert (sorted(p.name for p in root.iterdir()) if root.exists() else []) == expected
    if expected == ["final"]:  # weights only: no optimizer state to resume from
        assert (root / "final" / "COMPLETE").exists() and not any("optim" in k for k in _keys(root / "final"))


def _keys(path) -> list[str]:
    import torch.distributed.checkpoint as dcp

    return sorted(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def test_learning_rate_defaults_per_preset():
    lr = {p: load_train_config(overrides=[f"model.preset={p}"], data=["x"]).lr() for p in ("tiny", "125m", "350m", "1b")}
    assert lr == {"tiny": 3e-3, "125m": 6e-4, "350m": 3e-4, "1b": 2e-4}
    assert load_train_config(overrides=["model.preset=1b", "optim.lr=1e-3"], data=["x"]).lr() == 1e-3
    assert load_train_config(overrides=["model.preset=null", "model.n_layers=2", "model.d_model=64",
                                        "model.n_heads=4"], data=["x"]).lr() == 3e-4


def test_run_rows_memory_summary_and_gc(output, tmp_path, capsys):
    from tokenmill.trainer.metrics import run_summary

    assert gc.isenabled()
    assert train(output, tmp_path / "run", "train.steps=10", "train.log_every=5", "parallel.gc_every=3") == 0
    assert gc.isenabled()  # given back to Python after the run
    err = capsys.readouterr().err
    assert "summary: throughput" in err and "summary: not measured from one rank" in err
    rows = rows_of(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 11)) and all(r["peak_mem_mb"] > 0 for r in rows)
    gpu = {"step": 10, "tokens_per_s": 1e5, "mfu": 0.41, "data_wait_pct": 9.0, "max_reserved_gib": 70.0,
           "max_reserved_pct": 50.0, "alloc_retries": 3, "ooms": 0, "peak_mem_mb": 1}
    lines = run_summary([gpu] * 10, torch.device("cuda"), 8)
    assert any(line.startswith("MFU 41.0%") for line in lines)
    assert any("raise data.num_workers" in line for line in lines)
    assert any("50% of the device" in line and "3 allocator retries" in line for line in lines)


def test_fp16_every_rank_takes_the_global_overflow_verdict():
    """GradScaler sees only this rank's gradient shards: the loop overrides its per-device
    found_inf with the verdict all ranks share, so a step is skipped (and the scale backs off)
    everywhere or nowhere."""
    from tokenmill.trainer.train import agree_found_inf

    for finite, stepped in ((False, False), (True, True)):
        p = torch.nn.Parameter(torch.ones(4))
        opt = torch.optim.AdamW([p], lr=0.1, fused=True)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaler.scale(torch.ones(()))  # the scaler starts its scale on first use
        p.grad = torch.full((4,), 1024.0)  # finite on this rank
        scaler.unscale_(opt)
        agree_found_inf(scaler, opt, torch.tensor(finite))
        scaler.step(opt)
        scaler.update()
        assert (not torch.equal(p.detach(), torch.ones(4))) == stepped
        assert scaler.get_scale() == (1024.0 if finite else 512.0)

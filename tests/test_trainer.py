"""End-to-end trainer runs on real shards from `tokenmill prepare`, as a user starts them:
the `tokenmill train` command, alone and under torchrun (2 CPU ranks, gloo). No mocks.

One uninterrupted 1-rank run is the reference for: loss falls, 2 ranks == 1 rank at the same
global batch, resume after SIGKILL == uninterrupted, HF export logits.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # torchrun and multi-process training runs

from conftest import sigterm_group_after_steps  # noqa: E402

from tokenmill.cli import main  # noqa: E402

TOKENMILL = str(Path(sys.executable).parent / "tokenmill")
STEPS = 60
# A tiny Llama (2 x 64) on seq 64; global batch 8 windows: 1 rank x 4 x accum 2 (the reference)
# or 2 ranks x 4 x accum 1.
COMMON = ["--set", "model.preset=null", "--set", "model.n_layers=2", "--set", "model.d_model=64",
          "--set", "model.n_heads=4", "--set", "data.seq_len=64", "--set", f"train.steps={STEPS}",
          "--set", "train.micro_batch=4", "--set", "checkpoint.every=10", "--set", "eval.every=20",
          "--set", "optim.lr=5e-3", "--set", "data.num_workers=1", "--set", "precision=fp32"]


def child_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def train_cmd(data: Path, run: Path, accum: int = 2, extra: tuple = ()) -> list[str]:
    return [TOKENMILL, "train", "--data", str(data), "--run-dir", str(run), *COMMON,
            "--set", f"train.grad_accum={accum}", *extra]


def torchrun_cmd(n: int, cmd: list[str]) -> list[str]:
    # As users type it: no "--" before the command (tokenmill's --run-dir is not torchrun's).
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
            "--no-python", *cmd]


def run_ok(cmd: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("trainer") / "out"
    assert main(["prepare", "--output", str(out), "--set", "tokenize.vocab_size=2000"]) == 0
    return out


@pytest.fixture(scope="module")
def reference(prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("ref") / "run"
    p = run_ok(train_cmd(prepared, run))
    return run, p


def test_reference_run_layout_and_loss_falls(reference):
    run, p = reference
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "data_wait_pct", "peak_mem_mb"):
        assert key in rows[0]
    first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-10:]) / 10
    assert first == pytest.approx(7.6, abs=0.2)  # ~ln(2000): an untrained model
    assert last < first - 0.7, (first, last)
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(vals) == 3 and vals[-1] < vals[0]
    ckpts = sorted(os.listdir(run / "checkpoints"))
    assert ckpts == ["best", "step-00000040", "step-00000050", "step-00000060"]  # keep=3, plus best/
    state = json.loads((run / "checkpoints" / "step-00000060" / "trainer.json").read_text())
    assert state["step"] == STEPS and state["samples"] == STEPS * 8 and state["best_val"] == pytest.approx(min(vals))
    assert (run / "checkpoints" / "step-00000060" / "COMPLETE").exists()
    assert (run / "tb").is_dir() and any(f.startswith("events.") for f in os.listdir(run / "tb"))
    assert "step 60/60" in p.stderr and "tok/s" in p.stderr


def test_two_ranks_equal_one_rank_at_the_same_global_batch(prepared, reference, tmp_path):
    run = tmp_path / "run2"  # with background saves: the reference saves synchronously
    p = run_ok(torchrun_cmd(2, train_cmd(prepared, run, accum=1, extra=("--set", "checkpoint.async=true"))))
    assert "2 rank(s)" in p.stderr
    ref, two = metrics(reference[0]), metrics(run)
    assert len(two) == STEPS
    # The first steps agree to float32 rounding (loss to the last bit, gradient norm to ~3e-6):
    # a rank reading other data, or a gradient missing or counted twice, shows at step 1 by 0.1
    # or more. Later the two runs drift apart as any two float32 trainings whose sums are taken
    # in another order do: measured, the loss by 1e-5 at step 15, 1e-3 by step 30 and 2e-2
    # by step 60 at this learning rate, where gradient-norm spikes come at different steps; on
    # another machine's CPU kernels, 6.3e-2 at step 49 (the same on the commit before).
    for a, b in zip(ref, two):
        if a["step"] <= 10:
            assert abs(a["loss"] - b["loss"]) < 1e-5, (a["step"], a["loss"], b["loss"])
            assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * max(1.0, a["grad_norm"]), (
                a["step"], a["grad_norm"], b["grad_norm"])
        else:
            assert abs(a["loss"] - b["loss"]) < 0.1, (a["step"], a["loss"], b["loss"])
        if "val_loss" in a:
            assert abs(a["val_loss"] - b["val_loss"]) < 0.05
    # sharded: each of the 2 ranks wrote its own shard file of the checkpoint
    files = os.listdir(run / "checkpoints" / "step-00000060")
    assert sorted(f for f in files if f.endswith(".distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def test_resume_after_sigkill_equals_uninterrupted(prepared, reference, tmp_path):
    run = tmp_path / "run"
    cmd = train_cmd(prepared, run)
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = run / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 25:  # past the step-20 checkpoint
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert len(log.read_text().splitlines()) < STEPS, "the run finished before it could be killed"
    # What a kill in the middle of a save leaves behind: a temp folder, and (from any other
    # crash) a step folder without the COMPLETE marker. Neither may be picked up.
    ck = run / "checkpoints"
    (ck / ".tmp-step-00000099").mkdir()
    (ck / ".tmp-step-00000099" / "__0_0.distcp").write_bytes(b"half written")
    (ck / "step-00000098").mkdir()
    newest = max(int(n.split("-")[1]) for n in os.listdir(ck) if n.startswith("step-") and (ck / n / "COMPLETE").exists())
    assert newest in (20, 30, 40, 50)

    p = run_ok(cmd)  # the same command again
    assert f"resumed from {ck / f'step-{newest:08d}'}" in p.stderr
    assert not (ck / ".tmp-step-00000099").exists()
    ref, resumed = metrics(reference[0]), metrics(run)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))  # lines past the checkpoint replaced
    for a, b in zip(ref, resumed):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6), a["step"]
        assert a.get("val_loss") == pytest.approx(b.get("val_loss"), abs=1e-6)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_hf_export_loads_in_transformers_with_the_same_logits(reference):
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers")
    import torch.distributed.checkpoint as dcp

    from tokenmill.trainer.hf_export import load_exported
    from tokenmill.trainer.model import Transformer

    run, _ = reference
    hf_dir = run / "hf"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(hf_dir))
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    ids = torch.tensor([tok.encode("The council approved new bike lanes on the bridge. Cafés in Lisbon")])
    assert tok.eos_token_id == json.loads((hf_dir / "config.json").read_text())["eos_token_id"]

    # tokenmill's model with the weights of the final sharded checkpoint (not the export)
    ours = load_exported(str(hf_dir))
    trained = Transformer(ours.args)
    sd = {"model": trained.state_dict()}
    dcp.load(sd, checkpoint_id=str(run / "checkpoints" / "step-00000060"), no_dist=True)
    trained.load_state_dict(sd["model"])
    with torch.no_grad():
        want = trained.eval()(ids)
        assert torch.allclose(ours(ids), want, atol=1e-6)
        assert torch.allclose(hf(ids).logits, want, atol=1e-5), (hf(ids).logits - want).abs().max()


def test_rerun_of_a_finished_run_trains_nothing(prepared, reference, tmp_path):
    run = tmp_path / "done"
    shutil.copytree(reference[0], run)
    before = (run / "metrics.jsonl").read_text()
    p = run_ok(train_cmd(prepared, run))
    assert "already trained to step 60" in p.stderr and (run / "metrics.jsonl").read_text() == before


def test_resume_on_another_world_size(prepared, reference, tmp_path):
    """A 1-rank checkpoint continues on 2 ranks (DCP reshards on load), same global batch."""
    run = tmp_path / "grow"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference[0] / "checkpoints" / "step-00000050", run / "checkpoints" / "step-00000050")
    shutil.copy(reference[0] / "model.json", run / "model.json")
    p = run_ok(torchrun_cmd(2, train_cmd(prepared, run, accum=1)))
    assert "resumed from" in p.stderr and "2 rank(s)" in p.stderr
    ref = {r["step"]: r["loss"] for r in metrics(reference[0])}
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(51, STEPS + 1))
    assert all(abs(r["loss"] - ref[r["step"]]) < 1e-4 for r in rows)


def test_fp16_run_resumes_with_its_grad_scaler(prepared, tmp_path):
    """fp16 keeps a GradScaler: its state (scale, growth tracker) is in the checkpoint, and a
    longer rerun of the same command goes on from it (a fresh scaler used to crash on update)."""
    run = tmp_path / "fp16"
    short = ("--set", "train.steps=3", "--set", "precision=fp16", "--set", "checkpoint.every=0")
    run_ok(train_cmd(prepared, run, accum=1, extra=short))
    saved = json.loads((run / "checkpoints" / "step-00000003" / "trainer.json").read_text())["scaler"]
    assert saved["scale"] > 0 and "_growth_tracker" in saved
    p = run_ok(train_cmd(prepared, run, accum=1, extra=(*short[:-2], "--set", "train.steps=5")))
    assert "resumed from" in p.stderr and [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5]


FAULT = """
import os, sys
import torch
from tokenmill.trainer import train as T
real, calls = T.loss_sum, [0]
def loss_sum(*a, **k):  # rank 1 runs out of memory in its 3rd micro-step
    calls[0] += 1
    if os.environ["RANK"] == "1" and calls[0] == 3:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return real(*a, **k)
T.loss_sum = loss_sum
from tokenmill.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_error_on_another_rank_is_said_and_ends_the_job(prepared, tmp_path):
    """An OOM on rank 1 only: rank 1 prints its own line, rank 0 stops at once with its own
    line (not silence, not a hang until torchrun's grace period), and no traceback of ours."""
    script = tmp_path / "oom_on_rank1.py"
    script.write_text(FAULT)
    # Rank 0's line needs gloo to see the dead peer before torchrun ends rank 0: it was missing
    # once in a whole-suite CI run (0 of 18 runs of this test alone, idle or loaded), so a
    # second try; both tries fail with rank 0's whole output.
    for attempt in (1, 2):
        cmd = train_cmd(prepared, tmp_path / f"run{attempt}", accum=1)
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            str(script), *cmd[1:]], env=child_env(), capture_output=True, text=True, timeout=120)
        took = time.monotonic() - t0
        ours = [line for line in p.stderr.splitlines() if line.startswith("tokenmill: error:")]
        assert p.returncode != 0 and took < 60, (took, p.stderr[-3000:])
        assert any(line.startswith("tokenmill: error: rank 1: CUDA out of memory at step 3") for line in ours), ours
        if any(line.startswith("tokenmill: error: rank 0: lost contact with the other ranks") for line in ours):
            break
        assert attempt == 1, (ours, p.stderr[-6000:])
    assert "[rank0]: Traceback" not in p.stderr and "[rank1]: Traceback" not in p.stderr


def test_sigterm_to_the_process_group_under_torchrun_saves_and_stops(prepared, tmp_path):
    """`timeout`, `scancel` and Kubernetes signal the whole process group. torchrun starts each
    rank in a session of its own, so the ranks get the signal once, from torchrun, and save the
    checkpoint of the step (their loader workers ignore SIGTERM: tokenmill.data)."""

    run = tmp_path / "run"
    cmd = torchrun_cmd(2, train_cmd(prepared, run, accum=1, extra=("--set", "train.steps=100000",
                                                                   "--set", "checkpoint.every=0")))
    _, err = sigterm_group_after_steps(cmd, run, env=child_env())
    # torchrun itself ends with its own SignalException traceback; no frame of tokenmill's.
    assert "second SIGTERM" not in err and "tokenmill/" not in err, err[-3000:]
    assert "stopped by SIGTERM" in err and list(run.glob("checkpoints/step-*/COMPLETE")), err[-3000:]

"""The trainer and `tokenmill inspect` on dirty inputs ("Real crawls are dirty"): every mistake a
user can make ends as one line `tokenmill: error: ...` (exit 2), no traceback. Inputs are built
here with the pipeline's own shard writer (test_trainer_units.make_output) and real tokenizers."""

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rich.console import Console  # noqa: E402
from test_trainer import TOKENMILL, child_env  # noqa: E402
from test_trainer_units import EOS, make_output  # noqa: E402

from tokenmill.cli import main  # noqa: E402
from tokenmill.errors import UserError  # noqa: E402
from tokenmill.pipelines.inspect_output import inspect_output  # noqa: E402
from tokenmill.trainer import windows as D  # noqa: E402
from tokenmill.trainer.metrics import available_memory  # noqa: E402
from tokenmill.trainer.preflight import cpu_memory_needed  # noqa: E402
from tokenmill.trainer.train import model_args  # noqa: E402
from tokenmill.trainer.train_config import load_train_config  # noqa: E402

VOCAB = 500
TINY = ["--set", "model.preset=null", "--set", "model.n_layers=1", "--set", "model.d_model=32",
        "--set", "model.n_heads=2", "--set", "data.seq_len=16", "--set", "train.micro_batch=2",
        "--set", "data.num_workers=0", "--set", "export.enabled=false", "--set", "metrics.tensorboard=false"]


def with_tokenizer(out: str, prefix: str) -> str:
    """Give a make_output folder a real tokenizer (a word-level vocab of VOCAB entries named
    ``prefix0..``, EOS at id 0) and record it in the manifest as prepare would: sha256 and vocab."""
    from tokenizers import Tokenizer, models

    vocab = {"<|endoftext|>": EOS, **{f"{prefix}{i}": i for i in range(1, VOCAB - 1)}, "[UNK]": VOCAB - 1}
    path = os.path.join(out, "tokenizer.json")
    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(path)
    manifest = json.loads(Path(out, "manifest.json").read_text())
    manifest["tokenizer"].update(sha256=hashlib.sha256(Path(path).read_bytes()).hexdigest(), vocab_size=VOCAB)
    Path(out, "manifest.json").write_text(json.dumps(manifest))
    return out


def edit_manifest(out, **tokenizer) -> None:
    path = Path(out, "manifest.json")
    manifest = json.loads(path.read_text())
    manifest["tokenizer"].update(tokenizer)
    path.write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def outs(tmp_path_factory):
    """Two outputs of the same shape prepared with different tokenizers."""
    root = tmp_path_factory.mktemp("hostile")
    return (with_tokenizer(make_output(root / "a", 300, seed=1, vocab=VOCAB), "a"),
            with_tokenizer(make_output(root / "b", 300, seed=2, vocab=VOCAB), "b"))


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("tokenmill: error: "), err
    return err


def train(data, run, *sets) -> int:
    return main(["train", "--data", str(data), "--run", str(run), *TINY, *(a for s in sets for a in ("--set", s))])


# ---------------------------------------------------------------- a. --run that cannot be a run folder


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_run_that_is_a_file_is_refused_in_one_line(outs, tmp_path, capsys, where):
    (tmp_path / "file").write_text("not a folder")
    run = tmp_path / "file" if where == "file" else tmp_path / "file" / "run"
    assert train(outs[0], run) == 2
    err = one_error_line(capsys)
    assert f"--run-dir {run}" in err and ("not a folder" in err if where == "file" else "cannot create" in err)
    assert (tmp_path / "file").read_text() == "not a folder"


def test_two_trainers_on_one_run_folder(outs, tmp_path, capsys):
    """A second `train` into a RUN another one is writing is refused in one line naming the first
    (its checkpoints and metrics would interleave); once the first ends, the same command resumes."""
    run = tmp_path / "run"
    cmd = [TOKENMILL, "train", "--data", str(outs[0]), "--run", str(run), *TINY, "--set", "train.steps=100000",
           "--set", "checkpoint.every=0"]
    first = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-2000:]
            time.sleep(0.2)
        assert train(outs[0], run, "train.steps=3") == 2
        err = one_error_line(capsys)
        assert f"--run-dir {run} is in use by another tokenmill train (pid {first.pid})" in err, err
    finally:
        first.terminate()
        first.wait(timeout=120)
    assert train(outs[0], run, "train.steps=3") == 0  # the lock went with its process


def _refused_as_unwritable(outs, run, capsys):
    assert train(outs[0], run) == 2
    err = one_error_line(capsys)
    assert f"--run-dir {run}: cannot write there" in err
    assert not os.path.exists(os.path.join(run, "checkpoints"))


def test_read_only_run_folder_is_refused_before_training(outs, tmp_path, capsys):
    run = tmp_path / "ro"
    run.mkdir()
    run.chmod(0o555)
    try:
        try:  # as root, mode bits do not stop writes: nothing to refuse then
            (run / "probe").write_text("x")
            (run / "probe").unlink()
            pytest.skip("this user can write into a 0o555 folder (root): see the sysfs test")
        except PermissionError:
            pass
        _refused_as_unwritable(outs, run, capsys)
    finally:
        run.chmod(0o755)


def test_run_folder_not_even_root_can_write_is_refused(outs, capsys):
    run = "/sys/kernel"  # sysfs takes no new files, whoever asks
    if not os.path.isdir(run):
        pytest.skip("no /sys/kernel on this machine")
    try:
        open(os.path.join(run, "tokenmill-probe"), "w").close()
        os.remove(os.path.join(run, "tokenmill-probe"))
        pytest.skip("/sys/kernel is writable here")
    except OSError:
        pass
    _refused_as_unwritable(outs, run, capsys)


# ---------------------------------------------------------------- b. vocab_size and token ids


def test_manifest_vocab_size_that_disagrees_with_the_tokenizer(outs, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(outs[0], bad)
    edit_manifest(bad, vocab_size=300)  # the shards hold ids up to 499: an IndexError in the model today
    assert main(["inspect", str(bad)]) == 2
    err = one_error_line(capsys)
    assert "vocab_size 300" in err and f"has {VOCAB} tokens" in err
    assert train(bad, tmp_path / "run") == 2
    assert one_error_line(capsys) == err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_token_ids_past_vocab_size_are_caught(outs, tmp_path, capsys):
    # The stand-in tokenizer of make_output has no vocab to compare, so only the ids can tell.
    bad = make_output(tmp_path / "bad", 100, seed=3, vocab=VOCAB, stand_in_tokenizer=True)
    edit_manifest(bad, vocab_size=200)
    assert inspect_output(bad, console=Console(width=400)) == 1
    fails = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 3 and all("arrow: token id" in f and "vocab_size 200" in f for f in fails)  # 2 train, 1 val

    assert train(bad, tmp_path / "run") == 2
    err = one_error_line(capsys)
    assert ".arrow: token id" in err and "vocab_size 200" in err

    m = json.loads(Path(bad, "manifest.json").read_text())
    ds = D.PackedWindows([D.TokenStream(D.split_files(bad, m, "train"), EOS)], 16, seed=0, vocab_size=200)
    got = ds.__getitems__(list(range(8)))  # how a DataLoader worker hands it to the loop
    assert set(got) == {"error"} and "-of-00002.arrow: token id" in got["error"]
    with pytest.raises(UserError, match="token id"):
        ds[0]


# ---------------------------------------------------------------- c. a shard truncated mid-run


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.slow
def test_shard_truncated_while_training_is_one_line_not_sigbus(tmp_path, workers):
    data = make_output(tmp_path / "out", 300, seed=4, vocab=VOCAB)
    run = tmp_path / "run"
    cmd = [TOKENMILL, "train", "--data", data, "--run", str(run), *TINY, "--set", "train.steps=100000",
           "--set", f"data.num_workers={workers}", "--set", "checkpoint.every=0", "--set", "eval.every=0"]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        log, deadline = run / "metrics.jsonl", time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            lines = log.read_text().splitlines() if log.exists() else []
            if len(lines) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
        shard = Path(data) / "shards" / "train-00001-of-00002.arrow"
        os.truncate(shard, shard.stat().st_size // 2)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert proc.returncode == 2, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and len(errors) == 1, err[-3000:]
    assert errors[0].startswith("tokenmill: error: ") and str(shard) in errors[0] and "shrank" in errors[0]


# ---------------------------------------------------------------- d. a CPU micro-batch too big for memory


def test_micro_batch_too_big_for_memory_is_refused_quickly(outs, tmp_path, capsys):
    available = available_memory()
    if available is None:
        pytest.skip("available memory unknown on this machine")
    # 4x what this machine has: 100000 x 16 tokens of the tiny model (~23 GB) can fit a big one.
    cfg = load_train_config(overrides=TINY[1::2], data=["x"])
    per_sample = cpu_memory_needed(model_args(cfg, VOCAB), cfg, "fp32", 1)[1] / cfg.train.micro_batch
    micro_batch = max(100_000, int(4 * available / per_sample))
    t0 = time.monotonic()
    assert train(outs[0], tmp_path / "run", f"train.micro_batch={micro_batch}") == 2
    err = one_error_line(capsys)
    assert time.monotonic() - t0 < 30
    assert "GiB of memory" in err and "GiB is available" in err and f"{micro_batch} x 16 tokens" in err
    assert "lower train.micro_batch" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_memory_estimate_of_the_tiny_config_is_small():
    cfg = load_train_config(overrides=TINY[1::2], data=["x"])
    state, act = cpu_memory_needed(model_args(cfg, VOCAB), cfg, "fp32", 1)
    assert 0 < state + act < 50 * 2**20  # a few MiB: far from any machine's limit


# ---------------------------------------------------------------- e. resuming on another tokenizer


def test_resume_on_data_of_another_tokenizer_is_refused(outs, tmp_path, capsys):
    a, b = outs
    run = tmp_path / "run"
    sha_a = json.loads(Path(a, "manifest.json").read_text())["tokenizer"]["sha256"]
    sha_b = json.loads(Path(b, "manifest.json").read_text())["tokenizer"]["sha256"]
    assert sha_a != sha_b
    assert train(a, run, "train.steps=2") == 0
    state_file = run / "checkpoints" / "step-00000002" / "trainer.json"
    assert json.loads(state_file.read_text())["tokenizer_sha256"] == sha_a
    capsys.readouterr()

    assert train(b, run, "train.steps=4") == 2
    err = one_error_line(capsys)
    assert f"trained with tokenizer {sha_a[:12]}" in err and f"has tokenizer {sha_b[:12]}" in err
    assert sorted(os.listdir(run / "checkpoints")) == ["best", "step-00000002"]

    # A checkpoint from before the field: resumed with a warning, and recorded from then on.
    state = json.loads(state_file.read_text())
    del state["tokenizer_sha256"]
    state_file.write_text(json.dumps(state))
    assert train(a, run, "train.steps=3") == 0
    assert "does not record its tokenizer" in capsys.readouterr().err
    assert json.loads((run / "checkpoints" / "step-00000003" / "trainer.json").read_text())["tokenizer_sha256"] == sha_a

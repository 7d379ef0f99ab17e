"""A run folder someone else made ("Trust what you open"): loading its checkpoint runs no code.
DCP pickles a checkpoint's .metadata; a crafted one that would run a command on load is
refused in one line by `generate` and by a resuming `train`, and the command never runs."""

import os
import pickle
import shutil

import pytest

torch = pytest.importorskip("torch")

from conftest import sigterm_group_after_steps  # noqa: E402
from trainer_helpers import make_output, train_tiny  # noqa: E402

from tokenmill.cli import main  # noqa: E402


class _Payload:
    """Unpickling this runs ``touch <marker>``: what a crafted .metadata can do with plain pickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("received")
    out = make_output(root / "out", 120, seed=3)
    run = root / "run"
    assert train_tiny(out, run, "data.seq_len=32", "train.steps=2", "checkpoint.every=2", "export.enabled=false") == 0
    return out, run


def _crafted(trained, tmp_path):
    """A copy of the run whose every checkpoint's .metadata would run a command when unpickled."""
    out, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    marker = tmp_path / "owned"
    metas = list(copy.glob("checkpoints/*/.metadata"))
    assert metas
    for meta in metas:
        meta.write_bytes(pickle.dumps(_Payload(marker)))
    return out, copy, marker


def _one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_generate_runs_no_code_from_a_crafted_checkpoint(trained, tmp_path, capsys):
    _, run, marker = _crafted(trained, tmp_path)
    assert main(["generate", str(run), "--prompt", "w5", "--max-tokens", "2"]) == 2
    line = _one_line(capsys)
    assert ".metadata" in line and "system" in line, line
    assert not marker.exists()


def test_resume_runs_no_code_from_a_crafted_checkpoint(trained, tmp_path, capsys):
    out, run, marker = _crafted(trained, tmp_path)
    rc = train_tiny(out, run, "data.seq_len=32", "train.steps=4", "checkpoint.every=2", "export.enabled=false")
    assert rc == 2
    assert not marker.exists()


def test_a_tokenizer_that_panics_rust_is_one_line(trained, tmp_path, capsys):
    """RUN/tokenizer.json is loaded by Rust: a crafted one (a zero-length FixedLength pre-tokenizer)
    panics when it encodes. It is tried in a child first: one line, no Rust panic text."""
    import json

    _, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    spec = json.loads((copy / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "FixedLength", "length": 0}
    (copy / "tokenizer.json").write_text(json.dumps(spec))
    assert main(["generate", str(copy), "--prompt", "w5", "--max-tokens", "2"]) == 2
    line = _one_line(capsys)
    assert "tokenizer.json" in line and "PanicException" in line, line


def test_a_real_checkpoint_still_loads(trained, capsys):
    _, run = trained
    assert main(["generate", str(run), "--prompt", "w5 w9", "--max-tokens", "3"]) == 0
    assert "step-00000002" in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_to_the_process_group_saves_and_stops(trained, tmp_path):
    """What `timeout`, `scancel` and Kubernetes do: SIGTERM to every process of the group, the
    DataLoader workers included. The run saves a checkpoint and stops as on a SIGTERM to the
    trainer alone, with no traceback."""
    import sys

    out, _ = trained
    run = tmp_path / "run"
    sets = ["model.preset=null", "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "train.micro_batch=2",
            "data.num_workers=2", "data.seq_len=32", "train.steps=100000", "checkpoint.every=0", "eval.every=0",
            "export.enabled=false", "metrics.tensorboard=false"]
    tokenmill = os.path.join(os.path.dirname(sys.executable), "tokenmill")
    rc, err = sigterm_group_after_steps([tokenmill, "train", "--data", str(out), "--run-dir", str(run),
                                         *(a for s in sets for a in ("--set", s))], run)
    assert rc == 143 and "Traceback" not in err, err[-3000:]  # 128 + SIGTERM, as when the trainer alone gets it
    assert "stopped by SIGTERM" in err and list(run.glob("checkpoints/step-*/COMPLETE")), err[-3000:]


@pytest.mark.parametrize("file, key, value, needle", [
    ("model.json", "vocab_size", 10**11, "vocab_size is 100000000000, not a whole number"),
    ("model.json", "d_model", "128", "d_model is '128'"),
    ("model.json", "n_heads", 3, "do not divide d_model"),
    ("hf/config.json", "hidden_size", 2**40, "hidden_size is 1099511627776"),
    ("hf/config.json", "num_hidden_layers", 1.5, "num_hidden_layers is 1.5"),
])
def test_a_shape_read_back_is_checked_before_anything_is_allocated(trained, tmp_path, capsys, file, key, value,
                                                                   needle):
    """A received run whose model.json or HF config.json asks for an absurd or inconsistent shape:
    `generate` says so in one line naming the file and the field (a 10^11 vocabulary was a
    traceback from the allocator)."""
    import json

    _, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    if file.startswith("hf/"):  # an export that claims the newest step, so generate takes it
        (copy / "hf").mkdir()
        (copy / "hf" / "model.safetensors").write_bytes(b"")
        shape = json.loads((copy / "model.json").read_text())
        config = {"vocab_size": shape["vocab_size"], "num_hidden_layers": shape["n_layers"],
                  "hidden_size": shape["d_model"], "num_attention_heads": shape["n_heads"],
                  "num_key_value_heads": shape["n_kv_heads"], "intermediate_size": shape["ffn_hidden"],
                  "max_position_embeddings": shape["max_seq_len"], "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
                  "tokenmill_step": 10**6}
        (copy / "hf" / "config.json").write_text(json.dumps(config))
    raw = json.loads((copy / file).read_text())
    raw[key] = value
    (copy / file).write_text(json.dumps(raw))
    assert main(["generate", str(copy), "--prompt", "w5", "--max-tokens", "2"]) == 2
    line = _one_line(capsys)
    assert str(copy / file) in line and needle in line, line

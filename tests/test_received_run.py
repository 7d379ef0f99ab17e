"""A run folder someone else made ("Trust what you open"): loading its checkpoint runs no code.
DCP pickles a checkpoint's .metadata; a crafted one that would run a command on load is
refused in one line by `generate` and by a resuming `train`, and the command never runs."""

import os
import pickle
import shutil

import pytest

torch = pytest.importorskip("torch")

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


def test_a_real_checkpoint_still_loads(trained, capsys):
    _, run = trained
    assert main(["generate", str(run), "--prompt", "w5 w9", "--max-tokens", "3"]) == 0
    assert "step-00000002" in capsys.readouterr().err

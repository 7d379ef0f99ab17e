"""`tokenmill generate`: the newest checkpoint and the hf export of the same step give the same
samples; greedy is top-k 1; the token budget holds; a folder with nothing to load is one line."""

import shutil

import pytest

torch = pytest.importorskip("torch")

from trainer_helpers import make_output, train_tiny  # noqa: E402

from tokenmill.cli import main  # noqa: E402
from tokenmill.trainer.generate import generate, load_run, sample  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    out = make_output(root / "out", 200, seed=7)
    run = root / "run"
    assert train_tiny(out, run, "data.seq_len=32", "train.steps=6", "checkpoint.every=3") == 0
    return run


def test_checkpoint_and_hf_export_sample_the_same(run, tmp_path):
    from_ckpt, source = generate(str(run), "w5 w9 w13", max_tokens=12, temperature=1.0, top_k=0, seed=3)
    assert source.endswith("step-00000006")
    hf_only = tmp_path / "run"
    shutil.copytree(run, hf_only, ignore=shutil.ignore_patterns("checkpoints"))
    from_hf, source = generate(str(hf_only), "w5 w9 w13", max_tokens=12, temperature=1.0, top_k=0, seed=3)
    assert source.endswith("hf") and from_hf == from_ckpt and from_ckpt.strip()


def test_greedy_is_top_k_one_and_the_budget_holds(run):
    model, _, eos, _ = load_run(str(run))
    prompt = [5, 9, 13]
    greedy = sample(model, prompt, 20, temperature=0, top_k=0, seed=0, eos_id=eos)
    assert greedy == sample(model, prompt, 20, temperature=0.7, top_k=1, seed=1, eos_id=eos)
    assert len(greedy) <= 20 and eos not in greedy
    samples = {tuple(sample(model, prompt, 20, temperature=1.5, top_k=0, seed=s, eos_id=eos)) for s in range(4)}
    assert len(samples) > 1  # sampling samples


def test_cli_prints_the_prompt_and_its_continuation(run, capsys):
    assert main(["generate", str(run), "--prompt", "w5 w9", "--max-tokens", "5", "--seed", "1"]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("w5 w9") and "weights from" in cap.err


@pytest.mark.parametrize("args, needle", [([], "no complete checkpoint and no hf/ export"),
                                          (["--max-tokens", "0"], "--max-tokens")])
def test_nothing_to_generate_from_is_one_line(tmp_path, capsys, args, needle):
    target = tmp_path if not args else tmp_path / "x"
    assert main(["generate", str(target), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_the_newest_weights_win(tmp_path):
    """step-4 checkpoint, final save off, hf/ at step 6: generate takes hf/ (the newer)."""
    out = make_output(tmp_path / "out", 120, seed=8)
    run = tmp_path / "run"
    assert train_tiny(out, run, "data.seq_len=32", "train.steps=6", "checkpoint.every=4", "checkpoint.final=none") == 0
    assert (run / "checkpoints" / "step-00000004").exists()
    assert load_run(str(run))[3].endswith("hf")


def test_max_new_tokens_is_max_tokens(run, capsys):
    """transformers users type --max-new-tokens: the same budget as --max-tokens."""
    outs = []
    for flag in ("--max-tokens", "--max-new-tokens"):
        assert main(["generate", str(run), "--prompt", "w5 w9", flag, "4", "--temperature", "0"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0].startswith("w5 w9")

"""Bits per byte: the byte length of every token for each tokenizer kind, the formula in
evaluate() and text_bpb() checked against a model whose predictions are known exactly, and
val_bpb in a real run's metrics."""

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tokenmill.trainer.evaluation import evaluate, text_bpb, token_byte_lengths  # noqa: E402
from tokenmill.transforms.tokenization import train_tokenizer  # noqa: E402

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "Größe und Übermaß, naïve café déjà vu.",
         "日本語のテキストと English words 123", "Ünïcödé everywhere: ½ ¾ — “quotes” …"] * 20


def tokenizer_file(tmp_path, kind: str) -> str:
    tok = train_tokenizer(TEXTS, vocab_size=300, kind=kind, min_frequency=1)
    tok.add_special_tokens(["<|endoftext|>"])
    path = tmp_path / f"{kind}.json"
    path.write_text(tok.to_str())
    return str(path)


@pytest.mark.parametrize("kind, tolerance", [("bpe", 0.0), ("unigram", 0.05), ("wordpiece", 0.25)])
def test_token_byte_lengths_add_up_to_the_text(tmp_path, kind, tolerance):
    """ByteLevel BPE: exact. Unigram and WordPiece count the space their decoders put back
    (WordPiece also before punctuation, hence its looser bound)."""
    from tokenizers import Tokenizer

    path = tokenizer_file(tmp_path, kind)
    lengths = token_byte_lengths(path)
    tok = Tokenizer.from_file(path)
    assert lengths[tok.token_to_id("<|endoftext|>")] == 0
    for text in TEXTS[:4]:
        got, want = int(lengths[tok.encode(text).ids].sum()), len(text.encode())
        assert abs(got - want) <= tolerance * want, (kind, text, got, want)


def uniform_model(vocab: int):
    """Zero head: every next token has probability 1/vocab, so every nll is ln(vocab)."""
    from tokenmill.trainer.model import ModelArgs, Transformer

    m = Transformer(ModelArgs(vocab_size=vocab, n_layers=1, d_model=16, n_heads=2, n_kv_heads=2, ffn_hidden=32,
                              max_seq_len=64))
    with torch.no_grad():
        m.lm_head.weight.zero_()
    return m


def test_text_bpb_counts_every_text_token_and_every_byte(tmp_path):
    from tokenizers import Tokenizer

    path = tokenizer_file(tmp_path, "bpe")
    tok = Tokenizer.from_file(path)
    vocab, eos = tok.get_vocab_size(), tok.token_to_id("<|endoftext|>")
    texts = TEXTS[:7]
    got = text_bpb(uniform_model(vocab), path, eos, texts, seq_len=16, device=torch.device("cpu"), batch_size=3)
    n_tokens = sum(len(tok.encode(t).ids) for t in texts)
    n_bytes = sum(len(t.encode()) for t in texts)
    assert (got["tokens"], got["bytes"], got["docs"]) == (n_tokens, n_bytes, 7)
    assert got["bpb"] == pytest.approx(n_tokens * math.log2(vocab) / n_bytes, rel=1e-6)


def test_evaluate_val_bpb_formula(tmp_path):
    """Weighted windows, EOS targets out of the bpb sums but in the loss."""
    from tokenmill.trainer.parallel import close_distributed, init_distributed

    vocab = 50
    lengths = torch.tensor([0] + [3] * (vocab - 1))  # id 0: EOS, every other token 3 bytes
    tokens = torch.tensor([[5, 6, 0, 7, 8], [9, 0, 0, 10, 11]])
    batches = [({"tokens": tokens}, torch.tensor([1.0, 0.0]))]  # the second row is padding
    init_distributed()
    try:
        got = evaluate(uniform_model(vocab), batches, lambda m, b: m(b["tokens"][:, :-1]), torch.device("cpu"),
                       lengths)
    finally:
        close_distributed()
    assert got["val_loss"] == pytest.approx(math.log(vocab))
    # row 0 targets: 6, 0, 7, 8 -> 3 text tokens of 3 bytes
    assert got["val_bpb"] == pytest.approx(3 * math.log2(vocab) / 9)


def test_val_bpb_in_a_runs_metrics(tmp_path):
    from trainer_helpers import make_output, train_tiny

    out = make_output(tmp_path / "out", 120, seed=5)
    run = tmp_path / "run"
    assert train_tiny(out, run, "data.seq_len=16", "train.steps=4", "eval.every=2", "export.enabled=false") == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    # the helper's word-level tokens "w<i>" are 2-4 bytes each: bpb is loss / ln 2 / that
    for r in evals:
        assert r["val_loss"] / math.log(2) / 4 <= r["val_bpb"] <= r["val_loss"] / math.log(2) / 2
    assert np.isfinite([r["val_bpb"] for r in evals]).all()


def test_a_text_shorter_than_one_window_is_one_short_window():
    import numpy as np

    from tokenmill.trainer.evaluation import stream_windows

    full, rest = stream_windows(np.arange(5, dtype=np.int64), 8)
    assert full.shape == (0, 9) and rest.tolist() == [0, 1, 2, 3, 4]
    full, rest = stream_windows(np.arange(1, dtype=np.int64), 8)
    assert full.shape == (0, 9) and rest is None

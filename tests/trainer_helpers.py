"""A prepared output written with the pipeline's own shard writer, shared by the trainer tests."""

from __future__ import annotations

import hashlib
import os

import numpy as np

from tokenmill.transforms.shards import write_manifest, write_shard

EOS = 0


def word_level_tokenizer(vocab: int) -> str:
    """A real tokenizer.json for random ids: word ``w<i>`` is id i, id 0 the special EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({"<eos>": EOS, **{f"w{i}": i for i in range(1, vocab)}}, unk_token="<eos>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.add_special_tokens(["<eos>"])
    return t.to_str()


def make_output(out, n_docs: int, seed: int, vocab: int = 500, n_shards: int = 2, batch_tokens: int = 300,
                stand_in_tokenizer: bool = False) -> str:
    """A prepared output (manifest + Arrow shards + tokenizer file) with random EOS-terminated docs."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(out, "shards"), exist_ok=True)
    # stand_in: a tokenizer.json without a vocab, so only the token ids can show a wrong vocab_size
    tok_text = '{"version": "1.0", "note": "stand-in"}' if stand_in_tokenizer else word_level_tokenizer(vocab)
    with open(os.path.join(out, "tokenizer.json"), "w") as fh:
        fh.write(tok_text)
    tok = {"sha256": hashlib.sha256(tok_text.encode()).hexdigest(), "vocab_size": vocab, "eos_id": EOS,
           "bos_id": None, "pad_id": None, "model": "BPE"}
    metas = []
    for split, n, shards in (("train", n_docs, n_shards), ("val", max(2, n_docs // 10), 1)):
        rows = []
        for i in range(n):
            t = rng.integers(1, vocab, size=int(rng.integers(5, 120)), dtype=np.uint16)
            rows.append((f"{split}-{seed}-{i:05d}", np.append(t, np.uint16(EOS))))
        for k in range(shards):
            metas.append(write_shard((split, k, shards), rows[k::shards], str(out), "uint16", tok, batch_tokens))
    write_manifest(metas, str(out), tok, "uint16", {}, "test")
    return str(out)


def train_tiny(out, run, *sets: str) -> int:
    """`tokenmill train` in-process on a one-layer model of width 32 (each ``sets`` item a
    ``key=value`` override on top)."""
    from tokenmill.cli import main

    base = ["model.preset=null", "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "train.micro_batch=2",
            "data.num_workers=0"]
    return main(["train", "--data", str(out), "--run-dir", str(run), *(a for s in [*base, *sets] for a in ("--set", s))])

"""CPU training throughput: `tokenmill train` against a plain single-file GPT training loop
(nanoGPT style) of the same shape, on the same prepared tokens.

    python bench/train_cpu.py [--data OUT] [--steps 40] [--threads 2]

Shape: 4 layers, 4 heads, d_model 256, seq 128, micro batch 8, grad accum 2, fp32, vocab
from the data, 2 threads. Without --data, a prepared output is made once from the shared
trafilatura pages (vocab 8192, which puts the plain GPT at ~5.3M parameters, nanoGPT's
count at that shape). tokenmill's SwiGLU width (688) matches the plain 4*d GELU MLP in
parameters and FLOPs.

tokenmill runs as the real command (FSDP2 on a 1-rank gloo mesh, DataLoader, metrics) and
its tokens/s come from RUN/metrics.jsonl (a lone CPU rank runs unsharded by default; the
FSDP2 figure on one rank is printed too); the plain loop is timed the same way (a step =
grad_accum micro-batches + clip + AdamW). Both skip the first steps (warm-up) and report the
median. The machine is shared, so the two are interleaved and each is run twice.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO)
logging.basicConfig(level=logging.ERROR)  # Beam's import-time noise
SHARED = os.environ.get("TOKENMILL_SHARED_DATA", os.path.join(REPO, "..", "shared", "data"))
from tokenmill.private import cache_dir_or_temp  # noqa: E402

L, H, D, T, MB, ACCUM = 4, 4, 256, 128, 8, 2


# ---------------------------------------------------------------- the plain loop (nanoGPT-like)


def plain_gpt(vocab: int):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def forward(self, x):
            B, S, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
            q, k, v = (t.view(B, S, H, D // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, D), nn.Embedding(T, D)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(D)
            self.head = nn.Linear(D, vocab, bias=False)
            self.head.weight = self.wte.weight  # tied, as nanoGPT

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln_f(x))

    return GPT()


def run_plain(tokens: np.ndarray, vocab: int, steps: int, warmup: int) -> tuple[float, int]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = plain_gpt(vocab)
    n_params = sum(p.numel() for p in model.parameters()) - T * D  # nanoGPT excludes position embeddings
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(0)
    rates = []
    for step in range(steps):
        t0 = time.perf_counter()
        for _ in range(ACCUM):
            starts = rng.integers(0, len(tokens) - T - 1, size=MB)
            xy = torch.from_numpy(np.stack([tokens[s:s + T + 1] for s in starts]).astype(np.int64))
            logits = model(xy[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), xy[:, 1:].flatten()) / ACCUM
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        if step >= warmup:
            rates.append(MB * ACCUM * T / (time.perf_counter() - t0))
    return statistics.median(rates), n_params


# ---------------------------------------------------------------- tokenmill train


def run_tokenmill(data: str, steps: int, warmup: int, threads: int, extra: tuple = ()) -> float:
    run = tempfile.mkdtemp(prefix="tokenmill_bench_run_")
    try:
        cmd = [os.path.join(os.path.dirname(sys.executable), "tokenmill"), "train", "--data", data, "--run-dir", run]
        sets = ["model.preset=null", f"model.n_layers={L}", f"model.n_heads={H}", f"model.d_model={D}",
                "model.ffn_hidden=688", f"data.seq_len={T}", f"train.micro_batch={MB}", f"train.grad_accum={ACCUM}",
                f"train.steps={steps}", "precision=fp32", "optim.lr=1e-3", "checkpoint.every=0",
                "checkpoint.every_minutes=0", "eval.every=0", "eval.samples=1", "export.enabled=false",
                "data.num_workers=0", "metrics.tensorboard=false", *extra,
                # a log step every step: per-step times (the loop reads the device back only at
                # log steps, which on CPU costs nothing)
                "train.log_every=1"]
        for s in sets:
            cmd += ["--set", s]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(p.stderr)
        with open(os.path.join(run, "metrics.jsonl")) as fh:
            rows = [json.loads(line) for line in fh]
        return statistics.median(r["tokens_per_s"] for r in rows[warmup:])
    finally:
        shutil.rmtree(run, ignore_errors=True)


def ensure_data(data: str | None) -> str:
    if data:
        return data
    out = os.path.join(cache_dir_or_temp("bench"), "train_data")  # reused: private, not in the shared /tmp
    if not os.path.exists(os.path.join(out, "manifest.json")):
        pages = os.path.join(SHARED, "html_extraction", "trafilatura_eval")
        inputs = ["--input", pages] if os.path.exists(pages) else []  # else: the bundled sample
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "tokenmill"), "prepare", *inputs,
                        "--output", out, "--set", "tokenize.vocab_size=8192"], check=True, capture_output=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", help="a prepared output (default: made from the shared pages)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fsdp", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the single rank through FSDP2 (what several ranks run)")
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch

    torch.set_num_threads(a.threads)
    from tokenmill.trainer.model import ModelArgs, count_params
    from tokenmill.trainer.windows import TokenStream, open_output, split_files

    data = ensure_data(a.data)
    m = open_output(data, verify_checksums=False)
    vocab = m["tokenizer"]["vocab_size"]
    stream = TokenStream(split_files(data, m, "train"), m["tokenizer"]["eos_id"])
    tokens = np.empty(len(stream), dtype=np.uint16)
    stream.read(0, tokens)
    ours_n, _ = count_params(ModelArgs(vocab, L, D, H, H, 688, T))
    print(f"data {data}: {len(tokens):,} tokens, vocab {vocab}; shape {L} layers x {H} heads x d {D}, seq {T}, "
          f"micro batch {MB} x accum {ACCUM}, fp32, {a.threads} threads")
    plain, tok, fsdp = [], [], []
    for _ in range(2):
        rate, plain_n = run_plain(tokens, vocab, a.steps, a.warmup)
        plain.append(rate)
        tok.append(run_tokenmill(data, a.steps, a.warmup, a.threads))
        if a.fsdp:
            fsdp.append(run_tokenmill(data, a.steps, a.warmup, a.threads, ("parallel.shard_single_rank=true",)))
    print(f"  plain GPT loop ({plain_n / 1e6:.1f}M params)      {max(plain):9,.0f} tokens/s   (runs: "
          f"{', '.join(f'{r:,.0f}' for r in plain)})")
    print(f"  tokenmill train ({ours_n / 1e6:.1f}M params)     {max(tok):9,.0f} tokens/s   (runs: "
          f"{', '.join(f'{r:,.0f}' for r in tok)})")
    if fsdp:
        print(f"  tokenmill train, FSDP2 on 1 rank {max(fsdp):9,.0f} tokens/s   (runs: "
              f"{', '.join(f'{r:,.0f}' for r in fsdp)}; parallel.shard_single_rank=true)")
    print(f"  ratio tokenmill / plain              {max(tok) / max(plain):9.2f}")


if __name__ == "__main__":
    main()

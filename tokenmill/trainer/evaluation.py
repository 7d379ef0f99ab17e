"""Validation loss, and bits per byte: the loss in units that do not depend on the tokenizer.

bpb = (nats over the predicted tokens) / ln 2 / (UTF-8 bytes of those tokens). A tokenizer with
longer tokens has a higher loss per token and fewer tokens per byte; per byte, runs with
different tokenizers (or none of the same vocab) compare. Special tokens (EOS between
documents) carry no text: they are left out of both sums, as nanoGPT/nanochat's evaluate_bpb
does.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

# ByteLevel tokens spell their bytes with GPT-2's byte-to-unicode table: one character per byte.
_BYTE_LEVEL = "ByteLevel"


def token_byte_lengths(tokenizer_json: str) -> np.ndarray:
    """UTF-8 bytes of text each token id stands for (0 for special tokens).

    ByteLevel (the default BPE): one byte per character of the token, exactly. Metaspace
    (Unigram): the token with its U+2581 as a space. WordPiece: the token without its ``##``,
    plus one byte for the space before a word-initial token (the decoder's convention; a
    punctuation token counts one byte too many)."""
    from tokenmill.native import load_tokenizer

    with open(tokenizer_json, encoding="utf-8") as fh:
        spec = json.load(fh)
    tok = load_tokenizer(tokenizer_json)
    decoder = (spec.get("decoder") or {}).get("type", "")
    special = {a["id"] for a in spec.get("added_tokens", []) if a.get("special")}
    lengths = np.zeros(tok.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    for text, i in tok.get_vocab(with_added_tokens=True).items():
        if i in special or i >= len(lengths):
            continue
        if decoder == _BYTE_LEVEL:
            lengths[i] = len(text)
        elif decoder == "WordPiece":
            lengths[i] = len(text[2:].encode()) if text.startswith("##") else len(text.encode()) + 1
        else:  # Metaspace and the rest: the token's own text
            lengths[i] = len(text.replace("\u2581", " ").encode())
    return lengths


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every target [B, T], computed on the flattened (B*T, V) logits as in
    training: a strided (B, V, T) transpose would make the kernel read the logits out of order."""
    B, T = targets.shape
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view(B, T)


@torch.no_grad()
def evaluate(model, batches: list, forward, device: torch.device, byte_lengths: torch.Tensor | None = None) -> dict:
    """Collective. Mean loss per token over the (weighted) validation windows of every rank,
    and bits per byte when ``byte_lengths`` (a device tensor indexed by token id) is given.
    ``forward(model, batch) -> logits`` (the loop's, under its precision)."""
    model.eval()
    total = torch.zeros(4, dtype=torch.float64, device=device)  # nats, targets, nats of text tokens, bytes
    for batch, weight in batches:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        weight = weight.to(device)
        targets = batch["tokens"][:, 1:]
        nll = token_nll(forward(model, batch), targets)
        total[0] += (nll.sum(1) * weight).sum()
        total[1] += weight.sum() * targets.shape[1]
        if byte_lengths is not None:
            nbytes = byte_lengths[targets]
            total[2] += ((nll * (nbytes > 0)).sum(1) * weight).sum()
            total[3] += (nbytes.sum(1) * weight).sum()
    dist.all_reduce(total)
    model.train()
    nats, n, text_nats, nbytes = total.tolist()
    out = {"val_loss": nats / n}
    if byte_lengths is not None and nbytes > 0:
        out["val_bpb"] = text_nats / math.log(2) / nbytes
    return out


def stream_windows(ids: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Non-overlapping windows of seq_len + 1 tokens (consecutive windows share one token), so
    every token but the first is a target exactly once: the full windows [N, seq_len + 1], and
    the shorter last one (or None)."""
    n_full = max(0, (len(ids) - 1) // seq_len)
    if n_full == 0:  # a text shorter than one window: only the short one
        return np.empty((0, seq_len + 1), dtype=ids.dtype), (ids if len(ids) >= 2 else None)
    full = np.lib.stride_tricks.sliding_window_view(ids, seq_len + 1)[::seq_len][:n_full]
    rest = ids[n_full * seq_len:]
    return np.ascontiguousarray(full), (rest if len(rest) >= 2 else None)


@torch.no_grad()
def text_bpb(model, tokenizer_json: str, eos_id: int, texts: list[str], seq_len: int, device: torch.device,
             batch_size: int = 8) -> dict:
    """Bits per byte of ``model`` on documents, each encoded by the model's own tokenizer and
    preceded by EOS (as training streams them), so every text token is predicted; the bytes
    are the documents' exact UTF-8 bytes. One process, no collective (compare's evaluation)."""
    from tokenmill.native import load_tokenizer

    tok = load_tokenizer(tokenizer_json)
    ids = np.fromiter((i for enc in tok.encode_batch_fast(texts, add_special_tokens=False) for i in (eos_id, *enc.ids)),
                      dtype=np.int64)
    full, rest = stream_windows(ids, seq_len)
    chunks = [full[k:k + batch_size] for k in range(0, len(full), batch_size)] + ([rest[None]] if rest is not None else [])
    model.eval()
    nats, targets = 0.0, 0
    for chunk in chunks:
        x = torch.tensor(chunk, device=device)  # a copy: the windows are views of one array
        nll = token_nll(model(x[:, :-1]), x[:, 1:])
        text = x[:, 1:] != eos_id
        nats += float(nll[text].sum())
        targets += int(text.sum())
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    return {"bpb": nats / math.log(2) / max(nbytes, 1), "nats": nats, "bytes": nbytes, "tokens": targets,
            "docs": len(texts)}

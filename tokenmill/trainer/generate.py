"""``tokenmill generate RUN --prompt "..."``: sample from a trained run, the first thing a user
does after training. The weights come from the newest complete checkpoint (what a run still
training has), or RUN/hf when there is none; the tokenizer is the one the run trained with
(RUN/tokenizer.json, copied there at start; RUN/hf has it too).

One process, no process group, no KV cache: each new token re-reads the whole context (at
most the model's max_seq_len), which is fast enough for the sizes this trains on a laptop.
"""

from __future__ import annotations

import json
import os
import warnings

import torch

from tokenmill.errors import UserError
from tokenmill.trainer import checkpoint as ckpt
from tokenmill.trainer.model import Transformer, checked_args


def _json(path: str):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not readable JSON ({e.__class__.__name__})") from None


def load_run(run: str) -> tuple[Transformer, str, int | None, str]:
    """(model in eval mode, tokenizer.json path, EOS id, where the weights came from): the
    newest weights of the run, from its newest step checkpoint, its final/ weights or its hf/
    export, whichever holds the highest step (a checkpoint on a tie)."""
    root, hf = os.path.join(run, "checkpoints"), os.path.join(run, "hf")
    shape, tokenizer_json = os.path.join(run, "model.json"), os.path.join(run, "tokenizer.json")
    candidates = []  # (step, prefer, kind, path)
    # A run from before RUN/tokenizer.json was kept can only use its hf/ export.
    if os.path.exists(shape) and os.path.exists(tokenizer_json):
        found = ckpt.latest(root)
        if found:
            candidates.append((found[0], 1, "checkpoint", found[1]))
        final = os.path.join(root, "final")
        if ckpt.is_complete(final):
            candidates.append((int(ckpt.read_state(final).get("step", 0)), 1, "checkpoint", final))
    hf_config = {}
    if os.path.exists(os.path.join(hf, "model.safetensors")):
        hf_config = _json(os.path.join(hf, "config.json"))
        step = hf_config.get("tokenmill_step") if isinstance(hf_config, dict) else None
        candidates.append((step if type(step) is int and step >= 0 else -1, 0, "hf", hf))
    if not candidates:
        raise UserError(f"{run}: no complete checkpoint and no hf/ export to generate from (is it a `tokenmill train` "
                        f"--run-dir?)")
    _, _, kind, path = max(candidates)
    if kind == "hf":
        from tokenmill.trainer.hf_export import load_exported

        return load_exported(hf), os.path.join(hf, "tokenizer.json"), hf_config.get("eos_token_id"), hf
    model = Transformer(checked_args(_json(shape), shape))
    sd = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "torch.distributed is disabled": one process is the point
        warnings.simplefilter("ignore", UserWarning)
        ckpt.load_checkpoint(sd, path, no_dist=True)
    model.load_state_dict(sd["model"])
    return model.float().eval(), tokenizer_json, ckpt.read_state(path).get("eos_id"), path


@torch.no_grad()
def sample(model: Transformer, ids: list[int], max_tokens: int, temperature: float, top_k: int, seed: int,
           eos_id: int | None) -> list[int]:
    """Token ids after ``ids``: temperature 0 is greedy; top_k 0 keeps the whole vocabulary.
    Stops at EOS (not returned) or after ``max_tokens``."""
    g = torch.Generator().manual_seed(seed)
    out: list[int] = []
    context = list(ids)
    for _ in range(max_tokens):
        x = torch.tensor([context[-model.args.max_seq_len:]])
        logits = model(x)[0, -1].float()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if 0 < top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g))
        if nxt == eos_id:
            break
        out.append(nxt)
        context.append(nxt)
    return out


def generate(run: str, prompt: str, max_tokens: int = 100, temperature: float = 0.8, top_k: int = 50,
             seed: int = 0) -> tuple[str, str]:
    """(the prompt's continuation, where the weights came from)."""
    from tokenmill.native import load_tokenizer

    if max_tokens < 1:
        raise UserError("--max-tokens must be at least 1")
    if temperature < 0 or top_k < 0:
        raise UserError("--temperature and --top-k must not be negative")
    model, tokenizer_json, eos, source = load_run(run)
    tok = load_tokenizer(tokenizer_json)
    ids = tok.encode(prompt, add_special_tokens=False).ids
    if not ids:  # an empty prompt starts a document, as training saw them: after EOS
        ids = [eos] if eos is not None else []
    if not ids:
        raise UserError("--prompt: empty, and the run does not record its EOS token to start from")
    return tok.decode(sample(model, ids, max_tokens, temperature, top_k, seed, eos)), source

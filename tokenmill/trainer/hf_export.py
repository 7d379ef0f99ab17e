"""RUN/hf/: the trained model as a Hugging Face Llama checkpoint.

config.json + model.safetensors + the tokenizer files, loadable with
``transformers.AutoModelForCausalLM.from_pretrained(RUN/hf)`` and giving the same logits as
tokenmill's model. The parameter names already match LlamaForCausalLM (model.py), so the
conversion is the ``model.`` prefix on everything but ``lm_head``.
"""

from __future__ import annotations

import json
import os
import shutil

import torch

from tokenmill.trainer.model import ModelArgs, Transformer, checked_args


def hf_config(a: ModelArgs, tok: dict, dtype: str) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": a.vocab_size,
        "hidden_size": a.d_model,
        "intermediate_size": a.ffn_hidden,
        "num_hidden_layers": a.n_layers,
        "num_attention_heads": a.n_heads,
        "num_key_value_heads": a.n_kv_heads,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": a.max_seq_len,
        "rms_norm_eps": a.norm_eps,
        "rope_theta": a.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": tok.get("bos_id"),
        "eos_token_id": tok["eos_id"],
        "pad_token_id": tok.get("pad_id"),
        "torch_dtype": dtype,
    }


def to_hf_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {(k if k.startswith("lm_head.") else f"model.{k}"): v for k, v in sd.items()}


def from_hf_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k.removeprefix("model."): v for k, v in sd.items()}


def tokenizer_files(tokenizer_json: str, tok: dict, max_len: int) -> dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json for PreTrainedTokenizerFast."""
    from tokenmill.native import load_tokenizer

    t = load_tokenizer(tokenizer_json)
    special = {}
    for key, tid in (("eos_token", tok.get("eos_id")), ("bos_token", tok.get("bos_id")), ("pad_token", tok.get("pad_id"))):
        if tid is not None and t.id_to_token(tid) is not None:
            special[key] = t.id_to_token(tid)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
              "clean_up_tokenization_spaces": False, **special}
    return {"tokenizer_config.json": config, "special_tokens_map.json": special}


def export_hf(run: str, model, a: ModelArgs, tok: dict, tokenizer_json: str, dtype: str, is_main: bool,
              step: int | None = None) -> str | None:
    """Collective (the full weights are gathered to rank 0); rank 0 writes RUN/hf atomically."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not is_main:
        return None
    torch_dtype = getattr(torch, dtype)
    tensors = {k: v.to(torch_dtype).contiguous() for k, v in to_hf_names(sd).items()}
    out, tmp = os.path.join(run, "hf"), os.path.join(run, ".tmp-hf")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    # tokenmill_step: which training step these weights are (`tokenmill generate` picks the newest)
    files = {"config.json": {**hf_config(a, tok, dtype), "tokenmill_step": step},
             "generation_config.json": {"bos_token_id": tok.get("bos_id"), "eos_token_id": tok["eos_id"]},
             **tokenizer_files(tokenizer_json, tok, a.max_seq_len)}
    for name, obj in files.items():
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2)
    shutil.copyfile(tokenizer_json, os.path.join(tmp, "tokenizer.json"))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return out


def load_exported(hf_dir: str) -> Transformer:
    """tokenmill's own model from RUN/hf (for checks and inference without transformers)."""
    from safetensors.torch import load_file

    from tokenmill.errors import UserError

    path = os.path.join(hf_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            c = json.load(fh)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not readable JSON ({e.__class__.__name__})") from None
    if not isinstance(c, dict):
        raise UserError(f"{path}: not a JSON object")
    names = {"vocab_size": "vocab_size", "n_layers": "num_hidden_layers", "d_model": "hidden_size",
             "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size",
             "max_seq_len": "max_position_embeddings", "rope_theta": "rope_theta", "norm_eps": "rms_norm_eps"}
    try:
        a = checked_args({ours: c.get(hf) for ours, hf in names.items()}, path)
    except UserError as e:  # name the config's own key, not ours
        line = str(e)
        for ours, hf in names.items():
            line = line.replace(f"{path}: {ours} is", f"{path}: {hf} is")
        raise UserError(line) from None
    model = Transformer(a)
    model.load_state_dict(from_hf_names(load_file(os.path.join(hf_dir, "model.safetensors"))))
    return model.float().eval()

"""A Llama-style decoder: RMSNorm, RoPE, SwiGLU, grouped-query attention through
``scaled_dot_product_attention`` (``flex_attention`` for document masks on CUDA). No parallelism
here: sharding, activation checkpointing and compilation are applied from outside (parallel.py).

Module and parameter names follow Hugging Face's LlamaForCausalLM (``embed_tokens``,
``layers.N.self_attn.q_proj``, ...) and RoPE uses the same rotate-half layout, so the export
is a rename (``model.`` prefix), not a permutation of weights.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    max_seq_len: int
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


# What a model.json or an HF config.json read back may ask for: tokenmill's own bounds (a
# received run's file that asked for a 10^11 vocabulary was a traceback from the allocator).
SHAPE_BOUNDS = {"vocab_size": (1, 1 << 24), "n_layers": (1, 1024), "d_model": (8, 1 << 16), "n_heads": (1, 1024),
                "n_kv_heads": (1, 1024), "ffn_hidden": (1, 1 << 20), "max_seq_len": (2, 1 << 20)}


def checked_args(raw, where: str) -> ModelArgs:
    """ModelArgs from a shape read back (``raw``: a dict of ModelArgs' fields), each a whole number
    within SHAPE_BOUNDS, heads that divide the width, and weights that fit this machine's memory
    in fp32; one UserError line naming ``where`` and the field otherwise."""
    from tokenmill.errors import UserError
    from tokenmill.trainer.metrics import available_memory

    if not isinstance(raw, dict):
        raise UserError(f"{where}: not a JSON object")
    for key, (lo, hi) in SHAPE_BOUNDS.items():
        v = raw.get(key)
        if type(v) is not int or not lo <= v <= hi:
            raise UserError(f"{where}: {key} is {v!r}, not a whole number from {lo} to {hi}")
    for key in ("rope_theta", "norm_eps"):
        v = raw.get(key, getattr(ModelArgs, key))
        if type(v) not in (int, float) or not math.isfinite(v) or v <= 0:
            raise UserError(f"{where}: {key} is {v!r}, not a positive finite number")
    a = ModelArgs(**{k: raw[k] for k in SHAPE_BOUNDS}, rope_theta=float(raw.get("rope_theta", 10_000.0)),
                  norm_eps=float(raw.get("norm_eps", 1e-5)))
    if a.d_model % a.n_heads or a.head_dim % 2 or a.n_heads % a.n_kv_heads:
        raise UserError(f"{where}: {a.n_heads} heads ({a.n_kv_heads} KV) do not divide d_model {a.d_model} into "
                        "an even head size")
    need, have = 4 * count_params(a)[0], available_memory()
    if have is not None and need > have:
        raise UserError(f"{where}: this shape has {count_params(a)[0]:,} parameters, {need / 2**30:.1f} GiB in fp32, "
                        f"more than this machine has free ({have / 2**30:.1f} GiB)")
    return a


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32 whatever the compute dtype (as HF's LlamaRMSNorm).
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(head_dim: int, max_seq_len: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    freqs = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's ``x*cos + rotate_half(x)*sin`` with rotate_half(x) = [-x2, x1], written on the two
    halves (the tables repeat each frequency in both halves): the same numbers with fewer
    full-size temporaries. x [B, H, T, D]; cos/sin [T, D] or [B, 1, T, D] (per-document)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c1, c2, s1, s2 = cos[..., :h], cos[..., h:], sin[..., :h], sin[..., h:]
    return torch.cat([x1 * c1 - x2 * s1, x2 * c2 + x1 * s2], dim=-1).to(x.dtype)


def use_flex(device: torch.device | str) -> bool:
    """Whether document masking goes through flex_attention with a BlockMask on ``device``,
    else through SDPA with a dense [B, 1, T, T] bool mask (which rules out flash attention)."""
    # CPU (torch 2.13) has no flex backward (NotImplementedError), and its forward is slower
    # than dense SDPA (bench/MEASUREMENTS.md: flex attention on GPU only).
    return torch.device(device).type == "cuda"


@functools.cache
def _compiled(fn):
    # Compiled on first use only (importing the model compiles nothing), once per process.
    return torch.compile(fn, dynamic=False)


def document_mask(doc_ids: torch.Tensor, flex: bool) -> torch.Tensor | BlockMask:
    """Attention restricted to earlier-or-same tokens of the same document, for doc_ids [B, T]:
    a BlockMask for flex_attention, or a dense bool [B, 1, T, T] mask for SDPA."""
    B, T = doc_ids.shape
    if not flex:
        causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
        return ((doc_ids.unsqueeze(-1) == doc_ids.unsqueeze(-2)) & causal).unsqueeze(1)

    def same_doc_causal(b, h, q_idx, kv_idx):
        return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (q_idx >= kv_idx)

    # Eager create_block_mask materialises the [B, 1, T, T] mask on the way; compiled it does not.
    make = _compiled(create_block_mask) if doc_ids.device.type == "cuda" else create_block_mask
    return make(same_doc_causal, B, None, T, T, device=doc_ids.device)


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask,
                enable_gqa: bool) -> torch.Tensor:
    """flex_attention, compiled on CUDA: run eagerly there it materialises the full score matrix.
    Inside a compiled block (parallel.compile) dynamo traces flex_attention into that graph."""
    fn = flex_attention
    if q.device.type == "cuda" and not torch.compiler.is_compiling():
        fn = _compiled(flex_attention)
    return fn(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.head_dim
        self.q_proj = nn.Linear(a.d_model, a.n_heads * a.head_dim, bias=False)
        self.k_proj = nn.Linear(a.d_model, a.n_kv_heads * a.head_dim, bias=False)
        self.v_proj = nn.Linear(a.d_model, a.n_kv_heads * a.head_dim, bias=False)
        self.o_proj = nn.Linear(a.n_heads * a.head_dim, a.d_model, bias=False)

    def forward(self, x, cos, sin, mask):
        """mask: None (causal), a BlockMask (flex_attention) or a dense bool mask (SDPA)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # GQA: SDPA shares each KV head across its query group itself, with no copy of K and V.
        gqa = self.n_kv_heads != self.n_heads
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        elif isinstance(mask, BlockMask):
            y = flex_attend(q, k, v, mask, gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(a.d_model, a.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(a.d_model, a.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(a.ffn_hidden, a.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.input_layernorm = RMSNorm(a.d_model, a.norm_eps)
        self.self_attn = Attention(a)
        self.post_attention_layernorm = RMSNorm(a.d_model, a.norm_eps)
        self.mlp = MLP(a)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.args = a
        self.embed_tokens = nn.Embedding(a.vocab_size, a.d_model)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.d_model, a.norm_eps)
        self.lm_head = nn.Linear(a.d_model, a.vocab_size, bias=False)
        # Not persistent: recomputed on the real device after meta-device construction and
        # never part of a checkpoint.
        cos, sin = rope_tables(a.head_dim, a.max_seq_len, a.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_buffers(self, device) -> None:
        a = self.args
        self.rope_cos, self.rope_sin = rope_tables(a.head_dim, a.max_seq_len, a.rope_theta, device=device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                doc_ids: torch.Tensor | None = None, flex: bool | None = None) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, V]. ``positions`` restart RoPE per document;
        ``doc_ids`` restrict attention to earlier tokens of the same document, through
        FlexAttention or a dense SDPA mask (``flex``; None: ``use_flex`` of the device). The
        mask is built once here and shared by all layers."""
        T = tokens.shape[1]
        if positions is None:
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        else:
            cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)
        mask = None
        if doc_ids is not None:
            mask = document_mask(doc_ids, use_flex(tokens.device) if flex is None else flex)
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return self.lm_head(self.norm(h))


# ---------------------------------------------------------------- initialisation and counting


def init_std(name: str, a: ModelArgs) -> float | None:
    """The normal-init std of a parameter; None: ones (norm weights). Residual output
    projections are scaled by 1/sqrt(2 * n_layers) (GPT-2) so the residual stream's variance
    does not grow with depth."""
    if name.endswith("norm.weight"):
        return None
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return 0.02 / math.sqrt(2 * a.n_layers)
    return 0.02


def init_tensor(name: str, shape: torch.Size, a: ModelArgs, seed: int, device) -> torch.Tensor:
    """The full initial value of one parameter: a pure function of (seed, name, shape, device
    type), so every rank and every world size starts from the same weights."""
    std = init_std(name, a)
    if std is None:
        return torch.ones(shape, device=device)
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest(), "little") >> 1)
    return torch.empty(shape, device=device).normal_(0.0, std, generator=g)


def count_params(a: ModelArgs) -> tuple[int, int]:
    """(all parameters, parameters without the token embedding)."""
    d, kv = a.d_model, a.n_kv_heads * a.head_dim
    block = d * d * 2 + d * kv * 2 + 3 * d * a.ffn_hidden + 2 * d
    emb = a.vocab_size * d
    total = emb + a.n_layers * block + d + a.vocab_size * d
    return total, total - emb


def flops_per_token(a: ModelArgs, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the weights plus 12*L*H*Q*T for attention (PaLM, app. B)."""
    _, n = count_params(a)
    return 6 * n + 12 * a.n_layers * a.n_heads * a.head_dim * seq_len

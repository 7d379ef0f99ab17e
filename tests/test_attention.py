"""Document masking through FlexAttention: the BlockMask path gives the same attention, logits and
gradients as SDPA with the dense same-document & causal mask, with and without GQA, and a
compiled block (fullgraph) takes the BlockMask as an argument. CPU, fp32, a few seconds."""

import pytest

torch = pytest.importorskip("torch")

import torch.nn.attention.flex_attention as FA  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tokenmill.trainer.model import (  # noqa: E402
    ModelArgs,
    Transformer,
    document_mask,
    flex_attend,
    use_flex,
)

# Eager flex_attention on CPU is the tested reference here; its "use torch.compile" advice is expected.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def doc_ids_of(lengths_per_row: list[list[int]]) -> torch.Tensor:
    """doc_ids [B, T] from each row's document lengths (every row sums to T)."""
    return torch.stack([torch.repeat_interleave(torch.arange(len(ls)), torch.tensor(ls)) for ls in lengths_per_row])


def positions_of(doc_ids: torch.Tensor) -> torch.Tensor:
    """Per-document positions (RoPE restarts at every document), as the loader makes them."""
    T = doc_ids.shape[1]
    idx = torch.arange(T).expand_as(doc_ids)
    start = torch.where(torch.cat([torch.ones_like(doc_ids[:, :1], dtype=torch.bool),
                                   doc_ids[:, 1:] != doc_ids[:, :-1]], 1), idx, 0)
    return idx - start.cummax(1).values


# T=200 spans two 128-token blocks, one partial; documents cross the block boundary.
MANY = [[30, 70, 50, 50], [5, 120, 75], [200], [1, 1, 198]]
ONE = [[200], [200]]


def args(n_heads: int, n_kv_heads: int, n_layers: int = 2) -> ModelArgs:
    return ModelArgs(vocab_size=64, n_layers=n_layers, d_model=32 * n_heads // 4, n_heads=n_heads,
                     n_kv_heads=n_kv_heads, ffn_hidden=64, max_seq_len=200)


@pytest.fixture
def cpu_flex_backward(monkeypatch):
    """torch 2.13 refuses flex_attention's backward on CPU (an up-front guard; the eager
    reference implementation underneath has one). Lift the guard so the gradients of the
    BlockMask formulation can be compared on CPU; on CUDA the compiled kernels run."""
    monkeypatch.setattr(FA, "_validate_device", lambda *a: None)


def test_device_choice():
    assert use_flex(torch.device("cuda")) and use_flex("cuda:1")
    assert not use_flex("cpu") and not use_flex(torch.device("cpu"))


@pytest.mark.parametrize("rows", [MANY, ONE], ids=["many-docs", "one-doc"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.slow
def test_flex_equals_dense_mask_sdpa(rows, heads):
    torch.manual_seed(0)
    (h, kv), doc = heads, doc_ids_of(rows)
    B, T, D = doc.shape[0], doc.shape[1], 16
    q, k, v = torch.randn(B, h, T, D), torch.randn(B, kv, T, D), torch.randn(B, kv, T, D)
    gqa = kv != h
    dense = document_mask(doc, flex=False)
    assert dense.shape == (B, 1, T, T) and dense.dtype == torch.bool
    block = document_mask(doc, flex=True)
    assert isinstance(block, FA.BlockMask) and block.shape == (B, 1, T, T)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=gqa)
    got = flex_attend(q, k, v, block, gqa)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if rows is ONE:  # one document per row is plain causal attention
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        torch.testing.assert_close(got, causal, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_transformer_logits_same_through_both_paths(heads):
    torch.manual_seed(0)
    m = Transformer(args(*heads)).eval()
    doc = doc_ids_of(MANY)
    tokens, pos = torch.randint(0, 64, doc.shape), positions_of(doc)
    with torch.no_grad():
        dense = m(tokens, pos, doc, flex=False)
        flex = m(tokens, pos, doc, flex=True)
        default = m(tokens, pos, doc)  # CPU: the dense path
        causal = m(tokens)
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)
    assert torch.equal(default, dense)
    # Row 2 is one document from position 0: the same as no masking at all.
    torch.testing.assert_close(flex[2], causal[2], atol=1e-5, rtol=1e-5)


def grads(m: Transformer, tokens, pos, doc, flex: bool) -> tuple[torch.Tensor, dict]:
    m.zero_grad(set_to_none=True)
    logits = m(tokens, pos, doc, flex=flex)
    F.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten()).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


def check_grads(device: str, atol: float) -> None:
    torch.manual_seed(0)
    m = Transformer(args(4, 2)).to(device)
    m.init_buffers(device)
    doc = doc_ids_of(MANY).to(device)
    tokens, pos = torch.randint(0, 64, doc.shape, device=device), positions_of(doc)
    logits_d, dense = grads(m, tokens, pos, doc, flex=False)
    logits_f, flex = grads(m, tokens, pos, doc, flex=True)
    torch.testing.assert_close(logits_f, logits_d, atol=atol, rtol=atol)
    assert dense.keys() == flex.keys() and len(dense) == 2 * 9 + 3
    for name in dense:
        torch.testing.assert_close(flex[name], dense[name], atol=atol, rtol=1e-4, msg=name)


def test_gradients_same_through_both_paths(cpu_flex_backward):
    check_grads("cpu", atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (compiled flex_attention)")
def test_gradients_same_through_both_paths_cuda():
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        check_grads("cuda", atol=1e-4)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def test_compiled_block_takes_the_block_mask():
    """parallel.compile wraps each Block in torch.compile(fullgraph=True): the BlockMask must go
    through as an argument with no graph break (the eager backend checks dynamo's trace alone)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = Transformer(args(4, 2)).eval()
    doc = doc_ids_of(MANY)
    tokens, pos = torch.randint(0, 64, doc.shape), positions_of(doc)
    with torch.no_grad():
        want = m(tokens, pos, doc, flex=True)
        for i, block in enumerate(m.layers):
            m.layers[i] = torch.compile(block, fullgraph=True, backend="eager")
        torch.testing.assert_close(m(tokens, pos, doc, flex=True), want, atol=1e-5, rtol=1e-5)
        # another batch's mask, same shapes: the compiled blocks are reused
        doc2 = doc_ids_of(ONE + ONE)
        torch.testing.assert_close(m(tokens, positions_of(doc2), doc2, flex=True),
                                   m(tokens, positions_of(doc2), doc2, flex=False), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()

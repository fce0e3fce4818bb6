"""Each backend receives every layer's spec and refuses what it cannot compute; `auto` picks one
that can run every layer, and a backend named explicitly that cannot is a clear error at start.
The torch backend runs what its fast paths lack (softcap) through the reference math."""

from __future__ import annotations

import random

import pytest
import torch

from engine.attention.base import PagedBatch
from engine.attention.registry import backend_for
from engine.attention.spec import AttentionSpec
from engine.attention.torch_paged import TorchPagedAttention
from engine.attention.triton_select import choose_auto_backend
from engine.config import ModelConfig
from engine.errors import InvalidRequest
from engine.kv_pool import KVLayout, KVPool

PLAIN = AttentionSpec.plain(0, 16)
WINDOW = AttentionSpec(1, 0.3, window=8)
SINKS = AttentionSpec(2, 0.25, sinks=torch.zeros(4))
SOFTCAP = AttentionSpec(3, 0.25, softcap=20.0)


def test_spec_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="window"):
        AttentionSpec(0, 0.1, window=0)
    with pytest.raises(ValueError, match="softcap"):
        AttentionSpec(0, 0.1, softcap=-1.0)
    assert SINKS.features == {"sinks"} and PLAIN.features == frozenset()


def test_a_named_backend_that_cannot_run_a_layer_is_refused() -> None:
    pytest.importorskip("triton")
    with pytest.raises(InvalidRequest, match=r"'triton'.*layer 1: window"):
        backend_for("triton", [PLAIN, WINDOW])
    with pytest.raises(InvalidRequest, match=r"'cpu'.*layer 3: softcap"):
        backend_for("cpu", [PLAIN, SOFTCAP])


def test_auto_falls_back_to_a_backend_that_runs_every_layer() -> None:
    assert backend_for("auto", [PLAIN, WINDOW, SINKS, SOFTCAP]) is TorchPagedAttention
    chosen = backend_for("auto", [PLAIN, WINDOW, SINKS])
    assert chosen.name == choose_auto_backend()  # the machine's choice runs windows and sinks


def test_torch_backend_softcap_equals_the_formula() -> None:
    """Softcapped scores (Gemma 2's tanh cap) through the paged torch backend, against the
    attention written out here."""
    rng = random.Random(0)
    cfg = ModelConfig(architecture="llama", num_layers=4, hidden_size=64, intermediate_size=8,
                      num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=32,
                      rope_theta=1e4, rms_norm_eps=1e-5, max_position_embeddings=256,
                      tie_word_embeddings=True)
    pool = KVPool(cfg, KVLayout(num_pages=16, page_size=4, bytes_per_page=0), torch.float32)
    pages = list(range(16))
    rng.shuffle(pages)
    table = torch.tensor(pages[:10])
    context, rows = 37, 9
    pool.k[3].normal_()
    pool.v[3].normal_()
    positions = torch.arange(context - rows, context)
    slots = table[positions // 4] * 4 + positions % 4
    batch = PagedBatch([rows], [context], slots, [table])
    q, k, v = torch.randn(rows, 4, 16) * 3, torch.randn(rows, 2, 16), torch.randn(rows, 2, 16)
    got = TorchPagedAttention(pool, batch)(SOFTCAP, q, k, v)
    every = (table.unsqueeze(1) * 4 + torch.arange(4)).flatten()[:context]
    keys = pool.flat_k(3)[every].repeat_interleave(2, dim=1).transpose(0, 1)
    values = pool.flat_v(3)[every].repeat_interleave(2, dim=1).transpose(0, 1)
    scores = q.transpose(0, 1) @ keys.transpose(1, 2) * SOFTCAP.scale
    scores = 20.0 * torch.tanh(scores / 20.0)
    causal = torch.arange(context).unsqueeze(0) <= positions.unsqueeze(1)
    scores = scores.masked_fill(~causal, float("-inf"))
    want = (torch.softmax(scores, dim=-1) @ values).transpose(0, 1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

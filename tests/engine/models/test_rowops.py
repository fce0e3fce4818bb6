"""The C row ops (engine.models.rowops) equal the torch expressions of the model's forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.config import ModelConfig, Rope
from engine.models import rowops
from engine.models.ops import apply_rotary, rms_norm
from engine.models.rope import rotary_tables

pytestmark = pytest.mark.skipif(rowops.kernel() is None, reason="the row-ops kernel is not built")


@pytest.mark.parametrize("num_rows", [0, 1, 3, 17, 64])
def test_rms_norm(num_rows: int) -> None:
    x = torch.randn(num_rows, 576) * 3
    w = torch.randn(576)
    torch.testing.assert_close(rowops.rms_norm(x, w, 1e-5), rms_norm(x, w, 1e-5),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("num_rows", "inter"), [(1, 96), (2, 96), (9, 100), (40, 101)])
def test_silu_mul(num_rows: int, inter: int) -> None:
    # 40 rows take the OpenMP path; widths off the 8-lane vectors take the scalar tail; the
    # scale reaches gates where e^-g would overflow a float unclamped.
    gate_up = torch.randn(num_rows, 2 * inter) * 4
    gate_up[:, 0] = torch.linspace(-200.0, 200.0, num_rows)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(rowops.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positions", [torch.tensor([0, 7, 300, 511]), torch.arange(0, 512, 8)])
def test_rotary_rotates_q_and_k_heads_only(positions: torch.Tensor) -> None:
    cfg = ModelConfig(architecture="llama", num_layers=1, hidden_size=64, intermediate_size=8,
                      num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=32,
                      rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=512,
                      tie_word_embeddings=True)
    cos, sin = rotary_tables(Rope(cfg.rope_theta), cfg.head_dim, cfg.max_position_embeddings,
                             torch.float32)
    num_rows = positions.shape[0]
    qkv = torch.randn(num_rows, cfg.q_size + 2 * cfg.kv_size)
    q, k, v = torch.split(qkv, [cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    want_q = apply_rotary(q.reshape(num_rows, 4, 16), c, s).reshape(num_rows, -1)
    want_k = apply_rotary(k.reshape(num_rows, 2, 16), c, s).reshape(num_rows, -1)
    want_v = v.clone()
    got = rowops.rotary_(qkv.clone(), cfg.num_heads + cfg.num_kv_heads, 16, positions, cos, sin)
    torch.testing.assert_close(got[:, : cfg.q_size], want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[:, cfg.q_size : cfg.q_size + cfg.kv_size], want_k,
                               rtol=1e-5, atol=1e-5)
    assert torch.equal(got[:, cfg.q_size + cfg.kv_size :], want_v)


def test_rotary_refuses_a_position_past_the_table() -> None:
    cos = sin = torch.zeros(8, 16)
    qkv = torch.randn(2, 32)
    before = qkv.clone()
    with pytest.raises(IndexError, match="position 8"):
        rowops.rotary_(qkv, 2, 16, torch.tensor([1, 8]), cos, sin)
    assert torch.equal(qkv, before)


def _bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """`got` (bf16, computed in fp32 and rounded once) against the fp32 expression: within one
    bf16 rounding step (2^-8 relative)."""
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-5)


@pytest.mark.parametrize("num_rows", [1, 17, 64])
def test_rms_norm_writes_bf16_rows(num_rows: int) -> None:
    x = torch.randn(num_rows, 576) * 3
    w = torch.randn(576)
    got = rowops.rms_norm(x, w, 1e-5, torch.bfloat16)
    _bf16_close(got, rms_norm(x, w, 1e-5))
    # Rounded to nearest even, as torch rounds: the same bits as casting the fp32 kernel's rows.
    assert torch.equal(got, rowops.rms_norm(x, w, 1e-5).to(torch.bfloat16))


@pytest.mark.parametrize(("num_rows", "inter"), [(1, 96), (40, 101), (3, 600)])
def test_silu_mul_on_bf16_rows(num_rows: int, inter: int) -> None:
    # 600 spans more than one of the kernel's fp32 staging blocks.
    gate_up = (torch.randn(num_rows, 2 * inter) * 4).to(torch.bfloat16)
    gate, up = gate_up.float().chunk(2, dim=-1)
    _bf16_close(rowops.silu_mul(gate_up), F.silu(gate) * up)


def test_rotary_on_bf16_rows() -> None:
    cfg = ModelConfig(architecture="llama", num_layers=1, hidden_size=64, intermediate_size=8,
                      num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=32,
                      rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=512,
                      tie_word_embeddings=True)
    cos, sin = rotary_tables(Rope(cfg.rope_theta), cfg.head_dim, cfg.max_position_embeddings,
                             torch.float32)
    positions = torch.arange(0, 512, 8)
    qkv = torch.randn(positions.shape[0], cfg.q_size + 2 * cfg.kv_size).to(torch.bfloat16)
    want = rowops.rotary_(qkv.float(), cfg.num_heads + cfg.num_kv_heads, 16, positions, cos,
                          sin)
    got = rowops.rotary_(qkv.clone(), cfg.num_heads + cfg.num_kv_heads, 16, positions, cos, sin)
    assert torch.equal(got, want.to(torch.bfloat16))

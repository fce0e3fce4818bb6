"""The residual streams a forward captures for EAGLE-3 (`forward_captured`) against transformers'
`output_hidden_states` on tiny random checkpoints: entry i is the stream entering layer i (0 the
embedding, L the last layer's output before the final norm), taken in the same pass as the
logits, which stay what `forward` gives. Also through the model runner over the paged pool, with
a prefill chunk after a cached prefix (the rows of the scheduled tokens, in batch order)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.attention.dense import DenseAttention
from engine.attention.registry import backend_for
from engine.core import Request
from engine.kv_pool import KVPool, plan_kv_layout
from engine.model_runner import ModelRunner
from engine.models.loader import load_model
from engine.scheduler.scheduler import ScheduledItem
from tests.tiny_hf import build_tiny

# The streams of 4 layers of width 64 with weights drawn at 0.2: fp32 sums in another order.
ATOL = 1e-4


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(request.param, tmp_path_factory.mktemp(request.param))


def _hf_streams(folder: Path, ids: list[int]) -> tuple[torch.Tensor, ...]:
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    hf.eval()
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_hidden_states=True)
    # transformers' last entry is after the final norm; before it is what layer L-1 wrote.
    return tuple(h[0] for h in out.hidden_states)


def test_captured_streams_match_transformers(folder: Path) -> None:
    loaded = load_model(str(folder), "fp32", show_progress=False, packed=False)
    model = loaded.model
    num_layers = model.config.num_layers
    ids = loaded.tokenizer.encode("def add(a, b):\n    return a + b\n" * 2)[:40]
    streams = _hf_streams(folder, ids)
    layers = (0, 1, num_layers // 2, num_layers - 1)
    n = len(ids)
    hidden, aux = model.forward_captured(torch.tensor(ids), torch.arange(n),
                                         DenseAttention([n]), layers)
    assert aux is not None and aux.shape == (n, len(layers) * model.config.hidden_size)
    for k, layer in enumerate(layers):
        part = aux[:, k * model.config.hidden_size:(k + 1) * model.config.hidden_size]
        diff = (part - streams[layer]).abs().max().item()
        assert diff < ATOL * max(1.0, streams[layer].abs().max().item()), (layer, diff)
    plain = model.forward(torch.tensor(ids), torch.arange(n), DenseAttention([n]))
    assert torch.equal(hidden, plain)
    _, last = model.forward_captured(torch.tensor(ids), torch.arange(n), DenseAttention([n]),
                                     (num_layers,))
    assert last is not None
    normed = torch.nn.functional.rms_norm(last, (last.shape[-1],), eps=model.config.rms_norm_eps)
    assert normed.shape == last.shape  # L: before the final norm (transformers applies it)
    with pytest.raises(ValueError, match="outside"):
        model.forward_captured(torch.tensor(ids), torch.arange(n), DenseAttention([n]),
                               (num_layers + 1,))


@dataclass(eq=False)
class _Seq:
    """What the model runner reads of a request: its ids and its pages."""

    all_ids: list[int]
    page_ids: list[int]
    draft_ids: list[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.all_ids)


def test_runner_captures_scheduled_rows(folder: Path) -> None:
    loaded = load_model(str(folder), "fp32", show_progress=False, packed=False)
    model = loaded.model
    layout = plan_kv_layout(model.config, 8 << 20, 16, model.kv_dtype)
    if layout.has_swa:
        pytest.skip("sliding-window pages: the runner test covers the full-attention families")
    runner = ModelRunner(model, KVPool(model.config, layout, model.kv_dtype),
                         backend_for("torch", model.attention_specs))
    ids = loaded.tokenizer.encode("one two three four five six seven eight nine ten " * 6)[:36]
    assert len(ids) == 36
    req = cast(Request, _Seq(ids, list(range(-(-len(ids) // layout.page_size)))))
    first, second = ScheduledItem(req, 0, 20), ScheduledItem(req, 20, 16)
    layers = (1, 2)
    _, aux_first = runner.run_captured([first], layers)
    logits, aux_second = runner.run_captured([second], layers)
    assert aux_first is not None and aux_second is not None
    n = len(ids)
    _, whole = model.forward_captured(torch.tensor(ids), torch.arange(n), DenseAttention([n]),
                                      layers)
    assert whole is not None
    torch.testing.assert_close(torch.cat([aux_first, aux_second]), whole, atol=ATOL, rtol=0)
    assert logits.shape[0] == 1

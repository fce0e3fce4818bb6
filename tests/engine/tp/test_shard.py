"""What each rank holds (engine.tp.shard), and the split checks that run before any rank
starts."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine.config import ModelConfig, MoEConfig
from engine.engine import Engine, EngineConfig
from engine.errors import InvalidParallelism
from engine.models.ggml_weight import GgmlWeight
from engine.models.loader import LoadedModel, load_model
from engine.models.weights import PackedWeights
from engine.tp.launch import check_options
from engine.tp.shard import check_split, shard_model
from tests.engine.tp.tp_runs import follower_pids
from tests.gguf_convert import convert

CONFIG = ModelConfig(architecture="llama", num_layers=2, hidden_size=64, intermediate_size=96,
                     num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=100,
                     rope_theta=1e4, rms_norm_eps=1e-5, max_position_embeddings=64,
                     tie_word_embeddings=True)


@pytest.mark.parametrize(("config", "tp", "message"), [
    (CONFIG, 3, "--tp 3 does not divide this model (llama): it has 4 attention heads, "
                "2 KV heads; --tp must divide each of 4 attention heads, 2 KV heads, 96 MLP "
                "intermediate units"),
    (CONFIG, 4, "it has 2 KV heads;"),
    (replace(CONFIG, intermediate_size=95), 2, "it has 95 MLP intermediate units;"),
    (replace(CONFIG, moe=MoEConfig(num_experts=3, top_k=2, intermediate_size=32,
                                   layers=(0, 1))), 2, "it has 3 experts;"),
    (CONFIG, 0, "--tp must be >= 1, got 0"),
])
def test_check_split_names_what_tp_does_not_divide(config: ModelConfig, tp: int,
                                                    message: str) -> None:
    with pytest.raises(InvalidParallelism, match=re.escape(message)):
        check_split(config, tp)


def test_moe_model_needs_no_dense_split() -> None:
    """Every layer sparse: the dense intermediate size is never split, so it need not divide."""
    moe = MoEConfig(num_experts=4, top_k=2, intermediate_size=32, layers=(0, 1))
    check_split(replace(CONFIG, intermediate_size=95, moe=moe), 2)


def test_engine_refuses_a_bad_tp_before_starting_ranks(tiny_llama: Path) -> None:
    loaded = load_model(str(tiny_llama), "fp32", show_progress=False)
    with pytest.raises(InvalidParallelism, match="--tp 3 does not divide"):
        Engine(loaded, EngineConfig(tp=3))
    with pytest.raises(InvalidParallelism, match="host or disk KV tier"):
        Engine(loaded, EngineConfig(tp=2, host_kv_memory_bytes=1 << 20))
    assert follower_pids() == []


@pytest.mark.parametrize(("config", "message"), [
    (EngineConfig(tp=2, host_kv_memory_bytes=1 << 20), "host or disk KV tier"),
    (EngineConfig(tp=2, kv_disk_bytes=1 << 20), "host or disk KV tier"),
    (EngineConfig(tp=2, device="mps"), "--tp runs on cpu or cuda, not 'mps'"),
    (EngineConfig(tp=2, device="gpu"), "device 'gpu' is not a torch device"),
    pytest.param(EngineConfig(tp=2, device="cuda"), "--tp 2 on cuda needs 2 GPUs",
                 marks=pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="2 GPUs")),
])
def test_options_that_do_not_run_with_tp(config: EngineConfig, message: str) -> None:
    with pytest.raises(InvalidParallelism, match=re.escape(message)):
        check_options(config)


@pytest.fixture(scope="module")
def q8_model(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = convert(tiny_llama, tmp_path_factory.mktemp("q8") / "q8_0.gguf", qtype="q8_0")
    return load_model(str(path), "fp32", show_progress=False)


def test_shards_keep_codes_on_block_boundaries(q8_model: LoadedModel) -> None:
    """q/k/v and gate/up rows keep their codes; o's 32 columns a rank keep theirs (one block);
    down's 48 are not whole blocks and become the dense slice (the same values). The ranks'
    weights tile the whole model's."""
    model = q8_model.model
    assert isinstance(model.packed, PackedWeights)
    shards = [shard_model(model, 2, rank) for rank in range(2)]
    for shard in shards:
        layer = shard.weights.layers[0]
        for name in ("qkv", "o", "gate_up"):
            assert isinstance(getattr(layer, name), GgmlWeight), name
        assert isinstance(layer.down, torch.Tensor)
        assert shard.packed is not None and shard.packed.decode_layers[0] is layer
        assert shard.config.num_heads == 2 and shard.config.num_kv_heads == 1

    def dense(weight: object) -> torch.Tensor:
        if isinstance(weight, GgmlWeight):
            return weight.dense()
        assert isinstance(weight, torch.Tensor)
        return weight

    whole = model.weights.layers[0]
    for name in ("o", "down"):  # the row-parallel ones: split along the input dim
        parts = [dense(getattr(s.weights.layers[0], name)) for s in shards]
        assert torch.equal(torch.cat(parts, dim=1), dense(getattr(whole, name))), name
    gate_up = [dense(s.weights.layers[0].gate_up) for s in shards]
    half = [g.chunk(2) for g in gate_up]  # each rank: its gate units, then its up units
    assert torch.equal(torch.cat([h[0] for h in half] + [h[1] for h in half]),
                       dense(whole.gate_up))
    assert isinstance(shards[1].weights.lm_head, torch.Tensor)
    assert shards[1].weights.lm_head.numel() == 0
    assert shards[0].weights.lm_head is model.weights.lm_head

"""Mixed precision (bf16 projections over an fp32 model): which steps take it, that it stays near
fp32, that the fp32 path is untouched, and how `--dtype auto` picks it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import cpu_isa
from engine.attention.dense import DenseAttention
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel, cpu_has_bf16, default_dtype, parse_dtype
from engine.models.weights import MixedPrecision
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams


def _hidden(loaded: LoadedModel, mixed: MixedPrecision | None, ids: list[int]) -> torch.Tensor:
    model = loaded.model.with_mixed_precision(mixed)
    token_ids = torch.tensor(ids)
    return model.forward(token_ids, torch.arange(len(ids)), DenseAttention([len(ids)]))


def test_mixed_forward_stays_near_fp32(tiny: LoadedModel) -> None:
    ids = list(range(100, 164))
    reference = _hidden(tiny, None, ids)
    mixed = _hidden(tiny, MixedPrecision(), ids)
    assert mixed.dtype == torch.float32  # the residual stream and the output stay fp32
    assert not torch.equal(mixed, reference)  # the projections really ran in bf16
    # bf16 keeps 8 mantissa bits (relative rounding 2^-9 per product input). The tiny model's
    # large random weights amplify it (4% here, measured); a wrong weight or a skipped layer
    # is off by ~100%. tests/e2e/test_mixed_precision.py bounds the real model tightly.
    relative = (mixed - reference).norm() / reference.norm()
    assert relative < 8e-2, f"relative error {relative:.4f}"


def test_steps_below_min_rows_run_the_fp32_path_exactly(tiny: LoadedModel) -> None:
    ids = list(range(200, 207))
    reference = _hidden(tiny, None, ids)
    assert torch.equal(_hidden(tiny, MixedPrecision(min_rows=len(ids) + 1), ids), reference)
    assert not torch.equal(_hidden(tiny, MixedPrecision(min_rows=len(ids)), ids), reference)


@pytest.mark.parametrize(("kv", "backend"), [(True, "auto"), (False, "auto"), (True, "torch"),
                                             (True, "torch_sdpa")])
def test_mixed_keeps_fp32_weights_and_its_kv_pool_dtype(tiny: LoadedModel, kv: bool,
                                                         backend: str) -> None:
    model = tiny.model.with_mixed_precision(MixedPrecision(kv=kv))
    assert model.dtype == torch.float32 and model.precision_name == "bf16+fp32"
    assert model.weights.layers[0].qkv.dtype == torch.float32  # the reference path is intact
    # Every CPU backend stores fp32 rows into the bf16 pool and attends in its dtype.
    engine = Engine(LoadedModel(tiny.path, model, tiny.tokenizer, 0.0),
                    EngineConfig(kv_memory_bytes=8 << 20, check_invariants=True,
                                 attention_backend=backend))
    # kv: the pool (and so extend attention) in bf16, half the bytes a decode step reads.
    assert engine.kv_pool.k[0].dtype == (torch.bfloat16 if kv else torch.float32)
    engine.submit(Extend("r", "t", None, list(range(300, 340)), SamplingParams(max_tokens=4)))
    done = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
    assert done[0].output_len == 4
    engine.check_invariants()


def test_auto_dtype_is_int8_on_every_cpu_class(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu_isa.CAP_ENV, raising=False)  # the flags below, uncapped
    assert default_dtype("cuda:0") == "bf16"
    assert default_dtype("cpu") == "int8"  # whatever the CPU: bf16 KV costs accuracy
    assert parse_dtype("mixed") == torch.float32
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    assert cpu_has_bf16(cpuinfo)
    cpuinfo.write_text("flags\t\t: fpu sse2 avx2 avx512f\n")
    assert not cpu_has_bf16(cpuinfo)
    assert not cpu_has_bf16(tmp_path / "missing")

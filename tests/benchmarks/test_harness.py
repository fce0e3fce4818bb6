"""The benchmark harness's pure parts: CPU class, targets, prompt windows, shapes, byte counts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from benchmarks.agent_replay import QUICK_CONTEXTS, SHORT_CONTEXTS, sweep_contexts
from benchmarks.common import model_tag
from benchmarks.cpu_class import cpu_class
from benchmarks.machine_limits import kv_bytes_read
from benchmarks.ready_probe import _vm_hwm_bytes
from benchmarks.replay_report import sweep_targets
from benchmarks.speed_cells import WINDOW_STRIDE, Windows, shapes_for
from benchmarks.speed_report import targets as speed_targets
from benchmarks.targets import Target, format_targets
from engine.config import FULL, SLIDING, ModelConfig

ZEN5_FLAGS = "fpu avx2 fma avx512f avx512bw avx512dq avx512vl avx512_vnni avx512_bf16"


def _cpuinfo(tmp_path: Path, vendor: str, family: int, model: int, name: str,
             flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    block = (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: "
             f"{model}\nmodel name\t: {name}\nflags\t\t: {flags}\n")
    path.write_text(block + "\n" + block.replace("processor\t: 0", "processor\t: 1"))
    return path


def test_cpu_class_names_generation_and_isa(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXGATE_MAX_CPU_ISA", raising=False)
    zen5 = _cpuinfo(tmp_path, "AuthenticAMD", 26, 2, "AMD EPYC", ZEN5_FLAGS)
    assert cpu_class(zen5) == "AMD EPYC Zen 5 (AVX512-VNNI/BF16, no AMX)"
    zen3 = _cpuinfo(tmp_path, "AuthenticAMD", 25, 1, "AMD EPYC 7B13", "avx2 fma")
    assert cpu_class(zen3) == "AMD EPYC 7B13 Zen 3 (AVX2, no AVX512, no AMX)"
    xeon = _cpuinfo(tmp_path, "GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8488C",
                    ZEN5_FLAGS + " amx_tile amx_bf16 amx_int8")
    assert cpu_class(xeon) == ("Intel Xeon Platinum 8488C (AVX512-VNNI/BF16, AMX-INT8/BF16)")
    monkeypatch.setenv("RADIXGATE_MAX_CPU_ISA", "avx2")
    assert cpu_class(zen5).endswith("[engine capped at avx2]")


def test_targets_judge_ratios_both_ways() -> None:
    assert Target("decode", "", 1.1, 1.0).verdict == "PASS"
    assert Target("decode", "", 0.9, 1.0).verdict == "FAIL"
    assert Target("ttft", "", 0.6, 0.7, at_most=True).verdict == "PASS"
    assert Target("ttft", "", 0.8, 0.7, at_most=True).verdict == "FAIL"
    missing = Target("prefill", "", None, 1.2)
    assert missing.verdict == "n/a"
    table = format_targets([missing], "Some CPU")
    assert "n/a" in table and "Some CPU" in table and ">= 1.2" in table


def test_windows_never_start_on_an_earlier_first_token() -> None:
    corpus = [7] * (3 * WINDOW_STRIDE) + list(range(3 * WINDOW_STRIDE))
    windows = Windows(corpus)
    taken = [windows.take(10) for _ in range(4)]
    firsts = [w[0] for w in taken]
    assert len(set(firsts)) == len(firsts)
    assert all(len(w) == 10 for w in taken)
    with pytest.raises(SystemExit):
        windows.take(len(corpus))


def test_shapes_per_context_length() -> None:
    small, big = shapes_for(8192, quick=False), shapes_for(32768, quick=False)
    assert small.prefill == (512, 2048, 8000) and small.long_context == 4000
    assert big.prefill == (2048, 8192) and big.long_context == 8192
    assert big.long_label == "8k" and small.long_label == "4k"
    for context_len in (8192, 32768):  # quick: one smoke shape set for every model
        quick = shapes_for(context_len, quick=True)
        assert max(*quick.prefill, quick.long_context) <= 2048


def test_kv_bytes_read_counts_sliding_layers_up_to_their_window() -> None:
    config = ModelConfig(
        architecture="llama", num_layers=4, hidden_size=64, intermediate_size=128,
        num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=32, rope_theta=1e4,
        rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=True)
    per_token_layer = 2 * 2 * 16 * 2  # K and V, 2 heads of 16, bf16
    assert kv_bytes_read(config, 2, 1000) == 4 * 1000 * per_token_layer
    sliding = dataclasses.replace(config, sliding_window=100,
                                  layer_types=(SLIDING, SLIDING, SLIDING, FULL))
    assert kv_bytes_read(sliding, 2, 1000) == (3 * 100 + 1000) * per_token_layer


def test_probe_reads_its_own_peak_rss() -> None:
    assert _vm_hwm_bytes() > 1 << 20


def test_sweep_contexts_per_model_and_quick() -> None:
    assert sweep_contexts(8192) == SHORT_CONTEXTS
    assert sweep_contexts(32768) == (2000, 8000, 16000, 32000)
    assert sweep_contexts(32768, quick=True) == QUICK_CONTEXTS


def _stats(value: float) -> dict[str, float]:
    return {"median": value, "min": value, "max": value, "n": 1}


def test_speed_targets_without_peers_are_not_judged() -> None:
    me = "radixgate-default"
    result = {"peers": [], "shapes": {"long_decode_context": 2048, "prefill": [512, 2048],
                                      "batch_size": 8},
              "decode_tok_s": {me: _stats(20.0)}, "decode_long_tok_s": {me: _stats(15.0)},
              "prefill_tok_s": {me: {"512": _stats(300.0), "2048": _stats(250.0)}},
              "batch_decode_tok_s": {me: _stats(100.0)}, "ready": {}, "file_bytes": 1 << 20}
    found = {t.name: t for t in speed_targets(result)}
    prefill = found["prefill 2048 cold: radixgate / faster peer"]
    assert prefill.verdict == "n/a" and prefill.measured == "250.0 tok/s; no peer ran"
    assert found["batch 8 aggregate / batch 1 decode"].ratio == 5.0


def test_uncached_target_notes_a_context_short_of_its_bound() -> None:
    row = {"context_len": 2000, "delta_len": 256, "ttft_cached_s": 0.5, "ttft_uncached_s": 5.0,
           "reused": {"radixgate": True}}
    (target,) = sweep_targets({"sweep": [row], "peers": []})
    assert target.ratio == 10.0 and target.verdict == "FAIL" and "32000" in target.note


def test_model_tag_keeps_dotted_names_whole() -> None:
    assert model_tag("qwen2.5-coder-1.5b") == "qwen2.5-coder-1.5b"
    assert model_tag("/models/SmolLM2-135M.Q4_1.gguf") == "SmolLM2-135M.Q4_1"

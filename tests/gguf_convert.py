"""HF checkpoint -> GGUF, laid out as llama.cpp's `convert_hf_to_gguf.py` (plus `llama-quantize` for
the types the converter cannot write), for testing GGUF loaders on the `tests.tiny_hf` families.

`convert(hf_folder, out_path, qtype=...)` handles LlamaForCausalLM and MistralForCausalLM (arch
`llama`), Qwen2ForCausalLM (`qwen2`), Qwen3ForCausalLM (`qwen3`), Qwen3MoeForCausalLM (`qwen3moe`)
and Gemma3ForCausalLM (`gemma3`). GptOssForCausalLM raises `NotImplementedError`: nothing here could
check such a file (transformers' GGUF reader expects other expert and sink names than llama.cpp's)
and no GGUF key carries its yarn `truncate: false`.

Tensors, as the converter's model classes write them (HF `(out, in)` = ggml `ne {in, out}`):
- gguf-py's name map (`token_embd`, `output_norm`, `output` unless tied, `blk.N.attn_q` ...).
- `llama`: attn_q/attn_k rows (and biases) permuted (`LlamaModel.permute`); for llama3 rope a
  `rope_freqs.weight` F32 of head_dim/2 divisors of the base frequencies
  (`LlamaModel.generate_extra_tensors`) and no rope-scaling keys.
- `qwen3moe`: experts stacked to `ffn_{gate,up}_exps` (E, I, H) and `ffn_down_exps` (E, H, I), from
  per-expert keys or a fused `gate_up_proj` (gate rows first); router `ffn_gate_inp` (E, H).
- `gemma3`: every `*norm.weight` stored +1 (q/k norms too); no `output` (tied).
Metadata as `TextModel.set_gguf_parameters`: block_count, context_length, embedding_length,
feed_forward_length, head_count(_kv), rope.freq_base (+ freq_base_swa with local-layer rope),
layer_norm_rms_epsilon, expert_count/expert_used_count, key/value_length when the config has
head_dim, file_type; llama adds vocab_size and rope.dimension_count, qwen3moe
expert_feed_forward_length, gemma3 sliding_window. `general.name` comes from the folder name as the
converter derives it ("mistral" -> "Mistral"); the tokenizer keys are SmolLM2-135M's GGUF's.

Deliberate deviations, each where the converter would write a file that disagrees with HF:
- llama3 `rope_freqs` read original_max_position_embeddings from the rope parameters (transformers 5
  keeps it only there); the converter reads a top-level key and defaults to 8192, which is the same
  for every real Llama 3.x but not for the tiny models' 256.
- Unrepresentable configs raise `ValueError` instead of converting: qwen3moe with dense layers
  (`mlp_only_layers`, `decoder_sparse_step != 1`: llama.cpp builds every layer as MoE) or
  `norm_topk_prob` false (llama.cpp always renormalises); gemma3 with `query_pre_attn_scalar` !=
  head_dim (no key carries it; llama.cpp uses 1/sqrt(key_length)); any other arch with an active
  sliding window shorter than the context (no window key); rope types but default/linear/llama3.

Tensor types: 1-D tensors, `*_norm.weight`, non-`.weight` tensors (biases), `ffn_gate_inp` and
`rope_freqs` stay F32 (the converter's rule). Other tensors by `qtype`:
- "f32", "f16", "bf16", "q8_0": every such tensor in that type (the converter's outtypes).
- "q4_0", "q4_1", "q4_k", "q5_k", "q6_k": every such tensor in that type (`llama-quantize --pure`).
- "q4_k_m": llama-quantize's Q4_K_M mix: Q4_K; Q6_K for attn_v and ffn_down of layers where
  `use_more_bits` (i < n/8, i >= 7n/8 or (i - n/8) % 3 == 2: layers 2, 3 of 4; 2, 5 of 6) and for
  `output` (`token_embd` when tied); with 8 experts attn_v and attn_k Q8_0, attn_output Q5_K.
Rows that do not split into whole blocks fall back as llama-quantize does: Q4_K -> Q5_0,
Q5_K -> Q5_1, Q6_K -> Q8_0, then F16 if not a multiple of 32 either; Q8_0, Q4_0, Q4_1 -> F16.
At hidden 64 K-quants fit no tensor, so the q*_k options write Q5_0, Q5_1 and Q8_0: build with
`overrides={"hidden_size": 256, "intermediate_size": 512}` (and `moe_intermediate_size` 256) for
real K-quant rows everywhere but attn_output (rows of heads*head_dim = 64).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from safetensors.torch import load_file
from transformers import AutoConfig

from tests.gguf_kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from tests.tiny_hf import smollm2_tokenizer_fields

ARCHS: Mapping[str, str] = MappingProxyType({
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3moe", "Gemma3ForCausalLM": "gemma3",
})
QTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k", "q4_k_m")
_BASE = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0,
         "q4_1": T.Q4_1, "q4_k": T.Q4_K, "q5_k": T.Q5_K, "q6_k": T.Q6_K, "q4_k_m": T.Q4_K}
_FTYPE = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0",
          "q4_0": "MOSTLY_Q4_0", "q4_1": "MOSTLY_Q4_1", "q4_k": "MOSTLY_Q4_K_S",
          "q5_k": "MOSTLY_Q5_K_S", "q6_k": "MOSTLY_Q6_K", "q4_k_m": "MOSTLY_Q4_K_M"}
_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
_KQUANT = {T.Q4_K: quantize_q4_k, T.Q5_K: quantize_q5_k, T.Q6_K: quantize_q6_k}
_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
_FUSED = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up|down)_proj")


def _rope(hp: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """(full-attention rope parameters, local-layer rope theta or None) from either config form."""
    rope = dict(hp.get("rope_parameters") or hp.get("rope_scaling") or {})
    full = dict(rope.get("full_attention", rope))
    full.setdefault("rope_theta", hp.get("rope_theta", 10000.0))
    return full, rope.get("sliding_attention", {}).get("rope_theta")


def _check_representable(arch: str, hp: dict[str, Any]) -> None:
    """Raise `ValueError` for configs llama.cpp's GGUF cannot express (module doc)."""
    if arch == "qwen3moe":
        if hp.get("mlp_only_layers") or hp.get("decoder_sparse_step", 1) != 1:
            raise ValueError("qwen3moe GGUFs have no dense layers (llama.cpp builds every layer as "
                             "MoE): build with mlp_only_layers=[] and decoder_sparse_step=1")
        if not hp.get("norm_topk_prob", False):
            raise ValueError("llama.cpp always renormalises qwen3moe top-k weights: "
                             "norm_topk_prob must be true")
    if (kind := _rope(hp)[0].get("rope_type", "default")) not in ("default", "linear", "llama3"):
        raise ValueError(f"rope_type {kind!r}: only default, linear and llama3 are converted")
    window = hp.get("sliding_window") if hp.get("use_sliding_window", True) else None
    if arch != "gemma3" and window and window < hp["max_position_embeddings"]:
        raise ValueError(f"{arch} GGUFs have no sliding window: llama.cpp would attend to all "
                         f"tokens where the model sees {window}")
    if arch == "gemma3" and hp.get("query_pre_attn_scalar", hp["head_dim"]) != hp["head_dim"]:
        raise ValueError("gemma3 GGUFs carry no query_pre_attn_scalar (llama.cpp scales by "
                         "1/sqrt(key_length)): build with query_pre_attn_scalar == head_dim")


def _llama3_factors(hp: dict[str, Any], rope: dict[str, Any]) -> torch.Tensor:
    """`rope_freqs`: llama.cpp divides base frequency i by factor i (generate_extra_tensors)."""
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope.get("original_max_position_embeddings",
                   hp.get("original_max_position_embeddings", 8192))
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """LlamaModel.permute: each head's rotate-half pairs become adjacent rows (ggml's rope)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def _hf_tensors(folder: Path, hp: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors in fp32, tied `lm_head` dropped, then the experts of each layer
    as `mlp.experts.{gate,up,down}_proj` (E, out, in), whichever layout the folder holds."""
    raw: dict[str, torch.Tensor] = {}
    for part in sorted(folder.glob("*.safetensors")):
        raw.update(load_file(part))
    per_expert: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    stacked: dict[tuple[int, str], torch.Tensor] = {}
    for name, tensor in raw.items():
        t = tensor.float()
        if name == "lm_head.weight" and hp.get("tie_word_embeddings"):
            continue
        if m := _EXPERT.fullmatch(name):
            per_expert.setdefault((int(m[1]), m[3]), {})[int(m[2])] = t
        elif m := _FUSED.fullmatch(name):  # gate_up (E, 2I, H) with gate rows first; down (E, H, I)
            layer = int(m[1])
            if m[2] == "down":
                stacked[layer, "down"] = t
            else:
                stacked[layer, "gate"], stacked[layer, "up"] = t.chunk(2, dim=1)
        else:
            yield name, t
    for key, by_id in per_expert.items():
        stacked[key] = torch.stack([by_id[i] for i in range(len(by_id))])
    # One order for both layouts, so that they convert to the same bytes.
    for (layer, proj), t in sorted(stacked.items()):
        yield f"model.layers.{layer}.mlp.experts.{proj}_proj", t


def _gguf_tensors(folder: Path, hp: dict[str, Any], arch: str) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, fp32 array) pairs in the converter's layout (module doc)."""
    rope, _ = _rope(hp)
    if arch == "llama" and rope.get("rope_type") == "llama3":
        yield "rope_freqs.weight", _llama3_factors(hp, rope).numpy()
    names = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), hp["num_hidden_layers"])
    for name, t in _hf_tensors(folder, hp):
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight",
                                              "k_proj.bias")):
            heads = hp["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            t = _permute(t, heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            t = t + 1.0  # Gemma3RMSNorm computes x * (1 + w); ggml multiplies by the weight
        stem, dot, suffix = name.rpartition(".")
        if suffix not in ("weight", "bias"):
            stem, dot, suffix = name, ".", "weight"
        mapped = names.get_name(stem)
        if mapped is None:
            raise ValueError(f"{name}: no {arch} GGUF tensor for it")
        yield f"{mapped}{dot}{suffix}", t.numpy()


def _choose_type(name: str, data: np.ndarray, qtype: str, hp: dict[str, Any],
                 has_output: bool) -> T:
    """The GGML type of one tensor (module doc: converter rules, then llama-quantize's)."""
    if (data.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
            or ".ffn_gate_inp." in name or name == "rope_freqs.weight"):
        return T.F32
    kind = _BASE[qtype]
    if qtype == "q4_k_m":
        n = hp["num_hidden_layers"]
        i = int(name.split(".")[1]) if name.startswith("blk.") else -1
        more_bits = i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2
        eight_experts = (hp.get("num_local_experts") or hp.get("num_experts")) == 8
        if name == "output.weight" or (name == "token_embd.weight" and not has_output):
            kind = T.Q8_0 if data.shape[-1] % 256 else T.Q6_K
        elif ".attn_v." in name:
            kind = T.Q8_0 if eight_experts else T.Q6_K if more_bits else T.Q4_K
        elif ".attn_k." in name and eight_experts:
            kind = T.Q8_0
        elif ".ffn_down" in name and more_bits:
            kind = T.Q6_K
        elif ".attn_output." in name and eight_experts:
            kind = T.Q5_K
    block = gguf.GGML_QUANT_SIZES[kind][0]
    if data.shape[-1] % block:
        kind = _FALLBACK.get(kind, T.F16)
        if data.shape[-1] % gguf.GGML_QUANT_SIZES[kind][0]:
            kind = T.F16
    return kind


def _encode(data: np.ndarray, kind: T) -> np.ndarray:
    """`data` as stored for `kind`: float arrays or uint8 blocks (rows, bytes) per gguf-py."""
    if kind in _KQUANT:
        blocks = _KQUANT[kind](data.reshape(-1, data.shape[-1]))
        return blocks.reshape(*data.shape[:-1], blocks.shape[-1])
    return gguf.quants.quantize(data.astype(np.float32), kind)


def _write_metadata(w: gguf.GGUFWriter, hp: dict[str, Any], arch: str, qtype: str,
                    name: str, cache_dir: Path | None) -> None:
    rope, local_theta = _rope(hp)
    w.add_type("model")
    w.add_name(name)
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp["num_key_value_heads"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_freq_base(rope["rope_theta"])
    if local_theta is not None:
        w.add_rope_freq_base_swa(local_theta)
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    if n_experts := hp.get("num_local_experts") or hp.get("num_experts"):
        w.add_expert_count(n_experts)
        w.add_expert_used_count(hp["num_experts_per_tok"])
    if hp.get("head_dim"):
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])
    w.add_file_type(gguf.LlamaFileType[_FTYPE[qtype]])
    if arch == "llama":
        w.add_vocab_size(hp["vocab_size"])
        w.add_rope_dimension_count(hp["head_dim"])  # AutoConfig always fills head_dim for llama
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    if arch == "gemma3":
        w.add_sliding_window(hp["sliding_window"])
        if hp.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, (types, value) in smollm2_tokenizer_fields(cache_dir).items():
        if key == "tokenizer.ggml.tokens" and len(value) != hp["vocab_size"]:
            raise ValueError(f"vocab_size {hp['vocab_size']} != SmolLM2's {len(value)} tokens")
        sub = gguf.GGUFValueType(types[1]) if len(types) > 1 else None
        w.add_key_value(key, value, gguf.GGUFValueType(types[0]), sub_type=sub)


def convert(hf_folder: Path, out_path: Path, *, qtype: str = "f32",
            cache_dir: Path | None = None) -> Path:
    """Write `hf_folder` (a `tests.tiny_hf` checkpoint) as a GGUF at `out_path`; return it.

    `qtype` is one of `QTYPES` (module doc). Raises `NotImplementedError` for architectures not in
    `ARCHS` and `ValueError` for configs a llama.cpp GGUF cannot represent. `cache_dir` caches
    SmolLM2's tokenizer fields (`tests.tiny_hf.smollm2_tokenizer_fields`).
    """
    if qtype not in QTYPES:
        raise ValueError(f"qtype {qtype!r} is not one of {QTYPES}")
    hp = AutoConfig.from_pretrained(hf_folder).to_dict()
    hf_arch = hp["architectures"][0]
    if hf_arch not in ARCHS:
        raise NotImplementedError(f"{hf_arch}: no GGUF conversion here (supported: {list(ARCHS)})")
    arch = ARCHS[hf_arch]
    _check_representable(arch, hp)
    tensors = list(_gguf_tensors(hf_folder, hp, arch))
    has_output = any(name == "output.weight" for name, _ in tensors)
    writer = gguf.GGUFWriter(out_path, arch)
    model_name = gguf.Metadata.load(None, hf_folder, None).name or hf_folder.name
    _write_metadata(writer, hp, arch, qtype, model_name, cache_dir)
    for name, data in tensors:
        kind = _choose_type(name, data, qtype, hp, has_output)
        writer.add_tensor(name, _encode(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path

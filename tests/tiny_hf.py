"""Tiny random-weight HF checkpoints of several model families, written as complete model folders.

`build_tiny(family, folder)` writes `config.json`, `generation_config.json`, `model.safetensors`
(fp32), SmolLM2-135M's `tokenizer.json` and a `tokenizer_config.json` (bos `<|im_start|>`, eos
`<|im_end|>`, SmolLM2's chat template). Loader tests compare an engine against transformers on them.

Shared shape: vocab 49152 (SmolLM2's), hidden 64, 4 heads, 2 KV heads, head_dim 16, intermediate
96, 4 layers, max_position_embeddings 2048, rms_norm_eps 1e-5, bos 1, eos 2. Per family:

- `llama`: LlamaForCausalLM, rope_theta 1e4, untied embeddings.
- `llama31`: as llama with rope_theta 5e5 and llama3 rope scaling (factor 8, low 1, high 4,
  original_max_position_embeddings 256): for head_dim 16 that leaves two frequencies, smooths one
  and divides five by 8, so all three branches of the llama3 formula matter within 48 tokens.
- `qwen2`: Qwen2ForCausalLM (q/k/v biases, o without), tied embeddings.
- `mistral`: MistralForCausalLM, sliding_window null, untied.
- `qwen3`: Qwen3ForCausalLM, head_dim 32 (not hidden/heads), q/k norms, tied.
- `qwen3_moe`: Qwen3MoeForCausalLM, 8 experts, top-2, moe_intermediate_size 32, norm_topk_prob,
  decoder_sparse_step 1, mlp_only_layers [1] (layer 1 dense); untied.
- `gemma3`: Gemma3ForCausalLM (Gemma3TextConfig), 6 layers (5 sliding + 1 full), sliding_window 8,
  query_pre_attn_scalar 24, rope 1e6 global / 1e4 local, tied.
- `gpt_oss`: GptOssForCausalLM, 4 experts top-2, sliding_window 8, alternating layer_types, the
  default yarn rope (factor 32 over 4096, theta 150000); max_position_embeddings 131072 (= 4096*32,
  its real value: HF warns when the two disagree), untied.

Weights: `initializer_range` 0.2 (at 0.02 attention is so flat that a wrong RoPE still gives the
same tokens), `0.2*sqrt(64/hidden_size)` when hidden_size is overridden to keep that sharpness.
Then every parameter that initialises to a constant is redrawn from a generator seeded with
`seed`: RMSNorm weights `1 + 0.2*N(0,1)` (Gemma's too, though it uses them as `x*(1+w)`: an
effective scale near 2), every bias `0.2*N(0,1)`, gpt-oss attention sinks `N(0,1)`; gemma3's
(tied, sqrt(hidden)-scaled) embeddings are halved so greedy decoding does not just repeat the
last token. Every family's logits have a standard deviation near 1.6.

Tensor names written (the per-layer ones under `model.layers.N.`):
- attention: `self_attn.{q,k,v,o}_proj.weight`; qwen2 `.{q,k,v}_proj.bias`; gpt_oss all four
  biases and `self_attn.sinks` (heads,); qwen3/qwen3_moe/gemma3 `self_attn.{q,k}_norm.weight`.
- dense MLP: `mlp.{gate,up,down}_proj.weight`; norms `input_layernorm`, `post_attention_layernorm`
  (gemma3 adds `pre_feedforward_layernorm`, `post_feedforward_layernorm`); `model.norm`,
  `model.embed_tokens`, `lm_head` (untied families only).
- qwen3_moe experts: router `mlp.gate.weight` (E, H). With `fused_experts=False` (the default,
  transformers' `save_original_format=True`): `mlp.experts.{e}.{gate,up}_proj.weight` (I, H) and
  `mlp.experts.{e}.down_proj.weight` (H, I) per expert. With `fused_experts=True`, transformers 5's
  in-memory layout: `mlp.experts.gate_up_proj` (E, 2I, H), gate rows first, and
  `mlp.experts.down_proj` (E, H, I); no `.weight` suffix.
- gpt_oss experts, the same either way (HF's format is already fused): router
  `mlp.router.{weight (E, H), bias (E,)}`, `mlp.experts.gate_up_proj` (E, H, 2I) with gate and up
  interleaved (`[..., ::2]` gate), `gate_up_proj_bias` (E, 2I), `down_proj` (E, I, H),
  `down_proj_bias` (E, H).

`overrides` replaces config fields after the family's own, e.g. `{"hidden_size": 256,
"intermediate_size": 512}` to give K-quants whole 256-value rows, or `{"mlp_only_layers": []}`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedConfig

from engine.models.locate import embedded_gguf_path
from tests.engine.hf_oracle import load_hf_oracle

FAMILIES: tuple[str, ...] = (
    "llama", "llama31", "qwen2", "mistral", "qwen3", "qwen3_moe", "gemma3", "gpt_oss",
)


def _config(family: str, overrides: Mapping[str, Any]) -> PreTrainedConfig:
    """The family's transformers config, `overrides` applied last."""
    common: dict[str, Any] = {
        "vocab_size": 49152, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
        "num_hidden_layers": 4, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "tie_word_embeddings": False,
    }
    default_rope = {"rope_type": "default", "rope_theta": 10000.0}
    llama3_rope = {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 256,
    }
    per_family: dict[str, tuple[type[PreTrainedConfig], dict[str, Any]]] = {
        "llama": (transformers.LlamaConfig, {"rope_parameters": default_rope}),
        "llama31": (transformers.LlamaConfig, {"rope_parameters": llama3_rope}),
        # Qwen2Config has no head_dim field: it is hidden/heads (16) there.
        "qwen2": (transformers.Qwen2Config, {"head_dim": None, "tie_word_embeddings": True}),
        "mistral": (transformers.MistralConfig, {"sliding_window": None}),
        "qwen3": (transformers.Qwen3Config, {"head_dim": 32, "tie_word_embeddings": True}),
        "qwen3_moe": (transformers.Qwen3MoeConfig, {
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [1],
        }),
        "gemma3": (transformers.Gemma3TextConfig, {
            "num_hidden_layers": 6, "sliding_window": 8, "query_pre_attn_scalar": 24,
            "tie_word_embeddings": True,
        }),
        "gpt_oss": (transformers.GptOssConfig, {
            "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
            "max_position_embeddings": 131072,
        }),
    }
    if family not in per_family:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    cls, own = per_family[family]
    # Keep q.k logits (and so attention sharpness) as at hidden 64 when the width is overridden.
    common["initializer_range"] = 0.2 * (64 / overrides.get("hidden_size", 64)) ** 0.5
    kwargs = {**common, **own, **overrides}
    kwargs = {k: v for k, v in kwargs.items() if not (k == "head_dim" and v is None)}
    return cls(**kwargs)


def _perturb(model: torch.nn.Module, family: str, seed: int) -> None:
    """Redraw the constant-initialised parameters (norms, biases, sinks); see the module doc."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith("norm.weight"):
                # Gemma's stored w is used as (1 + w): drawing it around 1 like everyone else's
                # doubles the effective scale, which sharpens attention behind its q/k norms (at
                # scale 1 it is nearly uniform), and makes a missing or doubled +1 glaring.
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith(("bias", "_bias")):
                param.copy_(0.2 * noise)
            elif name.endswith("sinks"):
                param.copy_(noise)
            elif family == "gemma3" and name.endswith("embed_tokens.weight"):
                # Gemma multiplies embeddings by sqrt(hidden) = 8 and ties them to the output: at
                # full size each token's own embedding dominates the residual stream and greedy
                # decoding repeats the last token. Half the scale breaks that.
                param.mul_(0.5)


def default_cache_dir() -> Path:
    """Where the SmolLM2 tokenizer JSON is cached between runs (a folder in the temp dir)."""
    folder = Path(tempfile.gettempdir()) / "radixgate-tiny-hf"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_tokenizer(folder: Path, cache_dir: Path | None = None) -> None:
    """Write SmolLM2-135M's `tokenizer.json` and `tokenizer_config.json` into `folder`.

    The tokenizer is what transformers builds from the embedded SmolLM2 GGUF (`hf_oracle`, ~12 s
    the first time, then read from `cache_dir`), with SmolLM2's own pre-tokenizer put back (digits
    split one by one, then byte-level), as `tests/engine/test_tokenizer.py` does.
    """
    oracle = load_hf_oracle(embedded_gguf_path(), cache_dir or default_cache_dir())
    spec = json.loads(oracle.tokenizer_json)
    smollm = json.loads(oracle.backend(smollm_pretokenizer=True).to_str())
    spec["pre_tokenizer"] = smollm["pre_tokenizer"]
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": oracle.bos_token,
        "eos_token": oracle.eos_token,
        "chat_template": oracle.chat_template,
        "model_max_length": 2048,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def smollm2_tokenizer_fields(cache_dir: Path | None = None) -> dict[str, tuple[list[int], Any]]:
    """SmolLM2-135M's `tokenizer.*` GGUF keys as {key: (value types, value)}.

    Parsing the GGUF takes ~4 s, so the fields are cached as JSON in `cache_dir` (default
    `default_cache_dir()`), keyed by the file's name, size and mtime.
    """
    path = embedded_gguf_path()
    stat = path.stat()
    key = f"{path.name}-{stat.st_size}-{stat.st_mtime_ns}"
    entry = (cache_dir or default_cache_dir()) / f"{key}.json"
    if entry.exists():
        return {k: (v[0], v[1]) for k, v in json.loads(entry.read_text("utf-8")).items()}
    reader = gguf.GGUFReader(path)
    fields = {key: ([int(t) for t in f.types], f.contents())
              for key, f in reader.fields.items() if key.startswith("tokenizer.")}
    partial = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")  # atomic for concurrent runs
    partial.write_text(json.dumps(fields), encoding="utf-8")
    partial.replace(entry)
    return fields


def build_tiny(
    family: str,
    folder: Path,
    *,
    seed: int = 0,
    fused_experts: bool = False,
    overrides: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
) -> Path:
    """Write the tiny `family` checkpoint (see the module doc) into `folder` and return `folder`.

    Deterministic in (`family`, `seed`, `overrides`): the same arguments write the same weights.
    `fused_experts` picks the qwen3_moe expert layout on disk (module doc); it changes nothing for
    the other families. `cache_dir` caches the tokenizer (default: `default_cache_dir()`).
    """
    config = _config(family, overrides or {})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    _perturb(model, family, seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, save_original_format=not fused_experts)
    write_tokenizer(folder, cache_dir)
    return folder

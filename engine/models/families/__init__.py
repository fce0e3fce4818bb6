"""The model families radixgate runs, chosen by HF `architectures`/`model_type` or GGUF
`general.architecture`: each fills in a `ModelConfig` and a tensor name map, and all of them run
on the one decoder (engine.models.decoder). An architecture not listed here is refused at start
with the list of supported ones."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.config import ModelConfig
from engine.errors import UnsupportedModel
from engine.models.families import gemma3, gpt_oss, llama, qwen3
from engine.models.tensor_map import Rule
from engine.tokenizer_gguf import GGUFTensor

HFConfigFn = Callable[[Mapping[str, Any]], ModelConfig]
HFRulesFn = Callable[[ModelConfig, Mapping[str, Any]], list[Rule]]
GGUFConfigFn = Callable[[Mapping[str, Any], Mapping[str, GGUFTensor]], ModelConfig]
GGUFRulesFn = Callable[[ModelConfig, str], list[Rule]]


@dataclass(frozen=True)
class Family:
    name: str
    hf_architectures: tuple[str, ...]
    hf_model_types: tuple[str, ...]
    gguf_architectures: tuple[str, ...]
    hf_config: HFConfigFn
    hf_rules: HFRulesFn
    gguf_config: GGUFConfigFn | None = None
    gguf_rules: GGUFRulesFn | None = None


FAMILIES = (
    Family("llama", ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"),
           ("llama", "mistral", "qwen2"), ("llama", "qwen2"),
           llama.config_from_hf, llama.hf_rules, llama.config_from_gguf, llama.gguf_rules),
    Family("qwen3", ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"), ("qwen3", "qwen3_moe"),
           ("qwen3", "qwen3moe"),
           qwen3.config_from_hf, qwen3.hf_rules, qwen3.config_from_gguf, qwen3.gguf_rules),
    Family("gemma3", ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
           ("gemma3_text", "gemma3"), ("gemma3",),
           gemma3.config_from_hf, gemma3.hf_rules, gemma3.config_from_gguf, gemma3.gguf_rules),
    Family("gpt_oss", ("GptOssForCausalLM",), ("gpt_oss",), (),
           gpt_oss.config_from_hf, gpt_oss.hf_rules),
)


def supported_hf() -> list[str]:
    return sorted(a for f in FAMILIES for a in f.hf_architectures)


def supported_gguf() -> list[str]:
    return sorted(a for f in FAMILIES for a in f.gguf_architectures)


def for_hf(cfg: Mapping[str, Any]) -> Family:
    """The family of a config.json, by `architectures` (then `model_type`)."""
    architectures = list(cfg.get("architectures") or [])
    model_type = str(cfg.get("model_type", ""))
    for family in FAMILIES:
        if any(a in family.hf_architectures for a in architectures):
            return family
    for family in FAMILIES:
        if not architectures and model_type in family.hf_model_types:
            return family
    named = architectures[0] if architectures else f"model_type '{model_type}'"
    raise UnsupportedModel(f"architecture {named} is not supported; supported: "
                           f"{', '.join(supported_hf())}")


def for_gguf(arch: str) -> Family:
    """The family of a GGUF file's `general.architecture`."""
    for family in FAMILIES:
        if arch in family.gguf_architectures:
            return family
    raise UnsupportedModel(f"GGUF architecture '{arch}' is not supported; supported: "
                           f"{', '.join(supported_gguf())}")

"""Model-free tests of the vocabulary readers: GGUF metadata, tokenizer.json, merge order, and
the single-regex form of SmolLM2's two-pass pre-tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.convert_slow_tokenizer import bytes_to_unicode

from engine.errors import UnsupportedModel
from engine.tokenizer import Tokenizer
from engine.tokenizer_gguf import read_gguf_metadata
from engine.tokenizer_vocab import (
    BYTE_ALPHABET,
    GPT2_PATTERN,
    SMOLLM_PATTERN,
    check_merge_order,
)


def _two_pass_split(text: str) -> list[str]:
    """SmolLM2's pre-tokenizer as HF and llama.cpp run it: isolate numerals, then GPT-2's regex
    inside each remaining span."""
    pieces: list[str] = []
    for span in regex.split(r"(\p{N})", text):
        pieces += regex.findall(GPT2_PATTERN, span) if span else []
    return pieces


@settings(max_examples=500, deadline=None)
@given(st.text(st.sampled_from("ab1٢ \t\n'.s!é中\u00a0"), max_size=20))
def test_smollm_pattern_equals_two_pass_split(text: str) -> None:
    assert regex.findall(SMOLLM_PATTERN, text) == _two_pass_split(text)


def test_byte_alphabet_is_gpt2s() -> None:
    gpt2 = bytes_to_unicode()  # type: ignore[no-untyped-call]
    assert tuple(gpt2[b] for b in range(256)) == BYTE_ALPHABET


def test_from_tokenizer_json_rejects_other_pre_tokenizers(tmp_path: Path) -> None:
    spec = {
        "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁"},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(UnsupportedModel, match="pre_tokenizer"):
        Tokenizer.from_tokenizer_json(tmp_path / "tokenizer.json")


def test_check_merge_order() -> None:
    ids = {"a": 0, "b": 1, "ab": 2, "abb": 3, "ba": 4}
    check_merge_order(ids, ["a b", "ab b", ("b", "a")])
    with pytest.raises(UnsupportedModel, match="merge order"):
        check_merge_order(ids, ["b a", "a b"])
    with pytest.raises(UnsupportedModel, match="not in the vocabulary"):
        check_merge_order(ids, ["a a"])


def _write_tiny_gguf(path: Path) -> list[str]:
    """A model-free GGUF: every byte, four merges, two control tokens."""
    tokens = ["<|im_start|>", "<|im_end|>", *BYTE_ALPHABET]
    merges = ["Ġ t", "h e", "Ġt he", "Ġ Ġ"]
    tokens += [m.replace(" ", "") for m in merges]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    writer.add_float32("test.float", 0.5)
    writer.add_array("test.ints", [1, -2, 3])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return tokens


def test_tiny_gguf_reader_and_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    tokens = _write_tiny_gguf(path)
    meta = read_gguf_metadata(path)
    assert meta["tokenizer.ggml.tokens"] == tuple(tokens)
    assert meta["tokenizer.ggml.pre"] == "smollm"
    assert meta["test.float"] == 0.5 and meta["test.ints"] == (1, -2, 3)
    assert set(read_gguf_metadata(path, prefixes=("test.",))) == {"test.float", "test.ints"}

    tiny = Tokenizer.from_gguf(path)
    ids = tiny.encode("<|im_start|> the t  12<|im_end|>")
    assert [tiny.token_bytes(i) for i in ids] == [
        b"<|im_start|>",
        b" the",
        b" t",
        b"  ",
        b"1",
        b"2",
        b"<|im_end|>",
    ]
    assert tiny.stop_token_ids == (1,)


def test_tiny_gguf_with_ids_out_of_merge_order_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list([*BYTE_ALPHABET, "he", "Ġt"])
    writer.add_token_merges(["Ġ t", "h e"])  # "Ġt" merges first but has the larger id
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(UnsupportedModel, match="merge order"):
        Tokenizer.from_gguf(path)

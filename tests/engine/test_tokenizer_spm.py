"""Gemma's SentencePiece vocabulary (the real Gemma-3-270M GGUF): our tokenizer, built from the
GGUF's pieces, against the tokenizer HF transformers builds from the same file (cached by
tests/engine/hf_oracle.py), on text that exercises spaces, newlines, byte fallback, control
tokens and long inputs; and every text round-trips through our decoder."""

from __future__ import annotations

import inspect
import json
import string
from pathlib import Path

import pytest

from engine.models.locate import gemma3_270m_path
from engine.tokenizer import Tokenizer
from tests.engine.hf_oracle import HFOracle, load_hf_oracle, oracle_cache_dir

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello world",
    " leading space, trailing space ",
    "x  y   z    w\t\ttab\u00a0nbsp",
    "\n\n\nthree newlines then text\n",
    "emoji 😀🚀 and CJK 中文字符 and Русский текст and عربى",
    "rare chars that fall back to bytes: \u2fd5 \U0001f9ec \u0004\u0001",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after a bos<eos>",
    "a" * 500 + " " + "ab" * 300,
    string.printable,
    inspect.getsource(json),
]


@pytest.fixture(scope="module")
def gguf() -> Path:
    return gemma3_270m_path()


@pytest.fixture(scope="module")
def ours(gguf: Path) -> Tokenizer:
    return Tokenizer.from_gguf(gguf)


@pytest.fixture(scope="module")
def oracle(gguf: Path, pytestconfig: pytest.Config,
           tmp_path_factory: pytest.TempPathFactory) -> HFOracle:
    return load_hf_oracle(gguf, oracle_cache_dir(pytestconfig, tmp_path_factory))


@pytest.mark.parametrize("index", range(len(TEXTS)))
def test_ids_equal_transformers(ours: Tokenizer, oracle: HFOracle, index: int) -> None:
    text = TEXTS[index]
    assert ours.encode(text) == oracle.backend().encode(text, add_special_tokens=False).ids


def test_long_document_equals_transformers(ours: Tokenizer, oracle: HFOracle) -> None:
    text = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    assert ours.encode(text) == oracle.backend().encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("index", range(len(TEXTS)))
def test_round_trip(ours: Tokenizer, index: int) -> None:
    text = TEXTS[index]
    assert ours.decode(ours.encode(text)) == text
    decoder = ours.stream_decoder()
    assert "".join(decoder.feed(i) for i in ours.encode(text)) + decoder.flush() == text


def test_special_tokens_and_default_chat_format(ours: Tokenizer) -> None:
    """The GGUF carries no chat template: Gemma's turn format stands in, and turns end on
    <end_of_turn>."""
    assert ours.default_template_family == "Gemma"
    assert ours.add_bos_token and ours.bos_token_id == ours.encode("<bos>")[0]
    end_of_turn = ours.encode("<end_of_turn>")
    assert len(end_of_turn) == 1 and end_of_turn[0] in ours.stop_token_ids
    assert ours.encode("<end_of_turn>", allow_special=False) != end_of_turn
    template = ours.chat_template
    assert template is not None
    rendered = template.render([{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert rendered == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                        "<start_of_turn>model\n")
